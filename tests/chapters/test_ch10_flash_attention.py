"""Claim of chapter 10 (FlashAttention from first principles), against independent oracles.

Claim 17: tiled attention with an online softmax gives the same result (output, log-sum-exp and
gradients; against the NumPy reference and the plain torch path) with memory linear in length; chunk
summaries merge in any order; "the same result" is exact in real arithmetic, and in low precision every
path rounds alike. Claim 34: the tiled loop moves Theta(T^2 d^2 / M) numbers between slow and fast
memory against Theta(T d + T^2) for standard attention, counted operation by operation.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

import selfattn
from selfattn import ref
from selfattn.efficient import tiled_attention
from selfattn.efficient.experiments import minilm_qkv
from selfattn.efficient.memory import peak_tensor_bytes
from selfattn.ref.online import logsumexp, online_attention, online_softmax


def test_claim_17_online_softmax_equals_softmax():
    x = np.random.default_rng(17).normal(size=(5, 37)) * 10
    np.testing.assert_allclose(online_softmax(x, block_size=8), ref.softmax(x), rtol=1e-13, atol=1e-15)
    q, k, v = (np.random.default_rng(i).normal(size=(9, 4)) for i in range(3))
    np.testing.assert_allclose(online_attention(q, k, v, 4), ref.scaled_dot_product_attention(q, k, v), atol=1e-13)


def test_claim_17_tiled_attention_is_exact_on_real_inputs():
    q, k, v, _ = minilm_qkv(100)
    q, k, v = (x.double().requires_grad_(True) for x in (q, k, v))
    out, lse = tiled_attention(q, k, v, causal=True, block_q=16, block_k=24, return_lse=True)
    qn, kn, vn = (x.detach().numpy() for x in (q, k, v))
    mask = ref.causal_mask(100)
    np.testing.assert_allclose(out.detach().numpy(), ref.scaled_dot_product_attention(qn, kn, vn, mask), atol=1e-11)
    scores = np.where(mask, qn @ np.swapaxes(kn, -1, -2) / np.sqrt(32), -np.inf)
    np.testing.assert_allclose(lse.numpy(), logsumexp(scores), rtol=1e-12)
    expected = selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(100))
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for g, w in zip(torch.autograd.grad(out, (q, k, v), d_out), torch.autograd.grad(expected, (q, k, v), d_out),
                    strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-9)


def test_claim_17_tiled_memory_is_linear_in_length():
    """memory(T) = a + b T: each doubling of T adds twice what the previous doubling added
    (a quadratic a + c T^2 would add four times as much)."""
    sizes, tiled, naive = (512, 1024, 2048), [], []
    for T in sizes:
        q, k, v = (torch.randn(1, 4, T, 64) for _ in range(3))
        with torch.no_grad():
            tiled.append(peak_tensor_bytes(tiled_attention, q, k, v, block_q=128, block_k=128)[0])
            naive.append(peak_tensor_bytes(selfattn.scaled_dot_product_attention, q, k, v)[0])
    growth = (tiled[2] - tiled[1]) / (tiled[1] - tiled[0])
    assert 1.8 < growth < 2.2, growth
    naive_growth = (naive[2] - naive[1]) / (naive[1] - naive[0])
    assert 3.6 < naive_growth < 4.4, naive_growth
    # and far below the (T, T) score matrix it never builds (4 bytes x H x T^2 = 64 MiB at T = 2048)
    assert tiled[-1] < 4 * 4 * 2048**2 / 10


def test_claim_17_summaries_of_four_key_chunks_merged_in_every_order_equal_full_attention():
    """The associative merge, shown: (max, sum, accumulator) of four chunks of uneven size, computed
    independently by the package's split-KV partials, merged in every order and every bracketing:
    4! orders x 5 binary trees = 120 merge trees, each equal to full attention."""
    import itertools

    from selfattn.inference.split_kv import finalize, merge_partials, partial_attention

    g = torch.Generator().manual_seed(10)
    q = torch.randn(2, 3, 7, 16, dtype=torch.float64, generator=g)  # (B, H, T, Dh)
    k, v = (torch.randn(2, 3, 23, 16, dtype=torch.float64, generator=g) for _ in range(2))  # (B, H, S, Dh)
    expected = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())
    edges = [0, 3, 11, 12, 23]
    parts = [partial_attention(q, k[..., a:b, :], v[..., a:b, :]) for a, b in zip(edges, edges[1:], strict=False)]
    def trees(items):  # every binary merge tree over items, in their order
        if len(items) == 1:
            yield items[0]
        for cut in range(1, len(items)):
            for left in trees(items[:cut]):
                for right in trees(items[cut:]):
                    yield merge_partials(left, right)

    merged_trees = 0
    for order in itertools.permutations(range(4)):
        for merged in trees([parts[i] for i in order]):
            context, _ = finalize(merged)
            np.testing.assert_allclose(context.numpy(), expected, atol=1e-13, rtol=0)
            merged_trees += 1
    assert merged_trees == 120  # 24 orders x 5 bracketings (the Catalan number C_3)


def test_claim_17_exact_means_exact_in_real_arithmetic_low_precision_rounds_alike():
    """In float64, float32, bfloat16 and float16, naive attention, torch's SDPA and the tiled path are
    all within a few units of the precision's rounding of a float64 truth, the tiled path no worse
    than the standard kernels; against the truth of the rounded inputs, naive and tiled add one
    output rounding (MiniLM's real queries, keys and values, causal)."""
    import torch.nn.functional as F

    q, k, v, _ = minilm_qkv(100)
    q, k, v = (x.double() for x in (q, k, v))
    truth = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), ref.causal_mask(100))
    unit = np.abs(truth).max()
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        qd, kd, vd = (x.to(dtype) for x in (q, k, v))
        outs = {"naive": selfattn.scaled_dot_product_attention(qd, kd, vd, selfattn.causal_mask(100)),
                "sdpa": F.scaled_dot_product_attention(qd, kd, vd, is_causal=True),
                "tiled": tiled_attention(qd, kd, vd, causal=True, block_q=16, block_k=24)}
        eps = torch.finfo(dtype).eps
        errors = {name: float(np.abs(o.double().numpy() - truth).max()) for name, o in outs.items()}
        for name, e in errors.items():
            assert np.isfinite(e) and e <= 32 * eps * unit, (dtype, name, e)
        assert errors["tiled"] <= 4 * max(errors["naive"], errors["sdpa"]), (dtype, errors)
        if dtype in (torch.bfloat16, torch.float16):  # low precision is not exact: every path rounds
            assert min(errors.values()) > 100 * torch.finfo(torch.float32).eps * unit
            # Against the float64 truth of the inputs as rounded to dtype, naive and tiled add only their
            # one output rounding (float32 inside): at most half a unit of the output's largest binade
            # (round to nearest), plus float32 arithmetic (1e-5 of the output is far above it)
            truth_rounded = ref.scaled_dot_product_attention(*(x.double().numpy() for x in (qd, kd, vd)),
                                                             ref.causal_mask(100))
            for name in ("naive", "tiled"):
                e = float(np.abs(outs[name].double().numpy() - truth_rounded).max())
                assert np.isfinite(e) and e <= 0.5 * eps * unit + 1e-5 * unit, (dtype, name, e / (eps * unit))


