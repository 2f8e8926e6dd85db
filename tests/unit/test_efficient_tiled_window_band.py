"""The sliding window's band kernel (selfattn.efficient.tiled._window_band_forward_base2): one key tile
per query block, no online softmax. It computes what the dense band mask computes, forward and
backward, keeps the masking-by-replacement contract, and is as accurate as torch's SDPA. Speed is
measured by bench/attention_bench.py, never here."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfattn import ref
from selfattn.efficient import (
    sliding_window_attention,
    sliding_window_mask,
    sliding_window_tiled_attention,
)
from selfattn.efficient import tiled as tiled_module
from selfattn.efficient.tiled import (
    WINDOW_BACKWARD_BLOCK_Q,
    WINDOW_BLOCK_K,
    WINDOW_BLOCK_Q,
    Visibility,
    band_fits_one_tile,
)


@pytest.fixture
def band(monkeypatch):
    """Records each call of the band kernel (``"band"``, once per head group) and of the general loop
    (``"general"``: a fall back, or a band wider than the key tile)."""
    calls = []
    real_band, real_general = tiled_module._window_band_forward_base2, tiled_module._tiled_forward_base2
    monkeypatch.setattr(tiled_module, "_window_band_forward_base2",
                        lambda *a, **kw: calls.append("band") or real_band(*a, **kw))
    monkeypatch.setattr(tiled_module, "_tiled_forward_base2",
                        lambda *a, **kw: calls.append("general") or real_general(*a, **kw))
    return calls


def _qkv(T, *, B=2, H=3, Dh=8, Dv=5, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    return [x.to(dtype).requires_grad_() for x in (q, k, v)]


def _grads(out, inputs, seed=7):
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad(out, inputs, d_out), d_out


def _numpy_forward_and_backward(q, k, v, keep, d_out):
    """Output and (dq, dk, dv) of attention with keep-mask ``keep``, in float64 NumPy: the forward is
    ``selfattn.ref``'s; the backward the textbook formulas on its weights P (dV = P^T dO,
    dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K / sqrt(Dh), dK = dS^T Q / sqrt(Dh))."""
    q, k, v, d_out = (x.detach().double().numpy() for x in (q, k, v, d_out))
    out, p = ref.scaled_dot_product_attention(q, k, v, keep, return_weights=True)
    d_s = p * (d_out @ np.swapaxes(v, -1, -2) - (d_out * out).sum(-1, keepdims=True))
    scale = 1.0 / math.sqrt(q.shape[-1])
    return out, (d_s @ k * scale, np.swapaxes(d_s, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ d_out)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,window", [(29, 1), (29, 3), (29, 11), (29, 28), (29, 29), (29, 100), (64, 16), (1, 1)])
@pytest.mark.parametrize("block_q,budget", [(4, 100), (7, 1 << 19), (16, 16), (WINDOW_BLOCK_Q, 1 << 19), (1, 5)])
def test_band_kernel_equals_the_dense_band_and_numpy_forward_and_backward(band, monkeypatch, causal, T, window,
                                                                          block_q, budget):
    """T = 29 is no multiple of any block; windows 1 (only itself), inside T, T - 1, T and past T;
    a tile budget below one block (one block per product), of a few blocks, and of the whole length."""
    monkeypatch.setattr(tiled_module, "WINDOW_TILE_SCORES", budget)
    q, k, v = _qkv(T, seed=T + window + block_q)
    out, lse = _forward_with_lse(q, k, v, window, causal, block_q)
    assert set(band) == {"band"}, "the band kernel ran (once per head group), without falling back"
    dense = sliding_window_attention(q, k, v, window, causal)
    torch.testing.assert_close(out, dense, atol=1e-12, rtol=0)
    keep = sliding_window_mask(T, window, causal=causal)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1).detach(), atol=1e-12, rtol=0)
    grads, d_out = _grads(out, (q, k, v))
    dense_grads, _ = _grads(dense, (q, k, v))
    np_out, np_grads = _numpy_forward_and_backward(q, k, v, keep.numpy(), d_out)
    np.testing.assert_allclose(out.detach().numpy(), np_out, atol=1e-12, rtol=0)
    for name, got, want, want_np in zip("qkv", grads, dense_grads, np_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"d{name} against the dense band")
        np.testing.assert_allclose(got.numpy(), want_np, atol=1e-12, rtol=0, err_msg=f"d{name} against NumPy")


@pytest.mark.parametrize("T", [1, 29, 64, 300])
@pytest.mark.parametrize("block_q", [1, 4, 7, 32])
@pytest.mark.parametrize("before,after", [(0, 0), (3, 0), (15, 0), (40, 0), (3, 3), (40, 40), (400, 400)])
@pytest.mark.parametrize("budget", [1, 200, 1 << 19])
def test_band_spans_cover_every_row_once_with_its_band_and_within_the_budget(T, block_q, before, after, budget):
    spans = tiled_module._band_spans(T, block_q, before, after, budget)
    assert [s[0] for s in spans] == [0] + [s[1] for s in spans[:-1]] and spans[-1][1] == T  # in order, no gap
    for i0, i1, j0, j1, n in spans:
        assert i1 > i0 and n >= 1 and (i1 - i0) % n == 0
        bq = (i1 - i0) // n
        width = j1 - j0 - (n - 1) * block_q
        if n > 1:  # inner blocks: whole blocks, the full band inside [0, T), several only within the budget
            assert bq == block_q and j0 == i0 - before >= 0 and j1 == i1 + after <= T
            assert width == block_q + before + after and n * bq * width <= budget
        else:  # one tile: its rows' keys cut to [0, T); beyond one block only within the budget
            assert (j0, j1) == (max(i0 - before, 0), min(i1 + after, T))
            assert i1 - i0 <= block_q or (i1 - i0) * (j1 - j0) <= budget


def _forward_with_lse(q, k, v, window, causal, block_q, block_k=WINDOW_BLOCK_K):
    """``sliding_window_tiled_attention``'s own call, with the log-sum-exp that it does not return."""
    vis = Visibility(causal_offset=0 if causal else None, window=window)
    return tiled_module._TiledAttentionFunction.apply(q, k, v, vis, 1.0 / math.sqrt(q.shape[-1]), block_q, block_k)


