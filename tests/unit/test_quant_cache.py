"""Unit tests of the quantized cache (selfattn.inference.quant_cache, chapter 11c)."""

import numpy as np
import pytest
import torch

from selfattn.inference.quant_cache import (
    KiviSettings,
    QuantizedCache,
    attention_error,
    cache_bytes_per_token,
    channel_outlier_ratio,
    int8_per_token,
    kivi,
    quantize_groups,
    quantized_losses,
    standard_schemes,
)
from selfattn.models.gpt import GPT, GPTConfig


def _np_minmax(x, bits):
    """The min/max quantizer of one group, written independently in NumPy."""
    lo, hi = x.min(), x.max()
    scale = (hi - lo) / (2**bits - 1)
    return np.round((x - lo) / scale) * scale + lo


def test_quantize_groups_matches_an_independent_numpy_quantizer_per_channel_and_per_token():
    x = torch.randn(2, 3, 8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    per_channel = quantize_groups(x, 2, -2, 4).numpy()  # groups of 4 tokens of one channel
    per_token = quantize_groups(x, 3, -1, 2).numpy()  # groups of 2 channels of one token
    a = x.numpy()
    for b in range(2):
        for h in range(3):
            for g in range(2):
                for c in range(4):
                    np.testing.assert_allclose(per_channel[b, h, 4 * g:4 * g + 4, c],
                                               _np_minmax(a[b, h, 4 * g:4 * g + 4, c], 2), atol=1e-12, rtol=0)
            for t in range(8):
                for g in range(2):
                    np.testing.assert_allclose(per_token[b, h, t, 2 * g:2 * g + 2],
                                               _np_minmax(a[b, h, t, 2 * g:2 * g + 2], 3), atol=1e-12, rtol=0)


def test_quantize_groups_error_is_at_most_half_a_step_and_a_constant_group_is_exact():
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    for bits in (2, 4, 8):
        back = quantize_groups(x, bits, -1, 16)
        step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / (2**bits - 1)
        assert bool(((back - x).abs() <= step / 2 + 1e-6).all())
    const = torch.full((4, 8), 3.25)
    assert torch.equal(quantize_groups(const, 2, -1, 8), const)


def test_int8_per_token_is_within_half_a_step_and_keeps_zero_rows():
    x = torch.randn(5, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x[0, 0] = 0
    back = int8_per_token(x)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert bool(((back - x).abs() <= step / 2 + 1e-12).all())
    assert torch.equal(back[0, 0], torch.zeros(32, dtype=torch.float64))


def test_kivi_keeps_the_residual_exact_and_quantizes_whole_groups():
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(1, 2, 50, 8, generator=g), torch.randn(1, 2, 50, 8, generator=g)
    s = KiviSettings(bits=2, group_size=16, residual=10)
    kq, vq = kivi(k, v, s)
    n_q = (50 - 10) // 16 * 16  # 32
    assert torch.equal(kq[..., n_q:, :], k[..., n_q:, :]) and torch.equal(vq[..., n_q:, :], v[..., n_q:, :])
    assert float((kq[..., :n_q, :] - k[..., :n_q, :]).abs().max()) > 1e-3  # the old tokens are quantized
    torch.testing.assert_close(kq[..., :n_q, :], quantize_groups(k[..., :n_q, :], 2, -2, 16), atol=0, rtol=0)
    torch.testing.assert_close(vq[..., :n_q, :], quantize_groups(v[..., :n_q, :], 2, -1, 8), atol=0, rtol=0)


def test_an_outlier_channel_hurts_keys_quantized_per_token_more_than_per_channel():
    g = torch.Generator().manual_seed(4)
    k = torch.randn(1, 1, 64, 16, generator=g)
    k[..., 3] = 20 + k[..., 3]  # one channel large in every token (KIVI, figure 2)
    s_channel = KiviSettings(2, 16, 0)
    s_token = KiviSettings(2, 16, 0, key_axis="token")
    err_c = float((kivi(k, k, s_channel)[0] - k).norm())
    err_t = float((kivi(k, k, s_token)[0] - k).norm())
    assert err_t > 3 * err_c
    ratio = channel_outlier_ratio(k)
    assert float(ratio[0]) > 10
    assert float(channel_outlier_ratio(torch.randn(1, 1, 512, 16, generator=g))[0]) < 1.5


def test_bytes_per_token_follow_the_formula():
    assert cache_bytes_per_token("fp16", 64) == 256
    assert cache_bytes_per_token("int8 per token", 64) == 2 * 66
    s = KiviSettings(2, 32, 128)
    assert cache_bytes_per_token("kivi", 64, settings=s) == 64 * 2 / 8 + 64 * 4 / 32 + 64 * 2 / 8 + 4 * 2
    # T = 200: (200 - 128) // 32 * 32 = 64 tokens quantized, 136 in fp16
    assert cache_bytes_per_token("kivi", 64, settings=s, n_tokens=200) == pytest.approx(
        (64 * 48 + 136 * 256) / 200, abs=1e-12)
    with pytest.raises(ValueError, match="scheme"):
        cache_bytes_per_token("int4", 64)


def test_bad_arguments_are_refused():
    x = torch.randn(4, 6)
    with pytest.raises(ValueError, match="group_size"):
        quantize_groups(x, 2, -1, 4)
    with pytest.raises(ValueError, match="bits"):
        quantize_groups(x, 9, -1, 3)
    with pytest.raises(TypeError, match="floating"):
        int8_per_token(torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="key_axis"):
        KiviSettings(key_axis="head")
    with pytest.raises(ValueError, match="settings"):
        QuantizedCache("kivi")


def test_quantized_losses_are_finite_and_fp16_is_close_to_exact():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=12, block_size=16, d_model=16, n_heads=2, n_layers=2, d_ff=32)).eval()
    ids = torch.randint(0, 12, (2, 17), generator=torch.Generator().manual_seed(5))
    losses = quantized_losses(gpt, ids[:, :-1], ids[:, 1:], standard_schemes(group_size=4, residual=4))
    assert all(np.isfinite(v) for v in losses.values())
    assert abs(losses["fp16"] - losses["exact"]) < 1e-3
    assert losses["KIVI 2-bit"] != losses["exact"]
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 8, 8, generator=g) for _ in range(3))
    assert attention_error(q, k, v, "int8 per token") < attention_error(q, k, v, "kivi", KiviSettings(2, 4, 0))


