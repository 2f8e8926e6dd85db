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