def test_band_kernel_runs_with_the_defaults_and_only_when_a_band_fits_one_key_tile(band):
    q, k, v = _qkv(40)
    sliding_window_tiled_attention(q, k, v, 7)
    assert set(band) == {"band"}
    band.clear()
    sliding_window_tiled_attention(q, k, v, 7, block_q=16, block_k=16)  # a band of 22 keys: two tiles
    assert set(band) == {"general"}, "narrower key tiles: the general online-softmax loop"
    assert band_fits_one_tile(Visibility(causal_offset=0, window=7), None, 16, 22, 40)
    assert not band_fits_one_tile(Visibility(causal_offset=0, window=7), None, 16, 21, 40)
    assert band_fits_one_tile(Visibility(window=7), None, 16, 40, 40)  # the band cut at T fits
    assert not band_fits_one_tile(Visibility(causal_offset=0), None, 16, 1 << 16, 40)  # no window
    assert not band_fits_one_tile(Visibility(causal_offset=0, window=7, mask=torch.ones(40, 40, dtype=torch.bool)),
                                  None, 16, 1 << 16, 40)


def test_band_kernel_in_head_groups_equals_one_thread(band):
    """OMP_NUM_THREADS=1 (the suite) runs no split; here 2 threads split 2 x 3 heads into 2 groups."""
    q, k, v = _qkv(70, seed=5)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (2, 1):
            torch.set_num_threads(threads)
            out = sliding_window_tiled_attention(q, k, v, 9, block_q=8)
            results.append((out, *_grads(out, (q, k, v))[0]))
    finally:
        torch.set_num_threads(before)
    assert band == ["band"] * 3, "two groups with 2 threads, one call with 1"
    for split, alone in zip(*results, strict=True):
        torch.testing.assert_close(split, alone, atol=1e-14, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_value_reaches_only_the_rows_that_see_it(causal, which, bad, band):
    """Masking by replacement: a NaN or inf stored at a position reaches neither the outputs nor the
    gradients of the rows whose window does not hold it (the band kernel redoes such inputs the safe way).
    The band kernel is the path under test: it must have run (``band``), not only the general loop."""
    T, window, pos = 40, 5, 17
    q, k, v = _qkv(T, seed=3)
    clean = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with torch.no_grad():
        {"q": q, "k": k, "v": v}[which][1, 2, pos, 3] = bad
    out = sliding_window_tiled_attention(q, k, v, window, causal, block_q=8)
    assert band and band[0] == "band", band  # dispatched to the band kernel first
    grads, _ = _grads(out, (q, k, v))
    expected = sliding_window_attention(*clean, window, causal)
    expected_grads, _ = _grads(expected, clean)
    i = torch.arange(T)
    if which == "q":
        sees = i == pos  # a query is read by its own row only
    else:
        sees = ((i >= pos) & (i - pos < window)) if causal else ((i - pos).abs() < window)
    blind = ~sees
    torch.testing.assert_close(out[1, 2, blind], expected[1, 2, blind], atol=1e-12, rtol=0)
    torch.testing.assert_close(out[0], expected[0], atol=1e-12, rtol=0)  # other heads untouched
    torch.testing.assert_close(out[1, :2], expected[1, :2], atol=1e-12, rtol=0)
    # the rows that cannot see it, and the keys those rows read, get the clean gradients
    torch.testing.assert_close(grads[0][1, 2, blind], expected_grads[0][1, 2, blind], atol=1e-12, rtol=0)
    far = (i - pos).abs() >= 2 * window  # keys and values read only by rows that cannot see pos
    for g, w in zip(grads[1:], expected_grads[1:], strict=True):
        torch.testing.assert_close(g[1, 2, far], w[1, 2, far], atol=1e-12, rtol=0)


def _float64_band_truth(q, k, v, d_out, keep):
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = sliding_window_attention_dense(q, k, v, keep)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out.double()))