def _standard_attention(q, k, v):  # Dao et al. (2022), Algorithm 0 (queries arrive scaled), as the chapter writes it
    weights = torch.softmax(q @ k.mT, dim=-1)
    return weights @ v


def test_claim_34_flash_attention_moves_theta_T2_d2_over_M_numbers_standard_theta_Td_plus_T2_counted():
    """Counted by watching every torch operation (count_traffic): the package's tiled loop reads K and V
    once per query block of ceil(M / 4d) rows, Q once, writes O once, plus one NaN-check pass over V:
    (2 ceil(T / B_r) + 3) T d numbers; and it keeps its per-row statistics in slow memory, a block of
    rows at a time: the maxima and log2-sums written once (2T numbers), for the backward pass, and read
    no more by a forward that returns no log-sum-exp. So Theta(T^2 d^2 / M), while its working set stays within a
    constant of M (else the count would not be an IO model's). Algorithm 0 writes and reads back two
    T x T tensors: 4 T^2 + 4 T d, whatever M is. Expected counts are derived here from the algorithms,
    not taken from the counter."""
    from selfattn.efficient.io_model import count_traffic

    d = 64
    counts = {}
    for T in (1024, 2048):  # inside the theorem's range d <= M <= T d, and T^2 > M
        for M in (64 * 2**10, 128 * 2**10, 256 * 2**10):  # bytes; float32: M / 4 numbers
            q, k, v = torch.randn(T, d) * d**-0.5, torch.randn(T, d), torch.randn(T, d)  # q arrives scaled
            rows = -(-(M // 4) // (4 * d))  # Algorithm 1: ceil(M / 4d) rows a block
            names = {"Q": q, "K": k, "V": v}
            with torch.no_grad():
                out_t, tiled = count_traffic(partial(tiled_attention, q, k, v, scale=1.0, block_q=rows, block_k=min(rows, d)),
                                             fast_memory=M, inputs=names)
                out_s, std = count_traffic(partial(_standard_attention, q, k, v), fast_memory=M, inputs=names)
            torch.testing.assert_close(out_t, out_s, rtol=1e-5, atol=1e-5)
            n_blocks = -(-T // rows)
            assert tiled.total == 4 * ((2 * n_blocks + 3) * T * d + 2 * T), (T, M, tiled)
            assert tiled.read["K"] == 4 * n_blocks * T * d and tiled.read["V"] == 4 * (n_blocks + 1) * T * d
            assert "kept" not in tiled.read and tiled.written["kept"] == 4 * 2 * T
            assert "intermediate" not in tiled.read  # no T x T tensor in slow memory
            assert tiled.peak_working_set <= 1.5 * M, tiled.peak_working_set / M  # it fits (1.02 M measured)
            assert std.total == 4 * (4 * T * T + 4 * T * d), (T, M, std)
            counts[T, M] = tiled.total, std.total
    # the theorem's scaling: x4 in T (to the 3Td term), x1/2 in M for the tiled loop, x1 for the standard
    assert 3.6 < counts[2048, 64 * 2**10][0] / counts[1024, 64 * 2**10][0] <= 4
    assert 0.5 <= counts[1024, 128 * 2**10][0] / counts[1024, 64 * 2**10][0] < 0.6
    assert counts[1024, 256 * 2**10][1] == counts[1024, 64 * 2**10][1]
    # standard: (4 (2T)^2 + 4 (2T) d) / (4T^2 + 4Td) = 2 (2T + d) / (T + d) = 3.88 at T = 1024, d = 64
    assert 3.8 < counts[2048, 64 * 2**10][1] / counts[1024, 64 * 2**10][1] <= 4
    # and the saving standard / tiled grows like M / d^2, not with T
    saving = {key: s / t for key, (t, s) in counts.items()}
    assert 1.8 < saving[2048, 256 * 2**10] / saving[2048, 128 * 2**10] < 2  # -> 2 as 3Td shrinks against the rest
