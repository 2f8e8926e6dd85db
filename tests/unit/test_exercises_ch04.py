"""The checks of chapter 04 accept the reference solutions and name the typical mistakes."""

from __future__ import annotations

import numpy as np
import torch

import selfattn
from selfattn.exercises import ch04


def _tril(T, k=0):
    return torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=k)


def test_causal_mask_solutions_pass():
    assert ch04.check_causal_mask(_tril)
    assert ch04.check_causal_mask(selfattn.causal_mask)
    assert ch04.check_causal_mask(lambda T: np.tril(np.ones((T, T), dtype=bool)))


def test_causal_mask_not_attempted_is_not_an_error():
    def stub(T):
        raise NotImplementedError

    feedback = ch04.check_causal_mask(stub)
    assert not feedback and not feedback.attempted


def test_causal_mask_catches_the_missing_diagonal():
    feedback = ch04.check_causal_mask(lambda T: _tril(T, -1))
    assert not feedback and "every token must attend to itself" in feedback.message


def test_causal_mask_catches_the_upper_triangle():
    feedback = ch04.check_causal_mask(lambda T: _tril(T).T.contiguous())
    assert not feedback and "read the future" in feedback.message


def test_causal_mask_catches_the_reversed_polarity():
    feedback = ch04.check_causal_mask(lambda T: ~_tril(T))
    assert not feedback and "polarity is reversed" in feedback.message
    assert "from_blocked_mask" in feedback.message


def test_causal_mask_catches_a_float_mask_and_a_wrong_shape():
    feedback = ch04.check_causal_mask(lambda T: _tril(T).float())
    assert not feedback and "boolean" in feedback.message
    feedback = ch04.check_causal_mask(lambda T: _tril(T)[None])
    assert not feedback and "shape" in feedback.message


def test_causal_mask_catches_a_crash():
    feedback = ch04.check_causal_mask(lambda T: 1 / 0)
    assert not feedback and "ZeroDivisionError" in feedback.message


def test_masked_softmax_solutions_pass():
    assert ch04.check_masked_softmax(selfattn.masked_softmax)

    def numpy_solution(scores, keep):
        return torch.from_numpy(selfattn.ref.softmax(scores.numpy(), mask=keep.numpy()))

    assert ch04.check_masked_softmax(numpy_solution)


def test_masked_softmax_catches_nan_on_an_empty_row():
    feedback = ch04.check_masked_softmax(
        lambda s, k: torch.softmax(s.masked_fill(~k, float("-inf")), dim=-1)
    )
    assert not feedback and "no visible key" in feedback.message and "NaN" in feedback.message


def test_masked_softmax_catches_a_finite_fill_value():
    feedback = ch04.check_masked_softmax(
        lambda s, k: torch.softmax(s.masked_fill(~k, -1e9), dim=-1)
    )
    assert not feedback and "large finite fill value" in feedback.message


def test_masked_softmax_catches_an_additive_mask_leaking_nan():
    feedback = ch04.check_masked_softmax(
        lambda s, k: torch.softmax(s + (~k).float() * -1e9, dim=-1)
    )
    assert not feedback and "replace the masked scores" in feedback.message


def test_masked_softmax_catches_no_mask_and_reversed_polarity():
    feedback = ch04.check_masked_softmax(lambda s, k: torch.softmax(s, dim=-1))
    assert not feedback and "exactly 0" in feedback.message
    feedback = ch04.check_masked_softmax(lambda s, k: selfattn.masked_softmax(s, ~k))
    assert not feedback and "polarity is reversed" in feedback.message


def test_masked_softmax_catches_rows_that_do_not_sum_to_one():
    feedback = ch04.check_masked_softmax(lambda s, k: 0.5 * selfattn.masked_softmax(s, k))
    assert not feedback and "sum to 1" in feedback.message


def test_masked_softmax_rejects_right_shape_wrong_values():
    # Masked correctly, rows sum to one, but the scores were halved (a temperature of 2).
    feedback = ch04.check_masked_softmax(lambda s, k: selfattn.masked_softmax(s / 2, k))
    assert not feedback and "wrong values" in feedback.message


def test_causal_mask_one_dtype_rule_for_tensors_arrays_and_lists():
    # regression: a list of 0/1 ints passed while a float tensor was refused; the rule is now one:
    # boolean (torch, NumPy or a list of bools) passes, any 0/1 number mask is refused with the same words
    assert ch04.check_causal_mask(lambda T: _tril(T).numpy())
    assert ch04.check_causal_mask(lambda T: _tril(T).tolist())
    wrong = {
        "list of ints": lambda T: _tril(T).int().tolist(),
        "torch float": lambda T: _tril(T).float(),
        "numpy int": lambda T: _tril(T).numpy().astype(int),
    }
    for name, fn in wrong.items():
        feedback = ch04.check_causal_mask(fn)
        assert not feedback, name
        assert "boolean tensor (True = may attend)" in feedback.message, (name, feedback.message)
        assert "you returned dtype" in feedback.message and ".bool()" in feedback.message, feedback.message


