"""Sliding-window and linear attention: each form equals its other form and its definition."""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import selfattn
from selfattn import ref
from selfattn.efficient import (
    linear_attention,
    linear_attention_chunkwise,
    linear_attention_recurrent,
    sliding_window_attention,
    sliding_window_mask,
    sliding_window_tiled_attention,
)
from selfattn.efficient.tiled import Visibility


def _qkv(T, Dh=8, seed=0, B=2, H=2):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64) for _ in range(3))


def test_sliding_window_mask_by_hand():
    expected_causal = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(4, 2), expected_causal)
    expected_both = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(4, 2, causal=False), expected_both)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 3, 8, 40])
def test_sliding_window_equals_reference_with_band_mask(causal, window):
    q, k, v = _qkv(29, seed=window)
    band = sliding_window_mask(29, window, causal=causal).numpy()
    expected = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), band)
    np.testing.assert_allclose(sliding_window_attention(q, k, v, window, causal).numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,block", [(1, 4), (3, 4), (5, 3), (8, 8), (40, 6)])
def test_sliding_window_tiled_equals_band_mask_forward_and_backward(causal, window, block):
    q, k, v = (x.requires_grad_(True) for x in _qkv(29, seed=window + block))
    got = sliding_window_tiled_attention(q, k, v, window, causal, block_q=block, block_k=block)
    expected = sliding_window_attention(q, k, v, window, causal)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-11)
    d_out = torch.randn_like(got)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), d_out), torch.autograd.grad(expected, (q, k, v), d_out),
                    strict=True):
        torch.testing.assert_close(g, w, atol=1e-11, rtol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_window_visibility_classifies_every_tile_like_the_band(causal):
    """structural() says all/none/some for each tile; check it against the explicit band mask."""
    T, window, block = 40, 7, 6
    band = sliding_window_mask(T, window, causal=causal)
    vis = Visibility(causal_offset=0 if causal else None, window=window)
    skipped = 0
    for i in range(0, T, block):
        for j in range(0, T, block):
            part = band[i:i + block, j:j + block]
            verdict = vis.structural(i, min(i + block, T), j, min(j + block, T))
            expected = True if part.all() else (False if not part.any() else None)
            assert verdict is expected, (i, j)
            skipped += verdict is False
    assert skipped > 0  # the point of the tiled form: some tiles are never computed


def _linear_by_definition(q, k, v, causal):
    """phi(q_i) . sum_j phi(k_j) v_j / phi(q_i) . sum_j phi(k_j), written as explicit sums in NumPy."""
    def phi(x):
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # elu(x) + 1

    pq, pk, vv = phi(q.numpy()), phi(k.numpy()), v.numpy()
    T = pq.shape[-2]
    out = np.zeros(pq.shape[:-1] + (vv.shape[-1],))
    for i in range(T):
        last = i + 1 if causal else T
        sim = np.einsum("...d,...jd->...j", pq[..., i, :], pk[..., :last, :])
        out[..., i, :] = np.einsum("...j,...jd->...d", sim, vv[..., :last, :]) / (sim.sum(-1)[..., None] + 1e-6)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_its_definition(causal):
    q, k, v = _qkv(13, seed=3)
    np.testing.assert_allclose(linear_attention(q, k, v, causal=causal).numpy(), _linear_by_definition(q, k, v, causal),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("feature_map", ["elu+1", "relu"])
def test_causal_linear_attention_parallel_equals_recurrent(feature_map):
    q, k, v = _qkv(21, seed=4)
    parallel = linear_attention(q, k, v, feature_map=feature_map, causal=True)
    recurrent = linear_attention_recurrent(q, k, v, feature_map=feature_map)
    torch.testing.assert_close(parallel, recurrent, atol=1e-12, rtol=1e-10)


def test_linear_attention_differs_from_softmax_attention():
    q, k, v = _qkv(16, seed=5)
    exact = selfattn.scaled_dot_product_attention(q, k, v)
    error = (linear_attention(q, k, v) - exact).abs().max().item()
    assert error > 1e-2, error  # an approximation, not the same function


def test_variant_errors():
    q, k, v = _qkv(5)
    with pytest.raises(ValueError, match="feature_map"):
        linear_attention(q, k, v, feature_map="tanh")
    with pytest.raises(ValueError, match="T == S"):
        sliding_window_attention(q, k[..., :3, :], v[..., :3, :], 2)
    with pytest.raises(ValueError, match="window must be > 0"):
        sliding_window_tiled_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="T == S"):
        linear_attention(q, k[..., :3, :], v[..., :3, :], causal=True)


def test_variants_name_bad_dtypes_and_flags():
    # Regression: linear_attention on int tensors failed inside elu ("elu_cpu" not implemented for
    # 'Long'), on mixed dtypes with "expected scalar type Double"; causal="no" was taken as True.
    from selfattn.efficient import tiled_attention

    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(TypeError, match="floating-point tensors; got dtype torch.int64"):
        linear_attention(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        linear_attention(q.double(), q, q)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        linear_attention_recurrent(q.double(), q, q)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        sliding_window_attention(q.double(), q, q, 2)
    for call in (lambda: tiled_attention(q, q, q, causal="no"),
                 lambda: linear_attention(q, q, q, causal="no"),
                 lambda: sliding_window_attention(q, q, q, 2, causal="no"),
                 lambda: sliding_window_tiled_attention(q, q, q, 2, causal="no"),
                 lambda: sliding_window_mask(6, 2, causal="no")):
        with pytest.raises(TypeError, match=r"causal must be True or False; got 'no' \(str\)"):
            call()
    torch.testing.assert_close(tiled_attention(q, q, q, causal=np.bool_(True)), tiled_attention(q, q, q, causal=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_attention_in_half_precision_computes_in_float32(dtype):
    # Regression: the sums over 5000 positions overflowed float16 (407 non-finite outputs).
    x = torch.randn(1, 1, 5000, 4, generator=torch.Generator().manual_seed(0))
    q, k, v = (3 * x).to(dtype), (3 * x).to(dtype), x.to(dtype)
    want = linear_attention(q.float(), k.float(), v.float())
    got = linear_attention(q, k, v)
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    short = (x[..., :50, :] * 3).to(dtype)
    got_c = linear_attention(short, short, x[..., :50, :].to(dtype), causal=True)
    got_r = linear_attention_recurrent(short, short, x[..., :50, :].to(dtype))
    assert got_c.dtype == got_r.dtype == dtype
    torch.testing.assert_close(got_c.float(), got_r.float(), rtol=1e-2, atol=1e-2)


def test_linear_attention_checks_eps():
    q = torch.randn(1, 1, 6, 4)
    for bad in ("a", -1.0, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
            linear_attention(q, q, q, eps=bad)
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
            linear_attention_recurrent(q, q, q, eps=bad)


@pytest.mark.parametrize("feature_map", ["elu+1", "relu"])
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 7, 21, 64])  # 5 and 4 do not divide T = 21; 64 > T
def test_linear_attention_chunkwise_equals_parallel_and_recurrent(chunk_size, feature_map):
    q, k, v = _qkv(21, seed=chunk_size)
    chunkwise = linear_attention_chunkwise(q, k, v, chunk_size, feature_map=feature_map)
    assert torch.isfinite(chunkwise).all()
    torch.testing.assert_close(chunkwise, linear_attention(q, k, v, feature_map=feature_map, causal=True),
                               atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(chunkwise, linear_attention_recurrent(q, k, v, feature_map=feature_map),
                               atol=1e-10, rtol=1e-10)
    if feature_map == "elu+1":  # the written-out sums use elu + 1
        np.testing.assert_allclose(chunkwise.numpy(), _linear_by_definition(q, k, v, causal=True),
                                   rtol=1e-10, atol=1e-12)


def test_linear_attention_chunkwise_gradients_equal_the_parallel_form():
    q, k, v = (x.requires_grad_(True) for x in _qkv(19, seed=8))
    got, want = linear_attention_chunkwise(q, k, v, 6), linear_attention(q, k, v, causal=True)
    d_out = torch.randn_like(got)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), d_out), torch.autograd.grad(want, (q, k, v), d_out),
                    strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


def _matmul_flops(fn, *args, **kwargs):
    counter = FlopCounterMode(display=False)
    with counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def test_linear_attention_chunkwise_flops_are_linear_in_T_and_match_the_formula():
    B, H, Dh, Dv, C = 1, 2, 16, 8, 32
    counts, parallel = {}, {}
    for T in (128, 256, 512):
        g = torch.Generator().manual_seed(T)
        q, k = torch.randn(B, H, T, Dh, generator=g), torch.randn(B, H, T, Dh, generator=g)
        v = torch.randn(B, H, T, Dv, generator=g)
        counts[T] = _matmul_flops(linear_attention_chunkwise, q, k, v, C)
        parallel[T] = _matmul_flops(linear_attention, q, k, v, causal=True)
        # per chunk: phi(Q_c) phi(K_c)^T and its product with V_c (2 C^2 (Dh + Dv)), phi(Q_c) S and
        # phi(K_c)^T V_c (2 C Dh Dv each), phi(Q_c) z (2 C Dh); T / C chunks
        assert counts[T] == B * H * (T // C) * (2 * C * C * (Dh + Dv) + 4 * C * Dh * Dv + 2 * C * Dh)
        assert parallel[T] == 2 * B * H * T * T * (Dh + Dv)  # the masked (T, T) product: quadratic
    assert counts[256] == 2 * counts[128] and counts[512] == 2 * counts[256]  # doubling T doubles the work
    assert parallel[512] == 4 * parallel[256]


def test_linear_attention_chunkwise_peak_memory_is_linear_in_T():
    from selfattn.efficient.memory import peak_tensor_bytes

    chunked, parallel = [], []
    for T in (1024, 2048, 4096):
        q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
        with torch.no_grad():
            chunked.append(peak_tensor_bytes(linear_attention_chunkwise, q, k, v, 64)[0])
            parallel.append(peak_tensor_bytes(linear_attention, q, k, v, causal=True)[0])
    for small, large in zip(chunked[:-1], chunked[1:], strict=True):
        assert 1.8 < large / small <= 2.0  # measured 1.92 and 1.96: a constant plus a part linear in T
    for small, large in zip(parallel[:-1], parallel[1:], strict=True):
        assert large / small > 3.9  # the (T, T) similarities


def test_linear_attention_chunkwise_errors():
    q, k, v = _qkv(6)
    for bad in (0, -2, 2.0, True, "4"):
        with pytest.raises((TypeError, ValueError), match="chunk_size"):
            linear_attention_chunkwise(q, k, v, bad)
    with pytest.raises(ValueError, match="T == S"):
        linear_attention_chunkwise(q, k[..., :3, :], v[..., :3, :], 2)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        linear_attention_chunkwise(q.float(), k, v, 2)
    with pytest.raises(ValueError, match="eps"):
        linear_attention_chunkwise(q, k, v, 2, eps=-1.0)
    with pytest.raises(ValueError, match="feature_map"):
        linear_attention_chunkwise(q, k, v, 2, feature_map="tanh")


def test_linear_attention_chunkwise_half_precision_is_computed_in_float32():
    q, k, v = (x.float() for x in _qkv(40, seed=9))
    got = linear_attention_chunkwise(q.half(), k.half(), v.half(), 16)
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    want = linear_attention_chunkwise(q.half().float(), k.half().float(), v.half().float(), 16)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("where", ["v", "k"])
def test_causal_linear_attention_keeps_a_later_nan_out_of_earlier_rows(where):
    """A NaN or inf stored at position 10 reaches rows 10 and 11 only, in all three causal forms (the
    mask used to be applied by multiplying by 0, and 0 * NaN = NaN reached every row)."""
    from selfattn.efficient.variants import linear_attention_chunkwise, linear_attention_recurrent

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    clean = linear_attention(q, k, v, causal=True)
    bad = {"v": v.clone(), "k": k.clone()}
    bad[where][..., 10, :] = float("nan") if where == "v" else float("inf")
    kk, vv = (bad["k"], bad["v"])
    for out in (linear_attention(q, kk, vv, causal=True), linear_attention_chunkwise(q, kk, vv, 4),
                linear_attention_recurrent(q, kk, vv)):
        assert torch.isfinite(out[..., :10, :]).all()
        torch.testing.assert_close(out[..., :10, :], clean[..., :10, :], atol=1e-12, rtol=0)
        assert not torch.isfinite(out[..., 10:, :]).all()
