"""Claims of chapter 09 (parallel and quadratic), each against an independent oracle.

Claim 15: all pairwise scores in one matrix product, parallel over positions, unlike a recurrent
loop. Claim 16: time and memory of standard attention grow quadratically with length (memory is
asserted here through its exact count; time only in bench/ and the chapter, never in a test).
Claim 18: sparse and linear variants change the result, by a measurable amount.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import selfattn
from selfattn import ref
from selfattn.efficient import (
    linear_attention,
    linear_attention_recurrent,
    sliding_window_attention,
    tiled_attention,
)
from selfattn.efficient.experiments import (
    fitted_slope,
    lookup_task,
    minilm_qkv,
    relative_error,
    target_weight,
    variant_errors,
)
from selfattn.efficient.memory import peak_tensor_bytes


def test_claim_15_one_masked_matrix_product_equals_a_loop_over_positions():
    rng = np.random.default_rng(15)
    q, k, v = rng.normal(size=(12, 8)), rng.normal(size=(12, 8)), rng.normal(size=(12, 5))
    parallel = selfattn.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)),
                                                     selfattn.causal_mask(12)).numpy()
    loop = np.stack([ref.scaled_dot_product_attention(q[i:i + 1], k[: i + 1], v[: i + 1])[0] for i in range(12)])
    np.testing.assert_allclose(parallel, loop, rtol=1e-12, atol=1e-13)


def test_claim_15_causal_linear_attention_parallel_equals_recurrent():
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(linear_attention(q, k, v, causal=True), linear_attention_recurrent(q, k, v),
                               atol=1e-12, rtol=1e-10)


def test_claim_16_score_matrix_memory_grows_quadratically():
    sizes, naive, tiled = (128, 256, 512, 1024), [], []
    for T in sizes:
        q, k, v = (torch.randn(1, 4, T, 32) for _ in range(3))
        with torch.no_grad():
            naive.append(peak_tensor_bytes(selfattn.scaled_dot_product_attention, q, k, v)[0])
            tiled.append(peak_tensor_bytes(tiled_attention, q, k, v, block_q=64, block_k=64)[0])
    # the score matrix alone is 4 bytes x H x T x T; the naive path holds at least that
    assert all(p >= 4 * 4 * T * T for p, T in zip(naive, sizes, strict=True))
    assert 1.9 < fitted_slope(sizes, naive) < 2.1
    assert fitted_slope(sizes, tiled) < 1.2


@pytest.fixture(scope="module")
def real_qkv():
    q, k, v, _tokens = minilm_qkv(128)
    return q.double(), k.double(), v.double()


def test_claim_18_variants_change_the_result_on_real_inputs(real_qkv):
    errors = variant_errors(*real_qkv, windows=(4, 16, 64))
    assert errors["window=4"] > errors["window=16"] > errors["window=64"] > 1e-3  # measurably different
    assert errors["linear (elu+1)"] > 1e-3
    # a window as wide as the sequence is exact attention again
    q, k, v = real_qkv
    exact = selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(128))
    assert relative_error(sliding_window_attention(q, k, v, 128), exact) < 1e-12


def test_claim_18_approximations_fail_a_sharp_lookup():
    q, k, v, targets = lookup_task(T=64, d_head=32, seed=0)
    exact = target_weight(selfattn.scaled_dot_product_attention(q, k, v), targets)
    window = target_weight(sliding_window_attention(q, k, v, 8, causal=False), targets)
    linear = target_weight(linear_attention(q, k, v), targets)
    far = (torch.arange(64) - targets).abs() >= 8
    assert exact.mean() > 0.95
    assert far.sum() > 40 and torch.all(window[far] == 0)  # the window cannot see far targets at all
    assert linear.mean() < 0.1  # linear attention cannot be sharp: weight spreads over all keys
