"""selfattn.modern (RMSNorm, SwiGLU, QKNormAttention, ModernBlock), its NumPy reference
selfattn.ref.modern, and the QK-norm experiment's argument checks (chapter 07)."""

import math

import numpy as np
import pytest
import torch

import selfattn
from selfattn import modern, ref
from selfattn.experiments.qk_norm import LogitGrowthConfig, train_logit_growth


def _block(qk_norm=False, seed=0, **sizes):
    torch.manual_seed(seed)
    config = modern.ModernBlockConfig(**{"d_model": 16, "n_heads": 4, "d_ff": 40, **sizes}, qk_norm=qk_norm)
    return modern.ModernBlock(config).double()


# --- RMSNorm -----------------------------------------------------------------------------------


def test_rms_norm_gives_unit_rms_and_ignores_the_scale_of_its_input():
    norm = modern.RMSNorm(8, eps=1e-12).double()
    x = torch.randn(3, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = norm(x)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(3, 4, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(norm(1000 * x), out, atol=1e-10, rtol=0)
    # unlike layer norm it keeps the mean: a constant vector stays a (unit) constant vector, not zeros
    torch.testing.assert_close(norm(torch.full((1, 8), 5.0, dtype=torch.float64)), torch.ones(1, 8, dtype=torch.float64))


def test_rms_norm_of_zeros_is_zeros_with_finite_gradients():
    norm = modern.RMSNorm(4)
    x = torch.zeros(2, 4, requires_grad=True)
    out = norm(x)
    out.sum().backward()
    assert torch.equal(out, torch.zeros(2, 4)) and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_half_precision_computes_in_float32(dtype):
    x = 300 * torch.randn(2, 64)  # x**2 overflows float16 (max 65504) if squared in float16
    norm = modern.RMSNorm(64).to(dtype)
    out = norm(x.to(dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()
    expected = modern.RMSNorm(64)(x.to(dtype).float())
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [((0,), ValueError, "d must be > 0"), ((2.5,), TypeError, "d must be a positive int"),
     ((4, 0.0), ValueError, "eps must be a number > 0"), ((4, float("nan")), ValueError, "eps"),
     ((4, True), TypeError, "eps must be a number")],
)  # fmt: skip
def test_rms_norm_refuses_bad_sizes(args, error, match):
    with pytest.raises(error, match=match):
        modern.RMSNorm(*args)


def test_rms_norm_refuses_bad_inputs():
    norm = modern.RMSNorm(8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        norm(np.ones(8))
    with pytest.raises(ValueError, match=r"last dim d=8; got shape \(2, 7\)"):
        norm(torch.ones(2, 7))
    with pytest.raises(TypeError, match="dtype"):
        norm(torch.ones(2, 8, dtype=torch.float64))


# --- SwiGLU ------------------------------------------------------------------------------------


def test_swiglu_shapes_no_biases_and_position_wise():
    ffn = modern.SwiGLU(16, 40).double()
    assert all(lin.bias is None for lin in (ffn.gate_proj, ffn.up_proj, ffn.down_proj))
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 16 * 40
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    out = ffn(x)
    assert out.shape == (2, 5, 16)
    torch.testing.assert_close(ffn(x[:, 2:3]), out[:, 2:3], atol=1e-14, rtol=0)  # each position on its own


def test_swiglu_refuses_bad_inputs():
    ffn = modern.SwiGLU(16, 40)
    with pytest.raises(ValueError, match=r"\(B, T, D\) \(3 dims\); got shape \(5, 16\)"):
        ffn(torch.ones(5, 16))
    with pytest.raises(ValueError, match="last dim d_model=16"):
        ffn(torch.ones(1, 5, 8))
    with pytest.raises(ValueError, match="d_ff must be > 0"):
        modern.SwiGLU(16, 0)


# --- the block and QK-norm ---------------------------------------------------------------------


@pytest.mark.parametrize("qk_norm", [False, True])
def test_modern_block_shapes_gradients_and_mask(qk_norm):
    block = _block(qk_norm)
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    out, weights = block(x, selfattn.causal_mask(6), return_weights=True)
    assert out.shape == (2, 6, 16) and weights.shape == (2, 4, 6, 6)
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # the mask reaches the attention
    out.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("qk_norm", [False, True])
def test_modern_block_keeps_a_nan_at_a_masked_position_out(qk_norm):
    block = _block(qk_norm)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    x[0, 4] = float("nan")  # the last position: no earlier query can see it under a causal mask
    out = block(x, selfattn.causal_mask(5))
    assert torch.isfinite(out[0, :4]).all()


def test_modern_block_parameter_names_and_variants():
    plain, qk = _block(False), _block(True)
    assert type(plain.attn) is selfattn.MultiHeadAttention and plain.attn.config.bias is False
    assert isinstance(qk.attn, modern.QKNormAttention) and qk.attn.q_norm.weight.shape == (4,)
    names = {n for n, _ in plain.named_parameters()}
    assert names == {"attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "norm1.weight", "norm2.weight",
                     "ffn.gate_proj.weight", "ffn.up_proj.weight", "ffn.down_proj.weight"}  # fmt: skip


def test_modern_block_refuses_bad_inputs():
    block = _block()
    with pytest.raises(TypeError, match="config must be a ModernBlockConfig"):
        modern.ModernBlock(selfattn.BlockConfig(16, 4, 40))
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        block(torch.ones(6, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="last dim d_model=16"):
        block(torch.ones(1, 6, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least one position"):
        block(torch.ones(1, 0, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="return_weights must be True or False"):
        block(torch.ones(1, 2, 16, dtype=torch.float64), return_weights="yes")
    with pytest.raises(ValueError, match="divisible by n_heads"):
        modern.ModernBlockConfig(d_model=10, n_heads=4, d_ff=8)
    with pytest.raises(TypeError, match="qk_norm must be True or False"):
        modern.ModernBlockConfig(d_model=8, n_heads=2, d_ff=8, qk_norm="no")
    with pytest.raises(ValueError, match="eps"):
        modern.ModernBlockConfig(d_model=8, n_heads=2, d_ff=8, norm_eps=-1.0)


def test_attention_scores_are_the_logits_of_the_weights():
    for qk_norm in (False, True):
        block = _block(qk_norm).eval()
        x = torch.randn(2, 6, 16, dtype=torch.float64)
        keep = selfattn.causal_mask(6)
        with torch.no_grad():
            _, weights = block(x, keep, return_weights=True)
            scores = modern.attention_scores(block, x)
        torch.testing.assert_close(scores.masked_fill(~keep, float("-inf")).softmax(-1), weights, atol=1e-14, rtol=0)
    with pytest.raises(TypeError, match="block must be a ModernBlock"):
        modern.attention_scores(selfattn.TransformerBlock(selfattn.BlockConfig(16, 4, 40)), x)


def test_qk_norm_bound_holds_however_large_the_projections():
    block = _block(True, seed=3)
    with torch.no_grad():
        block.attn.W_Q.mul_(1000)
        block.attn.W_K.mul_(1000)
        block.attn.q_norm.weight.copy_(torch.linspace(-3, 2, 4, dtype=torch.float64))
    x = torch.randn(4, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    bound = modern.qk_norm_score_bound(block.attn)
    assert bound == pytest.approx(math.sqrt(4) * 3.0)  # sqrt(d_head) * max |g_q g_k|, g_k = 1
    with torch.no_grad():
        scores = modern.attention_scores(block, x)
    assert torch.isfinite(scores).all() and 0.3 * bound < scores.abs().max() <= bound
    plain = _block(False, seed=3)
    with torch.no_grad():
        plain.attn.W_Q.mul_(1000)
        plain.attn.W_K.mul_(1000)
        assert modern.attention_scores(plain, x).abs().max() > 1000 * bound  # nothing bounds these
    with pytest.raises(TypeError, match="attn must be a QKNormAttention"):
        modern.qk_norm_score_bound(plain.attn)


def test_reference_params_and_llama_state_dict_names():
    assert set(modern.reference_params(_block(True))) == set(ref.modern.MODERN_BLOCK_PARAMS) | {"g_q", "g_k"}
    assert set(modern.llama_state_dict(_block())) == {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
        "post_attention_layernorm.weight",
    }  # fmt: skip


# --- the NumPy reference -----------------------------------------------------------------------


def test_ref_rms_norm_and_silu_values():
    x = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(ref.rms_norm(x, np.ones(2), eps=1e-300), x / np.sqrt(12.5), rtol=1e-15)
    z = np.array([-1000.0, -1.0, 0.0, 1.0, 1000.0])
    np.testing.assert_allclose(ref.silu(z), z / (1 + np.exp(-np.clip(z, -700, 700))), atol=1e-300, rtol=1e-14)
    assert np.all(np.isfinite(ref.silu(z)))


def test_ref_modern_refuses_bad_inputs():
    with pytest.raises(ValueError, match=r"g must have shape \(d,\)"):
        ref.rms_norm(np.ones((2, 4)), np.ones(3))
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        ref.rms_norm(np.ones((2, 4)), np.ones(4), eps=0)
    with pytest.raises(TypeError, match="NumPy array"):
        ref.rms_norm(torch.ones(2, 4), np.ones(4))
    with pytest.raises(ValueError, match="W_gate must have shape"):
        ref.swiglu(np.ones((2, 4)), np.ones((3, 5)), np.ones((4, 5)), np.ones((5, 4)))
    with pytest.raises(ValueError, match="W_down shape"):
        ref.swiglu(np.ones((2, 4)), np.ones((4, 5)), np.ones((4, 5)), np.ones((4, 4)))
    params = modern.reference_params(_block())
    with pytest.raises(ValueError, match=r"missing \['g_q', 'g_k'\]"):
        ref.modern_block(np.ones((1, 2, 16)), params, 4, qk_norm=True)
    with pytest.raises(ValueError, match="divisible by n_heads=3"):
        ref.modern_block(np.ones((1, 2, 16)), params, 3)


# --- the experiment's arguments ----------------------------------------------------------------


def test_logit_growth_arguments_are_checked():
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        LogitGrowthConfig(lr=0.0)
    with pytest.raises(ValueError, match="steps must be > 0"):
        LogitGrowthConfig(steps=0)
    with pytest.raises(TypeError, match="qk_norm must be True or False"):
        train_logit_growth(LogitGrowthConfig(steps=1), qk_norm=1)
    with pytest.raises(TypeError, match="config must be a LogitGrowthConfig"):
        train_logit_growth({"steps": 1}, qk_norm=True)


def test_logit_growth_is_deterministic_and_shaped():
    config = LogitGrowthConfig(steps=3, batch=4, T=6)
    a = train_logit_growth(config, qk_norm=True, seed=1)
    b = train_logit_growth(config, qk_norm=True, seed=1)
    assert a.loss.shape == (3,) and a.max_logit.shape == a.bound.shape == (4,)
    np.testing.assert_array_equal(a.max_logit, b.max_logit)
    assert train_logit_growth(config, qk_norm=False, seed=1).bound is None
