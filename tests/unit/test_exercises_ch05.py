"""The checks of chapter 05 accept the reference solutions and name the typical mistakes."""

from __future__ import annotations

import math

import torch

import selfattn
from selfattn.exercises import ch05


def _keep(lengths, S):
    return torch.arange(S)[None, :] < torch.as_tensor(lengths)[:, None]


def test_padding_mask_solutions_pass():
    assert ch05.check_padding_mask(_keep)
    assert ch05.check_padding_mask(selfattn.padding_mask)  # the (B, 1, 1, S) layout is accepted


def test_padding_mask_not_attempted_is_not_an_error():
    def stub(lengths, S):
        raise NotImplementedError

    feedback = ch05.check_padding_mask(stub)
    assert not feedback and not feedback.attempted


def test_padding_mask_catches_the_reversed_polarity():
    feedback = ch05.check_padding_mask(lambda lengths, S: ~_keep(lengths, S))
    assert (
        not feedback
        and "polarity is reversed" in feedback.message
        and "from_blocked_mask" in feedback.message
    )


def test_padding_mask_catches_off_by_one_both_ways():
    feedback = ch05.check_padding_mask(
        lambda lengths, S: torch.arange(S)[None, :] <= torch.as_tensor(lengths)[:, None]
    )
    assert not feedback and "j < L, not j <= L" in feedback.message
    feedback = ch05.check_padding_mask(
        lambda lengths, S: torch.arange(S)[None, :] < torch.as_tensor(lengths)[:, None] - 1
    )
    assert not feedback and "hide the last real token" in feedback.message


def test_padding_mask_catches_ignoring_S_transposing_and_integers():
    feedback = ch05.check_padding_mask(lambda lengths, S: _keep(lengths, max(lengths)))
    assert not feedback and "padded length" in feedback.message
    feedback = ch05.check_padding_mask(lambda lengths, S: _keep(lengths, S).T)
    assert not feedback and "transposed" in feedback.message
    feedback = ch05.check_padding_mask(lambda lengths, S: _keep(lengths, S).long())
    assert not feedback and "boolean" in feedback.message


def _cross(X_q, X_kv, W_Q, W_K, W_V, *, scale=None, q_from=None, kv_from=None):
    q_src = X_q if q_from is None else q_from
    kv_src = X_kv if kv_from is None else kv_from
    return selfattn.scaled_dot_product_attention(
        q_src @ W_Q, kv_src @ W_K, kv_src @ W_V, scale=scale
    )


def test_cross_attention_solution_passes():
    assert ch05.check_cross_attention(_cross)


def test_cross_attention_catches_self_attention_and_swapped_roles():
    feedback = ch05.check_cross_attention(lambda X_q, X_kv, *W: _cross(X_q, X_kv, *W, kv_from=X_q))
    assert not feedback and "self-attention on X_q" in feedback.message
    feedback = ch05.check_cross_attention(lambda X_q, X_kv, *W: _cross(X_q, X_kv, *W, q_from=X_kv))
    assert not feedback and "one row per query" in feedback.message


def test_cross_attention_catches_weights_scale_and_axis():
    def weights_only(X_q, X_kv, W_Q, W_K, W_V):
        return selfattn.scaled_dot_product_attention(
            X_q @ W_Q, X_kv @ W_K, X_kv @ W_V, return_weights=True
        )[1]

    feedback = ch05.check_cross_attention(weights_only)
    assert not feedback and "the weights" in feedback.message

    feedback = ch05.check_cross_attention(
        lambda X_q, X_kv, *W: _cross(X_q, X_kv, *W, scale=1 / math.sqrt(X_q.shape[1]))
    )
    assert not feedback and "1/sqrt(d_model)" in feedback.message

    def wrong_axis(X_q, X_kv, W_Q, W_K, W_V):
        scores = (X_q @ W_Q) @ (X_kv @ W_K).T / math.sqrt(W_Q.shape[1])
        return torch.softmax(scores, dim=0) @ (X_kv @ W_V)

    feedback = ch05.check_cross_attention(wrong_axis)
    assert not feedback and "wrong axis" in feedback.message


def test_cross_attention_rejects_right_shape_wrong_values():
    feedback = ch05.check_cross_attention(lambda *args: _cross(*args) + 0.5)
    assert not feedback and "wrong values" in feedback.message