def test_quantized_losses_from_the_first_quantized_position_leave_out_the_exact_steps():
    # KIVI with G = R = 4 is exact while the cache holds fewer than R + G = 8 tokens: the positions
    # 0 .. 6 read an exact cache, so their loss is the exact loss; averaging them in dilutes the error
    from selfattn.inference.quant_cache import first_quantized_position, mean_cache_bytes

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=12, block_size=16, d_model=16, n_heads=2, n_layers=2, d_ff=32)).eval()
    ids = torch.randint(0, 12, (3, 17), generator=torch.Generator().manual_seed(5))
    schemes = {"KIVI 2-bit": standard_schemes(group_size=4, residual=4)["KIVI 2-bit"]}
    s = schemes["KIVI 2-bit"][1]
    f = first_quantized_position(s)
    assert f == 7
    head = quantized_losses(gpt, ids[:, :f + 1][:, :-1], ids[:, 1:f + 1], schemes)  # positions 0 .. 6 only
    assert abs(head["KIVI 2-bit"] - head["exact"]) < 1e-6  # nothing quantized there
    tail = quantized_losses(gpt, ids[:, :-1], ids[:, 1:], schemes, first=f)
    whole = quantized_losses(gpt, ids[:, :-1], ids[:, 1:], schemes)
    inc_tail, inc_whole = tail["KIVI 2-bit"] - tail["exact"], whole["KIVI 2-bit"] - whole["exact"]
    assert np.isfinite([inc_tail, inc_whole]).all() and abs(inc_tail) > 1e-4
    # the whole mean is the tail's, diluted by the f exact positions (per-position losses are means over rows)
    assert inc_whole == pytest.approx(inc_tail * (16 - f) / 16, rel=1e-6)
    # the bytes of those steps: caches of f + 1 .. 16 tokens; for T = 8, 4 quantized (12 B at Dh = 8) + 4 at fp16 (32 B)
    q_bytes = cache_bytes_per_token("kivi", 8, settings=s)
    assert q_bytes == 8 * 2 / 8 + 8 * 4 / 4 + 8 * 2 / 8 + 4 * 2
    expected = np.mean([((n - 4) // 4 * 4 * q_bytes + (n - (n - 4) // 4 * 4) * 32) / n for n in range(f + 1, 17)])
    assert mean_cache_bytes("kivi", 8, settings=s, first=f, end=16) == pytest.approx(expected, abs=1e-12)
    assert mean_cache_bytes("int8 per token", 8, first=f, end=16) == 2 * 10
    with pytest.raises(ValueError, match="first"):
        quantized_losses(gpt, ids[:, :-1], ids[:, 1:], schemes, first=16)
    with pytest.raises(ValueError, match="first"):
        mean_cache_bytes("kivi", 8, settings=s, first=5, end=5)
