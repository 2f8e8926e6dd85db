"""Unit tests of the learned sink logit (selfattn.sinks, chapter 11c)."""

import numpy as np
import pytest
import torch

from selfattn.attention import scaled_dot_product_attention
from selfattn.masks import causal_mask
from selfattn.sinks import SinkAttention, SinkAttentionConfig, sink_attention


def _np_sink_attention(q, k, v, sinks, keep):
    """The formula in NumPy, float64, written independently: exp(s) joins the denominator."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    scores = np.where(keep, scores, -np.inf)
    m = np.maximum(scores.max(-1, keepdims=True), sinks[None, :, None, None])
    e = np.exp(scores - m)
    denom = e.sum(-1, keepdims=True) + np.exp(sinks[None, :, None, None] - m)
    w = e / denom
    return w @ v, w


def test_sink_attention_matches_the_numpy_formula_and_rows_sum_below_one():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=g) for _ in range(3))
    sinks = torch.tensor([-1.0, 0.5, 4.0], dtype=torch.float64)
    keep = causal_mask(5)
    out, w = sink_attention(q, k, v, sinks, keep, return_weights=True)
    ref_out, ref_w = _np_sink_attention(q.numpy(), k.numpy(), v.numpy(), sinks.numpy(), keep.numpy())
    np.testing.assert_allclose(out.numpy(), ref_out, atol=1e-12, rtol=0)
    np.testing.assert_allclose(w.numpy(), ref_w, atol=1e-12, rtol=0)
    assert float(w.sum(-1).max()) < 1 and float(w.sum(-1)[:, 2].max()) < 0.5


def test_a_very_negative_sink_is_plain_attention_and_a_row_with_no_key_is_zero():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=g) for _ in range(3))
    out = sink_attention(q, k, v, torch.full((2,), -1e4, dtype=torch.float64))
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v), atol=1e-12, rtol=0)
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[1] = False
    v_bad = v.clone()
    v_bad[..., 2, :] = float("nan")  # hidden from row 1 only ... and visible to the others
    keep[:, 2] = False  # now hidden from every row
    out, w = sink_attention(q, k, v_bad, torch.zeros(2, dtype=torch.float64), keep, return_weights=True)
    assert torch.isfinite(out).all()
    assert torch.equal(out[..., 1, :], torch.zeros_like(out[..., 1, :]))
    assert torch.equal(w[..., 1, :], torch.zeros_like(w[..., 1, :]))


def test_sink_attention_gradients_are_finite_and_reach_the_sink_logits():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=g) for _ in range(3))
    sinks = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    sink_attention(q, k, v, sinks, causal_mask(3)).sum().backward()
    assert torch.isfinite(sinks.grad).all() and float(sinks.grad.abs().min()) > 0


def test_bad_sink_logits_are_refused():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="sink_logits"):
        sink_attention(q, q, q, torch.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        sink_attention(q, q, q, torch.tensor([0.0, float("-inf")]))
    with pytest.raises(TypeError, match="sink_logits"):
        sink_attention(q, q, q, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="n_kv_heads"):
        SinkAttentionConfig(d_model=8, n_heads=3, n_kv_heads=2, d_head=4)


def test_sink_attention_layer_window_mask_reads_the_last_w_keys():
    layer = SinkAttention(SinkAttentionConfig(d_model=8, n_heads=2, n_kv_heads=1, d_head=4, sliding_window=3))
    keep = layer.keep_mask(6)
    assert keep[5].tolist() == [False, False, False, True, True, True]
    assert keep[1].tolist() == [True, True, False, False, False, False]
    out = layer(torch.randn(2, 6, 8))
    assert out.shape == (2, 6, 8) and torch.isfinite(out).all()