# 4.3 causal and padding masks together


def _weights_solution(scores, key_keep, *, causal=True, padding=True, fill=float("-inf"), after=False,
                      guard=True, padding_on="keys"):
    T = scores.shape[-1]
    keep = torch.ones(scores.shape, dtype=torch.bool)
    if causal:
        keep = keep & torch.tril(torch.ones(T, T, dtype=torch.bool))
    if padding:
        keep = keep & (key_keep[:, None, :] if padding_on == "keys" else key_keep[:, :, None])
    if after:
        return torch.softmax(scores, dim=-1) * keep
    scores = scores.masked_fill(~keep, fill)
    if not guard:
        return torch.softmax(scores, dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def test_causal_padded_weights_solutions_pass():
    assert ch04.check_causal_padded_weights(_weights_solution)
    causal = selfattn.causal_mask
    assert ch04.check_causal_padded_weights(
        lambda s, kk: selfattn.masked_softmax(s, torch.as_tensor(causal(s.shape[-1]))[None] & kk[:, None, :]))


def test_causal_padded_weights_not_attempted():
    def stub(scores, key_keep):
        raise NotImplementedError

    assert not ch04.check_causal_padded_weights(stub).attempted


def test_causal_padded_weights_names_each_mistake():
    cases = [
        ({"causal": False}, "causal mask is missing"),
        ({"padding": False}, "padding mask is missing"),
        ({"fill": 0.0}, "set the blocked scores to 0, not to -inf"),
        ({"after": True}, "applied the mask after the softmax"),
        ({"guard": False}, "softmax is 0/0"),
        ({"fill": -1e9}, "finite fill value (-1e9)"),
        ({"padding_on": "queries"}, "went along the queries"),
    ]
    for kwargs, words in cases:
        fb = ch04.check_causal_padded_weights(lambda s, kk, kwargs=kwargs: _weights_solution(s, kk, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)
    fb = ch04.check_causal_padded_weights(lambda s, kk: _weights_solution(s, ~kk))
    assert not fb and "polarity is reversed" in fb.message


def test_causal_padded_weights_wrong_shape_type_and_crash():
    fb = ch04.check_causal_padded_weights(lambda s, kk: _weights_solution(s, kk)[0])
    assert not fb and "(B, T, T)" in fb.message
    fb = ch04.check_causal_padded_weights(lambda s, kk: torch.softmax(s[:, None] + torch.zeros_like(s)[:, :, None], -1))
    assert not fb and "shape" in fb.message
    fb = ch04.check_causal_padded_weights(lambda s, kk: "weights")
    assert not fb and "Return a tensor" in fb.message
    fb = ch04.check_causal_padded_weights(lambda s, kk: s * float("inf"))
    assert not fb and "NaN or inf" in fb.message
    fb = ch04.check_causal_padded_weights(lambda s, kk: s @ kk)
    assert not fb and "raised" in fb.message


# 4.4 bottom-right causal mask


def _bottom_right(T, S, *, offset=None, strict=False):
    shift = (S - T) if offset is None else offset
    j, i = torch.arange(S)[None, :], torch.arange(T)[:, None]
    return j < i + shift if strict else j <= i + shift


def test_bottom_right_mask_solutions_pass():
    assert ch04.check_bottom_right_mask(_bottom_right)
    assert ch04.check_bottom_right_mask(lambda T, S: selfattn.causal_mask(T, S, alignment="bottom_right"))


def test_bottom_right_mask_names_each_mistake():
    cases = [
        (lambda T, S: _bottom_right(T, S, offset=0), "top-left"),
        (lambda T, S: _bottom_right(T, S, strict=True), "diagonal is missing"),
        (lambda T, S: ~_bottom_right(T, S), "polarity is reversed"),
        (lambda T, S: _bottom_right(T, S).T, "shape (S, T)"),
        (lambda T, S: _bottom_right(T, S).int(), "boolean"),
    ]
    for wrong, words in cases:
        fb = ch04.check_bottom_right_mask(wrong)
        assert not fb and fb.attempted and words in fb.message, (words, fb.message)


def test_bottom_right_mask_stub_and_crash():
    def stub(T, S):
        raise NotImplementedError

    assert not ch04.check_bottom_right_mask(stub).attempted
    fb = ch04.check_bottom_right_mask(lambda T, S: torch.ones(T, S, dtype=torch.bool))
    assert not fb and "should not see key" in fb.message


def test_causal_mask_names_a_blocked_past_key():
    """A mask that hides keys it should show (a window of 2, not the whole past) is named by query and key."""
    fb = ch04.check_causal_mask(lambda T: _tril(T) & ~_tril(T, -2))
    assert not fb and "should see key" in fb.message and "blocks it" in fb.message, fb.message
