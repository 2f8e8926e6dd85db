"""Claims of chapter 09 (parallel and quadratic), each against an independent oracle.

Claim 15: all pairwise scores in one matrix product, parallel over positions, unlike a recurrent
loop (rows in any order or chunks agree; an Elman RNN's steps do not; the longest chain of
dependent operations, counted). Claim 16: time and memory of standard attention grow quadratically
with length (FLOPs counted exactly by FlopCounterMode, memory through its exact count; time only in
bench/ and the chapter, never in a test). Claim 18: sparse and linear variants change the result, by
a measurable amount; a stack of windows reaches L (w - 1) positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import selfattn
from selfattn import ref
from selfattn.block import BlockConfig, TransformerBlock
from selfattn.efficient import (
    linear_attention,
    linear_attention_chunkwise,
    linear_attention_recurrent,
    sliding_window_attention,
    sliding_window_mask,
)
from selfattn.efficient.depth import dependency_depth
from selfattn.efficient.experiments import (
    fitted_slope,
    lookup_task,
    minilm_qkv,
    relative_error,
    target_weight,
    variant_errors,
)
from selfattn.efficient.memory import peak_tensor_bytes
from selfattn.models.rnn import ElmanRNN


def _flops(fn, *args, **kwargs):
    """(total, per-operation) FLOPs of the matrix products fn runs (FlopCounterMode: 2 m n k each)."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*args, **kwargs)
    return counter.get_total_flops(), {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_claim_15_one_masked_matrix_product_equals_a_loop_over_positions():
    rng = np.random.default_rng(15)
    q, k, v = rng.normal(size=(12, 8)), rng.normal(size=(12, 8)), rng.normal(size=(12, 5))
    parallel = selfattn.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)),
                                                     selfattn.causal_mask(12)).numpy()
    loop = np.stack([ref.scaled_dot_product_attention(q[i:i + 1], k[: i + 1], v[: i + 1])[0] for i in range(12)])
    np.testing.assert_allclose(parallel, loop, rtol=1e-12, atol=1e-13)


