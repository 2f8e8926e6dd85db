"""Grouped-query attention (selfattn.gqa) against multi-head attention, torch's SDPA and by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import selfattn
from selfattn.gqa import GQAConfig, GroupedQueryAttention, kv_cache_bytes_per_token, repeat_kv


def _gqa(d_model=24, n_heads=6, n_kv_heads=2, bias=True, seed=0):
    module = GroupedQueryAttention(GQAConfig(d_model, n_heads, n_kv_heads, bias=bias),
                                   generator=torch.Generator().manual_seed(seed)).double().eval()  # fmt: skip
    if bias:
        with torch.no_grad():
            for b in (module.b_Q, module.b_K, module.b_V, module.b_O):
                b.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(seed + 1))
    return module


def _x(B=2, T=7, D=24, seed=3):
    return torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_with_as_many_kv_heads_as_query_heads_it_is_multi_head_attention():
    mha = selfattn.MultiHeadAttention(selfattn.MHAConfig(24, 6)).double().eval()
    with torch.no_grad():
        for b in (mha.b_Q, mha.b_K, mha.b_V, mha.b_O):
            b.normal_(0.0, 0.1)
    gqa = GroupedQueryAttention.from_mha(mha, n_kv_heads=6).eval()
    x, mask = _x(), selfattn.causal_mask(7)
    with torch.no_grad():
        np.testing.assert_allclose(gqa(x, mask=mask).numpy(), mha(x, mask=mask).numpy(), atol=1e-12, rtol=0)
        np.testing.assert_allclose(gqa(x).numpy(), mha(x).numpy(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 3, 6])
def test_equals_torch_sdpa_with_enable_gqa(n_kv_heads):
    gqa = _gqa(n_kv_heads=n_kv_heads)
    x = _x()
    with torch.no_grad():
        Q = selfattn.split_heads(x @ gqa.W_Q + gqa.b_Q, 6)  # (B, H, T, Dh)
        K, V = gqa.project_kv(x)  # (B, Hkv, T, Dh): torch repeats them itself
        assert K.shape == (2, n_kv_heads, 7, 4)
        context = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=True)
        expected = selfattn.merge_heads(context) @ gqa.W_O + gqa.b_O
        np.testing.assert_allclose(gqa(x, mask=selfattn.causal_mask(7)).numpy(), expected.numpy(), atol=1e-12, rtol=0)


def test_repeat_kv_maps_query_head_h_to_kv_head_h_over_group_size():
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float64).reshape(2, 3, 4, 5)
    out = repeat_kv(x, 4)
    assert out.shape == (2, 12, 4, 5)
    for h in range(12):
        assert torch.equal(out[:, h], x[:, h // 4])
    assert torch.equal(out, torch.repeat_interleave(x, 4, dim=1))
    assert repeat_kv(x, 1) is x


def test_from_mha_mean_pools_each_groups_key_and_value_heads():
    mha = selfattn.MultiHeadAttention(selfattn.MHAConfig(24, 6)).double()
    gqa = GroupedQueryAttention.from_mha(mha, n_kv_heads=2)  # groups of 3 heads of width 4
    for g in range(2):
        heads = [mha.head_weights(h) for h in range(3 * g, 3 * g + 3)]
        W_K = sum(hw.W_K for hw in heads) / 3
        W_V = sum(hw.W_V for hw in heads) / 3
        np.testing.assert_allclose(gqa.W_K[:, 4 * g : 4 * g + 4].detach().numpy(), W_K.detach().numpy(), atol=1e-15, rtol=0)
        np.testing.assert_allclose(gqa.W_V[:, 4 * g : 4 * g + 4].detach().numpy(), W_V.detach().numpy(), atol=1e-15, rtol=0)
        b_K = (mha.b_K[12 * g : 12 * g + 12]).reshape(3, 4).mean(0)
        np.testing.assert_allclose(gqa.b_K[4 * g : 4 * g + 4].detach().numpy(), b_K.detach().numpy(), atol=1e-15, rtol=0)
    assert torch.equal(gqa.W_Q, mha.W_Q) and torch.equal(gqa.W_O, mha.W_O)


def test_the_cache_it_needs_shrinks_by_n_heads_over_n_kv_heads():
    x = _x(B=1, T=10)
    for n_kv in (6, 3, 2, 1):
        K, V = _gqa(n_kv_heads=n_kv).project_kv(x)
        cached = K.numel() * K.element_size() + V.numel() * V.element_size()  # one layer, 10 tokens
        assert cached == 10 * kv_cache_bytes_per_token(1, n_kv, 4, 8)  # float64: 8 bytes per number
    assert kv_cache_bytes_per_token(12, 12, 64, 2) == 2 * 12 * 12 * 64 * 2  # GPT-2 small in float16: 36,864
    assert kv_cache_bytes_per_token(32, 8, 128, 2) == 131072  # 32 layers, 8 KV heads of 128, bf16


def test_masks_follow_the_package_contract():
    gqa = _gqa(n_kv_heads=2)
    x = _x()
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 5:] = False  # padding at the end of the second sequence
    x_bad = x.clone()
    x_bad[1, 5:] = float("nan")  # NaN at hidden key positions
    with torch.no_grad():
        out = gqa(x_bad[:, :5], x_bad, mask=keep)
        ref = gqa(x[:, :5], x, mask=keep)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-12, rtol=0)


def test_gradients_flow_to_every_parameter():
    gqa = _gqa(n_kv_heads=3).train()
    gqa(_x(), mask=selfattn.causal_mask(7)).square().sum().backward()
    for name, p in gqa.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: GQAConfig(24, 6, 4), ValueError, "n_heads=6 must be divisible by n_kv_heads=4"),
        (lambda: GQAConfig(24, 5, 5), ValueError, "d_model=24 must be divisible by n_heads=5"),
        (lambda: GQAConfig(24, 6, 0), ValueError, "n_kv_heads"),
        (lambda: GQAConfig(24, 6, 2.0), TypeError, "n_kv_heads"),
        (lambda: GQAConfig(24, 6, 2, bias="yes"), TypeError, "bias"),
        (lambda: GroupedQueryAttention(selfattn.MHAConfig(24, 6)), TypeError, "GQAConfig"),
        (lambda: _gqa()(torch.randn(2, 7, 24)), TypeError, "dtype"),
        (lambda: _gqa()(_x(D=12)), ValueError, "d_model=24"),
        (lambda: _gqa()(_x(), _x(B=3)), ValueError, "batch size"),
        (lambda: repeat_kv(torch.zeros(2, 3, 4), 2), ValueError, "(B, Hkv, S, Dh)"),
        (lambda: kv_cache_bytes_per_token(2, 2, 4, 0), ValueError, "bytes_per_number"),
        (lambda: kv_cache_bytes_per_token(2, 2, 0, 2), ValueError, "d_head"),
        (lambda: GroupedQueryAttention.from_mha(torch.nn.Linear(2, 2), 1), TypeError, "MultiHeadAttention"),
    ],
)
def test_bad_input_raises_naming_the_argument(make, error, match):
    with pytest.raises(error, match=match.replace("(", r"\(").replace(")", r"\)")):
        make()


@pytest.mark.parametrize(
    ("bpn", "expected"), [(np.float16(1), 4098), (np.int8(2), 8196), (np.float32(0.5), 2049), (np.int64(4), 16392)]
)
def test_kv_cache_bytes_per_token_with_numpy_bytes_per_number_is_exact(bpn, expected):
    """np.float16(1) computed in float16 (4098 rounded to 4096); np.int8(2) overflowed (OverflowError)."""
    got = kv_cache_bytes_per_token(1, 1, 2049, bpn)
    assert got == expected and type(got) is int


# --- bad input found by the new-user probe (chapter 11) ---


def _probe_gqa():
    torch.manual_seed(0)
    return GroupedQueryAttention(GQAConfig(d_model=32, n_heads=8, n_kv_heads=2))


def test_x_kv_of_the_wrong_rank_is_named_before_the_batch_sizes():
    """An x_kv of shape (5, 32) was reported as a batch-size mismatch."""
    with pytest.raises(ValueError, match=r"x_kv must have shape \(B, S, D\) \(3 dims\); got shape \(5, 32\)"):
        _probe_gqa()(torch.randn(2, 5, 32), torch.randn(5, 32))


def test_no_query_or_no_key_position_is_named_by_its_input():
    """T = 0 and S = 0 were reported in terms of the internal k and v ("k (2, 8, 0, 4)")."""
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match=r"x_q must hold at least one position \(T > 0\); got shape \(2, 0, 32\)"):
        _probe_gqa()(x[:, :0])
    with pytest.raises(ValueError, match=r"x_kv must hold at least one position \(S > 0\); got shape \(2, 0, 32\)"):
        _probe_gqa()(x, x[:, :0])


@pytest.mark.parametrize("which", ["x_q", "x_kv"])
def test_an_integer_input_is_told_to_be_floating(which):
    """An integer x got the advice "or the module with .to(torch.int64)"."""
    x = torch.randn(2, 5, 32)
    args = (x.long(), x) if which == "x_q" else (x, x.long())
    with pytest.raises(TypeError, match=rf"{which} must be a floating tensor of the module's dtype, torch.float32; "
                                        r"got dtype torch.int64\. Convert it with") as info:
        _probe_gqa()(*args)
    assert "the module with" not in str(info.value)


def test_gqa_config_stores_numpy_ints_as_ints():
    assert type(GQAConfig(d_model=32, n_heads=8, n_kv_heads=np.int64(2)).n_kv_heads) is int
