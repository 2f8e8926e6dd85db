"""Unit tests for selfattn.block (FeedForward, BlockConfig, the pre- and post-norm blocks) and for
the NumPy reference functions of selfattn.ref.block. Blocks against the NumPy reference:
tests/parity/test_parity_mha.py. Tolerances: float64 1e-12 unless stated."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn import (
    BlockConfig,
    FeedForward,
    MultiHeadAttention,
    PostNormTransformerBlock,
    TransformerBlock,
    causal_mask,
    ref,
)

TOL64 = dict(rtol=0.0, atol=1e-12)
CFG = BlockConfig(d_model=12, n_heads=3, d_ff=20)
BLOCKS = [TransformerBlock, PostNormTransformerBlock]


def _block(cls, cfg=CFG, seed=0):
    torch.manual_seed(seed)
    return cls(cfg).double().eval()


# --- config and feed-forward ---------------------------------------------------------------------


def test_block_config_validation():
    assert CFG.d_head == 4 and CFG.mha_config.d_model == 12 and CFG.mha_config.bias
    with pytest.raises(ValueError, match="d_model=10 must be divisible by n_heads=3"):
        BlockConfig(10, 3, 8)
    with pytest.raises(ValueError, match="d_ff must be > 0"):
        BlockConfig(12, 3, 0)
    with pytest.raises(ValueError, match="dropout must be in"):
        BlockConfig(12, 3, 8, dropout=-0.1)
    with pytest.raises(ValueError, match="layer_norm_eps must be a number > 0"):
        BlockConfig(12, 3, 8, layer_norm_eps=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.d_ff = 4
    with pytest.raises(TypeError, match="config must be a BlockConfig"):
        TransformerBlock(CFG.mha_config)


def test_feed_forward_is_linear_exact_gelu_linear():
    torch.manual_seed(0)
    ffn = FeedForward(12, 20).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64) * 2
    hidden = x @ ffn.linear1.weight.T + ffn.linear1.bias
    exact = hidden * 0.5 * (1 + torch.erf(hidden / math.sqrt(2)))  # x Phi(x)
    torch.testing.assert_close(ffn(x), exact @ ffn.linear2.weight.T + ffn.linear2.bias, **TOL64)
    tanh_approx = F.gelu(hidden, approximate="tanh") @ ffn.linear2.weight.T + ffn.linear2.bias
    assert (ffn(x) - tanh_approx).abs().max() > 1e-6  # the tanh approximation is not BERT's gelu


def test_feed_forward_acts_on_each_position_separately():
    torch.manual_seed(0)
    ffn = FeedForward(12, 20).double()
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    changed = x.clone()
    changed[:, 3] += 1.0
    torch.testing.assert_close(ffn(changed)[:, :3], ffn(x)[:, :3], **TOL64)


def test_feed_forward_bad_inputs():
    with pytest.raises(ValueError, match="d_ff must be > 0"):
        FeedForward(12, 0)
    ffn = FeedForward(12, 20)
    with pytest.raises(ValueError, match="x must have last dim d_model=12"):
        ffn(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\)"):
        ffn(torch.randn(3, 12))


# --- the two blocks ------------------------------------------------------------------------------


def _zero_branches(block):
    """Make both branches output exactly zero: W_O, b_O and the second linear layer."""
    with torch.no_grad():
        for p in (block.attn.W_O, block.attn.b_O, block.ffn.linear2.weight, block.ffn.linear2.bias):
            p.zero_()


def test_pre_norm_block_with_zero_branches_is_the_identity():
    block = _block(TransformerBlock)
    _zero_branches(block)
    x = torch.randn(2, 5, 12, dtype=torch.float64) * 3
    torch.testing.assert_close(block(x), x, **TOL64)  # the residual stream passes through


def test_post_norm_block_with_zero_branches_normalizes_twice():
    block = _block(PostNormTransformerBlock)
    _zero_branches(block)
    x = torch.randn(2, 5, 12, dtype=torch.float64) * 3 + 1
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    once = (x - mean) / torch.sqrt(var + 1e-5)  # ln1 with gamma 1, beta 0
    var1 = once.var(-1, unbiased=False, keepdim=True)
    twice = (once - once.mean(-1, keepdim=True)) / torch.sqrt(var1 + 1e-5)
    torch.testing.assert_close(block(x), twice, rtol=0, atol=1e-10)


def test_pre_and_post_norm_share_parameters_but_differ():
    pre, post = _block(TransformerBlock), _block(PostNormTransformerBlock, seed=1)
    post.load_state_dict(pre.state_dict(), strict=True)  # same parts, same names
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out_pre, w_pre = pre(x, return_weights=True)
    out_post = post(x)
    assert w_pre.shape == (2, 3, 5, 5)
    assert torch.isfinite(out_pre).all() and torch.isfinite(out_post).all()
    assert (out_pre - out_post).abs().max() > 0.1


@pytest.mark.parametrize("cls", BLOCKS)
def test_regression_block_dropout_only_in_training(cls):
    block = _block(cls, BlockConfig(12, 3, 20, dropout=0.5))
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    torch.testing.assert_close(block(x), block(x), rtol=0, atol=0)
    plain = _block(cls)
    plain.load_state_dict(block.state_dict())
    torch.testing.assert_close(block(x), plain(x), **TOL64)
    block.train()
    torch.manual_seed(3)
    assert (block(x) - plain(x)).abs().max() > 1e-3


@pytest.mark.parametrize("cls", BLOCKS)
def test_block_bad_inputs_name_the_argument(cls):
    block = _block(cls)
    with pytest.raises(
        ValueError, match=r"x must have shape \(B, T, D\) \(3 dims\); got shape \(5, 12\)"
    ):
        block(torch.randn(5, 12, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must have last dim d_model=12; got shape"):
        block(torch.randn(2, 5, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        block(torch.randn(2, 5, 12, dtype=torch.float64), torch.ones(5, 5, dtype=torch.float64))


# --- properties (hypothesis) --------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 7), seed=st.integers(0, 2**16), post=st.booleans())
def test_property_block_without_positions_is_permutation_equivariant(T, seed, post):
    """Without positional information, permuting the input positions permutes the output."""
    block = _block(BLOCKS[post])
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, 12, generator=g, dtype=torch.float64)
    perm = torch.randperm(T, generator=g)
    out, weights = block(x, return_weights=True)
    out_p, weights_p = block(x[:, perm], return_weights=True)
    torch.testing.assert_close(out_p, out[:, perm], rtol=0, atol=1e-10)
    torch.testing.assert_close(weights_p, weights[:, :, perm][..., perm], rtol=0, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 7), seed=st.integers(0, 2**16), which=st.integers(0, 2))
def test_property_causal_mask_isolates_gradients(T, seed, which):
    """No gradient reaches query position i from key positions j > i that it may not see."""
    torch.manual_seed(0)
    module = [_block(TransformerBlock), _block(PostNormTransformerBlock), _mha()][which]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, 12, generator=g, dtype=torch.float64, requires_grad=True)
    i = int(torch.randint(0, T, (1,), generator=g))
    out = module(x, mask=causal_mask(T))
    probe = torch.randn(12, generator=g, dtype=torch.float64)  # a layer norm's outputs sum to 0:
    (grad,) = torch.autograd.grad(out[0, i] @ probe, x)  # probe a random direction instead
    assert torch.isfinite(grad).all()
    assert torch.all(grad[0, i + 1 :] == 0)  # exactly zero from the future
    assert grad[0, : i + 1].abs().sum() > 0  # and the visible past does matter


def _mha():
    from selfattn import MHAConfig

    return MultiHeadAttention(MHAConfig(12, 3)).double().eval()


# --- the NumPy reference ----------------------------------------------------------------------


def test_ref_layer_norm_and_gelu_match_torch():
    rng = np.random.default_rng(0)
    x, gamma, beta = rng.normal(size=(3, 4, 8)) * 3, rng.normal(size=8), rng.normal(size=8)
    expected = F.layer_norm(
        torch.tensor(x), (8,), torch.tensor(gamma), torch.tensor(beta), eps=1e-6
    )
    np.testing.assert_allclose(
        ref.layer_norm(x, gamma, beta, 1e-6), expected.numpy(), rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(ref.gelu(x), F.gelu(torch.tensor(x)).numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ref.gelu([0.0, 10.0, -10.0]), [0.0, 10.0, 0.0], rtol=0, atol=1e-12)


def test_ref_block_and_multihead_bad_inputs():
    x = np.zeros((1, 3, 8))
    with pytest.raises(ValueError, match="gamma must have shape"):
        ref.layer_norm(x, np.ones(4), np.zeros(8))
    with pytest.raises(ValueError, match="params is missing"):
        ref.post_norm_block(x, {"W_Q": np.eye(8)}, 2)
    W = np.eye(8)
    with pytest.raises(ValueError, match="d_model=8 must be divisible by n_heads=3"):
        ref.multi_head_attention(x, x, W, W, W, W, 3)
    with pytest.raises(ValueError, match="W_O must have shape"):
        ref.multi_head_attention(x, x, W, W, W, np.eye(4), 2)
    with pytest.raises(ValueError, match=r"X_q must have shape \(B, T, D\)"):
        ref.multi_head_attention(x[0], x, W, W, W, W, 2)


@pytest.mark.parametrize("bad", [float("inf"), True, "1e-5", 0, -1e-5, float("nan")])
def test_config_refuses_a_layer_norm_eps_that_is_not_a_finite_positive_number(bad):
    # Regression: inf and True were accepted.
    error = TypeError if isinstance(bad, (bool, str)) else ValueError
    with pytest.raises(error, match=r"layer_norm_eps must be a number > 0 and finite; got"):
        BlockConfig(12, 3, 8, layer_norm_eps=bad)


@pytest.mark.parametrize("bad", ["0.1", None, 1.0])
def test_config_refuses_a_bad_dropout_at_construction(bad):
    error = ValueError if bad == 1.0 else TypeError
    with pytest.raises(error, match=r"dropout must be"):
        BlockConfig(12, 3, 8, dropout=bad)


@pytest.mark.parametrize("cls", BLOCKS + [None])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_input_of_another_dtype_than_the_parameters_is_refused_by_name(cls, dtype):
    # Regression: float64 or int input to a float32 block failed inside layer norm or matmul
    # ("mixed dtype (CPU): all inputs must share same datatype").
    module = FeedForward(12, 20) if cls is None else cls(CFG)
    with pytest.raises(TypeError, match=rf"x must have the dtype of the module's parameters, "
                                        rf"torch.float32; got dtype {dtype}"):
        module(torch.ones(2, 5, 12, dtype=dtype))


@pytest.mark.parametrize("cls", BLOCKS)
def test_no_position_names_x_with_its_shape(cls):
    # Regression: T = 0 raised an error naming x_q, an argument of the attention layer inside.
    with pytest.raises(ValueError, match=r"x must hold at least one position \(T > 0\) in \(B, T, D\); got shape \(2, 0, 12\)"):
        _block(cls)(torch.zeros(2, 0, 12, dtype=torch.float64))
