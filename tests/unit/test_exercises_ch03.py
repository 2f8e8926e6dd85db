"""Chapter 03's checks accept the reference solutions and explain typical mistakes."""

from __future__ import annotations

import math

import numpy as np
import torch

from selfattn import ref
from selfattn.exercises import ch03


def attention(Q, K, V):
    scores = Q @ K.T / math.sqrt(Q.shape[-1])
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ V


def test_attention_accepts_the_solution_and_the_reference():
    assert ch03.check_attention(attention)
    assert ch03.check_attention(ref.scaled_dot_product_attention)


def test_attention_catches_softmax_over_queries():
    fb = ch03.check_attention(lambda Q, K, V: ref.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), axis=0) @ V)
    assert not fb.ok and "softmax over the queries" in fb.message


def test_attention_catches_missing_scaling():
    fb = ch03.check_attention(lambda Q, K, V: ref.softmax(Q @ K.T) @ V)
    assert not fb.ok and "forgot the scaling" in fb.message


def test_attention_catches_transposed_values():
    fb = ch03.check_attention(lambda Q, K, V: ref.softmax(Q @ K.T / math.sqrt(Q.shape[-1])) @ V.T)
    assert not fb.ok and "V transposed" in fb.message


def test_attention_catches_an_unstable_softmax():
    def naive(Q, K, V):
        e = np.exp(Q @ K.T / math.sqrt(Q.shape[-1]))
        return (e / e.sum(axis=-1, keepdims=True)) @ V

    fb = ch03.check_attention(naive)
    assert not fb.ok and "stable softmax" in fb.message


def test_attention_not_attempted():
    def stub(Q, K, V):
        raise NotImplementedError

    fb = ch03.check_attention(stub)
    assert not fb.ok and not fb.attempted


def weighted_sum(w, V):
    out = np.zeros(V.shape[1])
    for j in range(V.shape[0]):
        out = out + w[j] * V[j]
    return out


def test_weighted_sum_accepts_the_solution():
    assert ch03.check_weighted_sum(weighted_sum)
    assert ch03.check_weighted_sum(lambda w, V: w @ V)


def test_weighted_sum_catches_the_wrong_axis():
    fb = ch03.check_weighted_sum(lambda w, V: V @ w)
    assert not fb.ok and "summed over the value features instead of over the positions" in fb.message


def test_weighted_sum_catches_unweighted_mean_and_unsummed_rows():
    fb = ch03.check_weighted_sum(lambda w, V: V.mean(axis=0))
    assert not fb.ok and "without the weights" in fb.message
    fb = ch03.check_weighted_sum(lambda w, V: w[:, None] * V)
    assert not fb.ok and "add them up" in fb.message


def test_checks_reject_wrong_values():
    fb = ch03.check_attention(lambda Q, K, V: attention(Q, K, V) + 0.1)
    assert not fb.ok and "wrong values" in fb.message
    fb = ch03.check_weighted_sum(lambda w, V: w @ V + 0.1)
    assert not fb.ok and "wrong values" in fb.message


def test_attention_catches_mixing_the_keys():
    fb = ch03.check_attention(lambda Q, K, V: ref.softmax(Q @ K.T / math.sqrt(Q.shape[-1])) @ K)
    assert not fb.ok and "mixed the key rows" in fb.message, fb.message


def test_weighted_sum_catches_a_mean_of_the_scaled_rows():
    fb = ch03.check_weighted_sum(lambda w, V: (w[:, None] * V).mean(axis=0))
    assert not fb.ok and "divided by S" in fb.message, fb.message


def test_checks_accept_float32_torch_and_einsum_answers():
    import torch

    def attention_torch(Q, K, V):
        Q, K, V = (torch.tensor(a, dtype=torch.float32) for a in (Q, K, V))
        return torch.softmax(torch.einsum("td,sd->ts", Q, K) / Q.shape[-1] ** 0.5, dim=-1) @ V

    assert ch03.check_attention(attention_torch)
    assert ch03.check_weighted_sum(lambda w, V: torch.tensor(w, dtype=torch.float32) @ torch.tensor(V, dtype=torch.float32))


# 3.3 self-attention from X and 3.4 batched attention


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _self_attention(X, W_Q, W_K, W_V, *, scale=None, axis=-1, keys="K", values="V"):
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    K = Q if keys == "Q" else K
    V = X if values == "X" else V
    if keys == "swap":
        Q, K = K, Q
    d = scale if scale is not None else math.sqrt(W_Q.shape[1])
    return _softmax(Q @ K.T / d, axis=axis) @ V


def test_self_attention_solution_passes():
    assert ch03.check_self_attention(_self_attention)


def test_self_attention_names_each_mistake():
    cases = [
        ({"scale": 1.0}, "forgot the scale"),
        ({"scale": math.sqrt(6)}, "scaled by sqrt(D)"),
        ({"axis": 0}, "over the queries"),
        ({"keys": "Q"}, "keys are the queries"),
        ({"values": "X"}, "values are X itself"),
        ({"keys": "swap"}, "Queries and keys are swapped"),
    ]
    for kwargs, words in cases:
        fb = ch03.check_self_attention(lambda *a, kwargs=kwargs: _self_attention(*a, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)


def test_self_attention_shape_nan_stub():
    def stub(X, W_Q, W_K, W_V):
        raise NotImplementedError

    assert not ch03.check_self_attention(stub).attempted
    fb = ch03.check_self_attention(lambda *a: _self_attention(*a).T)
    assert not fb and "shape" in fb.message
    fb = ch03.check_self_attention(lambda *a: _self_attention(*a) * np.nan)
    assert not fb and "NaN" in fb.message


def _batched(Q, K, V, *, scale=None, dim=-1, order="cw"):
    d = scale if scale is not None else math.sqrt(Q.shape[-1])
    weights = torch.softmax(Q @ K.transpose(-2, -1) / d, dim=dim)
    context = weights @ V
    return (context, weights) if order == "cw" else (weights, context)


def test_batched_attention_solution_passes():
    assert ch03.check_batched_attention(_batched)


def test_batched_attention_names_each_mistake():
    cases = [
        ({"scale": 1.0}, "forgot the scale"),
        ({"scale": 5.0}, "divided the scores by Dh"),
        ({"dim": -2}, "over the queries"),
        ({"order": "wc"}, "wrong order"),
    ]
    for kwargs, words in cases:
        fb = ch03.check_batched_attention(lambda Q, K, V, kwargs=kwargs: _batched(Q, K, V, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)


def test_batched_attention_one_return_value_and_crash():
    fb = ch03.check_batched_attention(lambda Q, K, V: _batched(Q, K, V)[0])
    assert not fb and "Return a pair" in fb.message
    fb = ch03.check_batched_attention(lambda Q, K, V: Q @ K)
    assert not fb and "raised" in fb.message
    fb = ch03.check_batched_attention(lambda Q, K, V: (_batched(Q, K, V)[0][0], _batched(Q, K, V)[1]))
    assert not fb and "shape" in fb.message
