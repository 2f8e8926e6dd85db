"""Chapter 06's checks accept the reference solutions and explain the typical mistakes."""

from __future__ import annotations

import math

import torch

from selfattn import merge_heads, split_heads
from selfattn.exercises import ch06


def _split(x, n_heads):
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)


def _merge(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, H, T, Dh) -> (B, T, D)


def test_split_merge_accepts_the_solution_and_the_library():
    fb = ch06.check_split_merge_heads(_split, _merge)
    assert fb.ok and fb.attempted
    assert ch06.check_split_merge_heads(split_heads, merge_heads)


def test_split_merge_catches_the_missing_transpose_in_split():
    def split_no_transpose(x, n_heads):
        B, T, D = x.shape
        return x.reshape(B, T, n_heads, D // n_heads)

    fb = ch06.check_split_merge_heads(split_no_transpose, _merge)
    assert not fb.ok and "forgot the transpose" in fb.message


def test_split_merge_catches_reshaping_straight_to_heads():
    def split_straight(x, n_heads):
        B, T, D = x.shape
        return x.reshape(B, n_heads, T, D // n_heads)

    fb = ch06.check_split_merge_heads(split_straight, _merge)
    assert not fb.ok and "straight to (B, H, T, Dh)" in fb.message


def test_split_merge_catches_merging_without_transposing_back():
    def merge_no_transpose(x):
        B, H, T, Dh = x.shape
        return x.reshape(B, T, H * Dh)

    fb = ch06.check_split_merge_heads(_split, merge_no_transpose)
    assert not fb.ok and "without transposing back" in fb.message


def test_split_merge_not_attempted():
    def stub(*args):
        raise NotImplementedError

    fb = ch06.check_split_merge_heads(stub, stub)
    assert not fb.ok and not fb.attempted


def _mha(X, W_Q, W_K, W_V, W_O, n_heads, *, d_scale=None, merge=_merge, use_W_O=True):
    Q, K, V = (_split(X @ W, n_heads) for W in (W_Q, W_K, W_V))  # (B, T, D) -> (B, H, T, Dh)
    d = Q.shape[-1] if d_scale is None else d_scale
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, Dh) @ (B, H, Dh, T) -> (B, H, T, T)
    weights = scores.softmax(dim=-1)
    concat = merge(weights @ V)  # (B, H, T, T) @ (B, H, T, Dh) -> (B, T, D)
    return (concat @ W_O if use_W_O else concat), weights


def test_mha_accepts_the_solution():
    fb = ch06.check_multi_head_attention(_mha)
    assert fb.ok and fb.attempted


def test_mha_catches_scaling_by_d_model():
    fb = ch06.check_multi_head_attention(lambda X, *W: _mha(X, *W, d_scale=X.shape[-1]))
    assert not fb.ok and "sqrt(d_model), not sqrt(d_head)" in fb.message


def test_mha_catches_no_scaling():
    fb = ch06.check_multi_head_attention(lambda X, *W: _mha(X, *W, d_scale=1))
    assert not fb.ok and "did not scale" in fb.message


def test_mha_catches_merge_without_transpose_and_missing_W_O():
    def bad_merge(x):
        B, H, T, Dh = x.shape
        return x.reshape(B, T, H * Dh)

    fb = ch06.check_multi_head_attention(lambda X, *W: _mha(X, *W, merge=bad_merge))
    assert not fb.ok and "without transposing" in fb.message
    fb = ch06.check_multi_head_attention(lambda X, *W: _mha(X, *W, use_W_O=False))
    assert not fb.ok and "multiply it by W_O" in fb.message


def test_mha_reports_a_wrong_return_type():
    fb = ch06.check_multi_head_attention(lambda X, *W: _mha(X, *W)[0])
    assert not fb.ok and "pair (out, weights)" in fb.message


def test_mha_accepts_a_float32_answer():
    # regression: a tolerance of 1e-9 rejected right answers computed in float32 ("largest error 5.6e-07")
    def in_float32(X, W_Q, W_K, W_V, W_O, n_heads):
        out, weights = _mha(*(t.float() for t in (X, W_Q, W_K, W_V, W_O)), n_heads)
        return out, weights

    fb = ch06.check_multi_head_attention(in_float32)
    assert fb.ok, fb.message


def test_mha_catches_transposed_weights():
    def transposed(*args):
        out, weights = _mha(*args)
        return out, weights.transpose(-1, -2)

    fb = ch06.check_multi_head_attention(transposed)
    assert not fb.ok and "weights are transposed" in fb.message, fb.message


def test_mha_accepts_a_list_pair():
    # regression: [out, weights] was refused ("Return a pair") while 12.2 accepted a list
    assert ch06.check_multi_head_attention(lambda X, *W: list(_mha(X, *W)))
    fb = ch06.check_multi_head_attention(lambda X, *W: [_mha(X, *W)[0]])
    assert not fb.ok and "pair (out, weights)" in fb.message and "list" in fb.message


# 6.3 the fused in_proj_weight and 6.4 per-head contributions


def test_in_proj_weight_solutions_pass():
    assert ch06.check_in_proj_weight(lambda q, k, v: torch.cat([q.T, k.T, v.T], dim=0))
    assert ch06.check_in_proj_weight(lambda q, k, v: torch.cat([q, k, v], dim=1).T)


def test_in_proj_weight_names_each_mistake():
    cases = [
        (lambda q, k, v: torch.cat([q, k, v], dim=0), "not transposed"),
        (lambda q, k, v: torch.cat([k.T, q.T, v.T], dim=0), "order is wrong"),
        (lambda q, k, v: torch.cat([v.T, k.T, q.T], dim=0), "order is reversed"),
        (lambda q, k, v: torch.cat([q.T, k.T, v.T], dim=1), "stacked along the columns"),
    ]
    for wrong, words in cases:
        fb = ch06.check_in_proj_weight(wrong)
        assert not fb and fb.attempted and words in fb.message, (words, fb.message)


def test_in_proj_weight_stub_and_type():
    def stub(q, k, v):
        raise NotImplementedError

    assert not ch06.check_in_proj_weight(stub).attempted
    fb = ch06.check_in_proj_weight(lambda q, k, v: [q, k, v])
    assert not fb and "shape" in fb.message


def _contributions(context, W_O, *, layout="blocks", scale=1.0):
    H, Dh = context.shape[1], context.shape[-1]
    rows = [W_O[h * Dh:(h + 1) * Dh] if layout != "interleaved" else W_O[h::H] for h in range(H)]
    if layout == "reversed":
        rows = rows[::-1]
    return torch.stack([context[:, h] @ rows[h] for h in range(H)], dim=1) * scale


def test_head_contributions_solution_passes_and_sums_to_the_output():
    assert ch06.check_head_contributions(_contributions)


def test_head_contributions_names_each_mistake():
    cases = [
        ({"layout": "interleaved"}, "every H-th row"),
        ({"scale": 1 / 3}, "divided by H"),
        ({"layout": "reversed"}, "reverse order"),
    ]
    for kwargs, words in cases:
        fb = ch06.check_head_contributions(lambda c, w, kwargs=kwargs: _contributions(c, w, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)
    Dh = 4
    fb = ch06.check_head_contributions(
        lambda c, w: torch.stack([c[:, h] @ w[h * Dh:(h + 1) * Dh, h * Dh:(h + 1) * Dh] for h in range(3)], dim=1))
    assert not fb and "sliced the columns" in fb.message
    fb = ch06.check_head_contributions(lambda c, w: _contributions(c, w).sum(dim=1))
    assert not fb and "summed output" in fb.message


def test_head_contributions_nan_and_crash():
    fb = ch06.check_head_contributions(lambda c, w: _contributions(c, w) * float("inf"))
    assert not fb and "NaN or inf" in fb.message
    fb = ch06.check_head_contributions(lambda c, w: c @ w)
    assert not fb and "raised RuntimeError" in fb.message