def test_padding_mask_one_dtype_rule_for_tensors_arrays_and_lists():
    # regression: a NumPy int array passed while a torch int64 tensor was refused; the rule is now
    # the same as exercise 4.1's: boolean passes in any container, a 0/1 number mask is refused
    assert ch05.check_padding_mask(lambda lengths, S: _keep(lengths, S).numpy())
    wrong = {
        "numpy int": lambda lengths, S: _keep(lengths, S).numpy().astype(int),
        "torch int64": lambda lengths, S: _keep(lengths, S).long(),
        "list of ints": lambda lengths, S: _keep(lengths, S).int().tolist(),
    }
    for name, fn in wrong.items():
        feedback = ch05.check_padding_mask(fn)
        assert not feedback, name
        assert "boolean tensor (True = may attend)" in feedback.message, (name, feedback.message)
        assert "you returned dtype" in feedback.message and ".bool()" in feedback.message, feedback.message


# 5.3 cross-attention with a key padding mask and 5.4 mean pooling


def _masked_cross(Q, K, V, key_keep, *, scale=True, fill=float("-inf"), after=False, mask=True, flip=False):
    scores = Q @ K.transpose(-2, -1) / (math.sqrt(Q.shape[-1]) if scale else 1.0)
    keep = (~key_keep if flip else key_keep)[:, None, :]
    if not mask:
        return torch.softmax(scores, dim=-1) @ V
    if after:
        return torch.softmax(scores, dim=-1) * keep @ V
    return torch.softmax(scores.masked_fill(~keep, fill), dim=-1) @ V


def test_masked_cross_attention_solution_passes():
    assert ch05.check_masked_cross_attention(_masked_cross)


def test_masked_cross_attention_names_each_mistake():
    cases = [
        ({"mask": False}, "not applied"),
        ({"flip": True}, "polarity is reversed"),
        ({"fill": 0.0}, "not to -inf"),
        ({"after": True}, "after the softmax"),
        ({"scale": False}, "forgot the scale"),
    ]
    for kwargs, words in cases:
        fb = ch05.check_masked_cross_attention(lambda *a, kwargs=kwargs: _masked_cross(*a, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)


def test_masked_cross_attention_shape_nan_crash():
    fb = ch05.check_masked_cross_attention(lambda Q, K, V, kk: _masked_cross(Q, K, V, kk)[0])
    assert not fb and "shape" in fb.message
    fb = ch05.check_masked_cross_attention(lambda Q, K, V, kk: _masked_cross(Q, K, V, kk) * float("nan"))
    assert not fb and "NaN" in fb.message
    fb = ch05.check_masked_cross_attention(lambda Q, K, V, kk: Q.masked_fill(~kk[:, :, None], 0.0))
    assert not fb and "raised RuntimeError" in fb.message


def _mean_pool(H, keep):
    k = keep[..., None].to(H.dtype)
    return (H * k).sum(dim=1) / k.sum(dim=1)


def test_mean_pool_solution_passes():
    assert ch05.check_mean_pool(_mean_pool)


def test_mean_pool_names_each_mistake():
    cases = [
        (lambda H, keep: H.mean(dim=1), "padding included"),
        (lambda H, keep: (H * keep[..., None]).sum(dim=1) / H.shape[1], "divided by S"),
        (lambda H, keep: (H * keep[..., None]).sum(dim=1), "did not divide"),
        (lambda H, keep: (H * ~keep[..., None]).sum(dim=1) / (~keep).sum(dim=1, keepdim=True).clamp(min=1), "polarity is reversed"),
        (lambda H, keep: (H * keep[..., None]).mean(dim=-1), "over the features"),
    ]
    for wrong, words in cases:
        fb = ch05.check_mean_pool(wrong)
        assert not fb and fb.attempted and words in fb.message, (words, fb.message)


def test_mean_pool_stub_and_type():
    def stub(H, keep):
        raise NotImplementedError

    assert not ch05.check_mean_pool(stub).attempted
    def forgot_return(H, keep):
        pooled = H.sum(1)  # noqa: F841 - computed, never returned

    fb = ch05.check_mean_pool(forgot_return)
    assert not fb and "return" in fb.message


def test_cross_attention_names_unscaled_scores():
    feedback = ch05.check_cross_attention(lambda X_q, X_kv, *W: _cross(X_q, X_kv, *W, scale=1.0))
    assert not feedback and "did not scale" in feedback.message, feedback.message