def sliding_window_attention_dense(q, k, v, keep):
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1) @ v  # (..., T, T) @ (..., T, Dv)


def _relative_errors(got, truth):
    return [float((g.double() - t).abs().max() / t.abs().max()) for g, t in zip(got, truth, strict=True)]


def _torch_sdpa(q, k, v, d_out, keep):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out))


@pytest.mark.parametrize("dtype,magnitude", [(torch.float16, 1.0), (torch.bfloat16, 1.0), (torch.float32, 1.0),
                                             (torch.float32, 1e3), (torch.float32, 1e5)])
@pytest.mark.parametrize("causal", [True, False])
def test_as_accurate_as_torch_sdpa_with_the_same_mask(band, dtype, magnitude, causal):
    """Half precision (scores, softmax and sums in float32, the output in the input dtype) and float32
    at large logits: each of out, dq, dk, dv within 4x torch SDPA's error against float64, as the rest
    of the tiled module (test_efficient_tiled.py)."""
    T, window = 150, 37
    q, k, v = _qkv(T, B=1, H=4, Dh=64, Dv=64, seed=int(math.log10(magnitude)) + 10 * causal, dtype=dtype,
                   scale=magnitude ** 0.5)
    d_out = torch.randn(v.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    keep = sliding_window_mask(T, window, causal=causal)
    truth = _float64_band_truth(q, k, v, d_out, keep)
    want = _relative_errors(_torch_sdpa(q, k, v, d_out, keep), truth)
    out = sliding_window_tiled_attention(q, k, v, window, causal, block_q=16)
    assert out.dtype == dtype and set(band) == {"band"}
    got = _relative_errors((out.detach(), *torch.autograd.grad(out, (q, k, v), d_out)), truth)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert g <= 4 * max(w, torch.finfo(dtype).eps), f"{name}: error {g:.2e} > 4 x SDPA's {w:.2e}"


@pytest.mark.parametrize("kwargs,error,match", [
    ({"window": 0}, ValueError, "window must be > 0"),
    ({"window": -3}, ValueError, "window must be > 0"),
    ({"window": 2.5}, TypeError, "window"),
    ({"window": 3, "block_q": 0}, ValueError, "block_q must be > 0"),
    ({"window": 3, "block_k": -1}, ValueError, "block_k must be > 0"),
    ({"window": 3, "block_q": 4.0}, TypeError, "block_q"),
    ({"window": 3, "backward_block_q": 0}, ValueError, "backward_block_q must be > 0"),
    ({"window": 3, "backward_block_q": None}, TypeError, "backward_block_q"),
])
def test_bad_window_or_block_sizes_are_refused_by_name(kwargs, error, match):
    q, k, v = _qkv(10)
    with pytest.raises(error, match=match):
        sliding_window_tiled_attention(q, k, v, **kwargs)


@pytest.fixture
def backward_blocks(monkeypatch):
    """Records the (block_q, block_k) of each call of the torch backward loop."""
    calls = []
    real = tiled_module.tiled_backward_torch

    def recording(q, k, v, out, lse2, d_out, vis, scale, block_q, block_k, **kw):
        calls.append((block_q, block_k))
        return real(q, k, v, out, lse2, d_out, vis, scale, block_q, block_k, **kw)

    monkeypatch.setattr(tiled_module, "tiled_backward_torch", recording)
    return calls


def test_the_backward_runs_its_own_block_size_with_the_same_gradients(band, backward_blocks):
    """The band kernel is fastest at 32-row blocks and the recomputing backward at 64
    (bench/attention_bench.py --window-sweep), so the backward takes ``backward_block_q``; the
    gradients are those of the dense band whatever it is."""
    assert (WINDOW_BLOCK_Q, WINDOW_BACKWARD_BLOCK_Q) == (32, 64)
    q, k, v = _qkv(150, B=1, H=2, seed=3)
    out = sliding_window_tiled_attention(q, k, v, 20)
    grads, d_out = _grads(out, (q, k, v))
    # sets: with 2 threads the two heads are two head groups, one call of each kernel per group
    assert set(band) == {"band"} and set(backward_blocks) == {(WINDOW_BACKWARD_BLOCK_Q, WINDOW_BLOCK_K)}, \
        "forward by the band kernel at 32 rows, backward at 64"
    dense_grads, _ = _grads(sliding_window_attention(q, k, v, 20), (q, k, v))
    for backward_block_q in (1, 7, 150, 1000):
        backward_blocks.clear()
        out = sliding_window_tiled_attention(q, k, v, 20, block_q=16, backward_block_q=backward_block_q)
        got_grads, _ = _grads(out, (q, k, v))
        assert set(backward_blocks) == {(backward_block_q, WINDOW_BLOCK_K)}
        for name, got, want in zip("qkv", got_grads, dense_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"d{name}, backward_block_q={backward_block_q}")
    for name, got, want in zip("qkv", grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"d{name} with the default blocks")