def test_claim_15_attention_rows_in_any_order_or_chunks_equal_all_at_once():
    g = torch.Generator().manual_seed(15)
    T = 50
    q, k, v = (torch.randn(T, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = selfattn.causal_mask(T)
    whole = selfattn.scaled_dot_product_attention(q, k, v, mask)
    rows = torch.empty_like(whole)
    for i in torch.randperm(T, generator=g).tolist():
        row = ref.scaled_dot_product_attention(q[i:i + 1].numpy(), k.numpy(), v.numpy(), mask[i:i + 1].numpy())
        rows[i] = torch.from_numpy(row[0])  # (1, 8) -> (8,)
    assert torch.isfinite(whole).all()
    torch.testing.assert_close(rows, whole, atol=1e-12, rtol=1e-12)  # shuffled rows, the NumPy reference
    for chunk in (7, 16, 50):  # 7 and 16 do not divide 50
        parts = [selfattn.scaled_dot_product_attention(q[lo:lo + chunk], k, v, mask[lo:lo + chunk])
                 for lo in range(0, T, chunk)]
        torch.testing.assert_close(torch.cat(parts), whole, atol=1e-12, rtol=1e-12)


def test_claim_15_a_recurrent_network_depends_on_the_order_of_its_steps():
    torch.manual_seed(15)
    rnn = ElmanRNN(8, 8)
    g = torch.Generator().manual_seed(16)
    x = torch.randn(1, 50, 8, generator=g, dtype=torch.float64)
    with torch.no_grad():
        in_order = rnn(x)
        shuffled = rnn(x, torch.randperm(50, generator=g).tolist())
        chunked = torch.cat([rnn(x[:, lo:lo + 16]) for lo in range(0, 50, 16)], dim=1)
    assert torch.isfinite(in_order).all() and torch.isfinite(shuffled).all()
    # The same steps, in another order: each step reads another state, so the result changes.
    diff = (shuffled - in_order).abs()
    assert diff.max() > 0.5 and (diff.amax(-1) > 1e-3).sum() > 40, (diff.max(), (diff.amax(-1) > 1e-3).sum())
    # Chunks run independently (from a zero state) differ right after each chunk boundary.
    assert (chunked - in_order).abs()[0, 16].max() > 0.05
    torch.testing.assert_close(chunked[:, :16], in_order[:, :16], atol=0, rtol=0)  # the first chunk is right
    # And only there: the wrong positions (off by more than 1e-3) are a run right after each boundary.
    wrong = ((chunked - in_order).abs()[0].amax(-1) > 1e-3).tolist()  # (T,)
    lead = [next((n for n in range(min(16, 50 - b)) if not wrong[b + n]), min(16, 50 - b)) for b in (16, 32, 48)]
    assert all(n > 0 for n in lead[:2]) and sum(lead) == sum(wrong) and max(lead) < 16, (lead, sum(wrong))


def test_claim_15_dependency_chain_grows_with_T_for_the_rnn_not_for_attention():
    rnn = ElmanRNN(4, 4)
    rnn_depths, attention_depths = {}, {}
    for T in (8, 16, 32):
        x = torch.randn(1, T, 4, dtype=torch.float64)
        with torch.no_grad():
            r = dependency_depth(rnn, x)[0]
            a = dependency_depth(selfattn.scaled_dot_product_attention, x, x, x, selfattn.causal_mask(T))[0]
        assert r.matmul_depth == T  # T products with the state, one after another
        assert a.matmul_depth == 2 and a.matmuls == 2  # scores, then weights @ values
        rnn_depths[T], attention_depths[T] = r.depth, a.depth
    # a fixed number of dependent operations per step (measured 3: the product, an add, the tanh)
    assert rnn_depths[32] - rnn_depths[16] == 2 * (rnn_depths[16] - rnn_depths[8]) == 16 * 3
    assert len(set(attention_depths.values())) == 1 and attention_depths[8] < rnn_depths[8]


def test_claim_15_chunkwise_linear_attention_equals_both_forms_with_work_linear_in_T():
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    parallel, recurrent = linear_attention(q, k, v, causal=True), linear_attention_recurrent(q, k, v)
    for chunk in (1, 6, 8, 13, 40, 64):
        got = linear_attention_chunkwise(q, k, v, chunk)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, parallel, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(got, recurrent, atol=1e-10, rtol=1e-10)
    flops = {}
    for T in (256, 512, 1024):
        x = torch.randn(1, 2, T, 16)
        flops[T] = (_flops(linear_attention_chunkwise, x, x, x, 32)[0], _flops(linear_attention, x, x, x, causal=True)[0])
        assert flops[T][0] == 2 * T * (2 * 32 * 32 + 4 * 16 * 16 + 2 * 16)  # B H T (2 C (Dh + Dv) + 4 Dh Dv + 2 Dh)
        assert flops[T][1] == 2 * 2 * T * T * 32  # the parallel causal form: the masked (T, T) matrix
    assert flops[1024][0] == 2 * flops[512][0] == 4 * flops[256][0]
    assert flops[1024][1] == 4 * flops[512][1] == 16 * flops[256][1]


def test_claim_15_causal_linear_attention_parallel_equals_recurrent():
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(linear_attention(q, k, v, causal=True), linear_attention_recurrent(q, k, v),
                               atol=1e-12, rtol=1e-10)


def test_claim_16_score_matrix_memory_grows_quadratically():
    sizes, naive = (128, 256, 512, 1024), []
    for T in sizes:
        q, k, v = (torch.randn(1, 4, T, 32) for _ in range(3))
        with torch.no_grad():
            naive.append(peak_tensor_bytes(selfattn.scaled_dot_product_attention, q, k, v)[0])
    # the score matrix alone is 4 bytes x H x T x T; the naive path holds at least that
    assert all(p >= 4 * 4 * T * T for p, T in zip(naive, sizes, strict=True))
    assert 1.9 < fitted_slope(sizes, naive) < 2.1
    # (the tiled loop's linear memory is chapter 10's claim 17: test_ch10's test_claim_17_tiled_memory_is_linear_in_length)


def test_claim_16_attention_flops_grow_quadratically_counted_exactly():
    B, H, Dh = 2, 3, 8
    counts = {}
    for T in (16, 32, 64, 128):
        q, k, v = (torch.randn(B, H, T, Dh) for _ in range(3))
        total, by_op = _flops(selfattn.scaled_dot_product_attention, q, k, v, selfattn.causal_mask(T))
        assert total == by_op["aten.bmm"] == 4 * B * H * T * T * Dh  # Q K^T and weights V: 2 T^2 Dh each
        counts[T] = total
    assert counts[32] == 4 * counts[16] and counts[64] == 4 * counts[32] and counts[128] == 4 * counts[64]


def test_claim_16_block_flops_projections_and_mlp_against_attention():
    D = 32
    block = TransformerBlock(BlockConfig(d_model=D, n_heads=4, d_ff=4 * D)).eval()
    attention, rest = {}, {}
    for T in (32, 96, 192, 256):
        total, by_op = _flops(block, torch.randn(1, T, D))
        attention[T] = by_op["aten.bmm"]
        rest[T] = total - attention[T]  # Q, K, V, O projections and the two MLP layers (mm / addmm)
        assert attention[T] == 4 * T * T * D
        assert rest[T] == 24 * T * D * D  # 8 T D^2 projections + 16 T D^2 MLP of width 4 D
    # The length where attention starts to dominate, from the counts: a T = b T^2 at T = a / b = 6 D.
    crossover = (rest[32] / 32) / (attention[32] / 32**2)
    assert crossover == 6 * D == 192
    assert attention[192] == rest[192] and attention[256] > rest[256] and attention[96] < rest[96]


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


def test_claim_18_stacked_windows_reach_L_times_w_minus_1_positions():
    T, w = 40, 5
    keep = sliding_window_mask(T, w).long()
    reach = torch.eye(T, dtype=torch.long)
    g = torch.Generator().manual_seed(18)
    weights = [[torch.randn(6, 6, generator=g, dtype=torch.float64) / 6**0.5 for _ in range(3)] for _ in range(4)]
    for L in range(1, 5):
        reach = ((reach @ keep) > 0).long()  # boolean power of the mask: reachability in L layers
        assert torch.equal(reach.sum(-1), torch.clamp(torch.arange(T), max=L * (w - 1)) + 1)
        # the same set, from the gradient through L real layers (residual + windowed attention)
        x = torch.randn(T, 6, generator=g, dtype=torch.float64, requires_grad=True)
        h = x
        for W_q, W_k, W_v in weights[:L]:
            h = h + sliding_window_attention(h @ W_q, h @ W_k, h @ W_v, w)
        (grad,) = torch.autograd.grad(h[-1].sum(), x)
        assert torch.isfinite(grad).all()
        assert torch.equal(grad.abs().sum(-1) > 0, reach[-1].bool())
        assert int(reach[-1].sum()) == L * (w - 1) + 1
