"""The modern block's parts against Hugging Face's Llama implementation, PyTorch's own RMSNorm and
the NumPy reference: forward and backward, float64 (chapter 07, claim 29)."""

import numpy as np
import pytest
import torch

import selfattn
from selfattn import modern, ref

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm  # noqa: E402

D, H, F, EPS = 24, 3, 56, 1e-5


def _llama_config():
    config = LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=H, num_key_value_heads=H,
                         num_hidden_layers=1, vocab_size=32, rms_norm_eps=EPS)  # fmt: skip
    config._attn_implementation = "sdpa"  # PyTorch's SDPA computes in float64; Llama's eager path uses float32
    return config


def _gain(d, seed):
    return 1 + 0.3 * torch.randn(d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(1, 1, D), (3, 7, D), (D,)])
def test_rms_norm_matches_torch_and_the_reference(shape):
    x = 5 * torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ours = modern.RMSNorm(D, EPS).double()
    theirs = torch.nn.RMSNorm(D, eps=EPS, dtype=torch.float64)
    with torch.no_grad():
        ours.weight.copy_(_gain(D, 1))
        theirs.weight.copy_(ours.weight)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out1, out2 = ours(x1), theirs(x2)
    torch.testing.assert_close(out1, out2, atol=1e-12, rtol=0)  # measured: 0
    np.testing.assert_allclose(out1.detach().numpy(), ref.rms_norm(x.numpy(), ours.weight.detach().numpy(), EPS),
                               atol=1e-12, rtol=0)  # fmt: skip
    grad_out = torch.randn_like(out1)
    out1.backward(grad_out)
    out2.backward(grad_out)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, atol=1e-12, rtol=0)


def test_rms_norm_matches_llama_in_float32_and_differs_in_float64_only_by_its_float32_upcast():
    x = 3 * torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ours, llama = modern.RMSNorm(D, EPS), LlamaRMSNorm(D, eps=EPS)
    with torch.no_grad():
        ours.weight.copy_(_gain(D, 3).float())
    llama.load_state_dict(ours.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(x.float()), llama(x.float()), atol=1e-6, rtol=0)  # measured: 0
        ours64, llama64 = ours.double(), llama.double()
        diff = (ours64(x) - llama64(x)).abs().max()
        assert 0 < diff < 1e-5  # float32 rounding (measured 2e-7), not a different formula:
        unit32 = modern.RMSNorm(D, EPS)(x.float()).double()
        assert torch.equal(llama64(x), llama64.weight * unit32)


def test_swiglu_matches_llama_mlp_forward_and_backward():
    ours = modern.SwiGLU(D, F).double()
    llama = LlamaMLP(_llama_config()).double()
    llama.load_state_dict(ours.state_dict())  # the same parameter names
    x = torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out1, out2 = ours(x1), llama(x2)
    torch.testing.assert_close(out1, out2, atol=1e-12, rtol=0)
    W = [lin.weight.detach().T.numpy() for lin in (ours.gate_proj, ours.up_proj, ours.down_proj)]
    np.testing.assert_allclose(out1.detach().numpy(), ref.swiglu(x.numpy(), *W), atol=1e-12, rtol=0)
    (out1**2).sum().backward()
    (out2**2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-12, rtol=0)
    for name in ("gate_proj", "up_proj", "down_proj"):
        torch.testing.assert_close(getattr(ours, name).weight.grad, getattr(llama, name).weight.grad,
                                   atol=1e-12, rtol=0)  # fmt: skip


def test_modern_block_matches_llama_decoder_layer_forward_and_backward():
    torch.manual_seed(5)
    block = modern.ModernBlock(modern.ModernBlockConfig(D, H, F, norm_eps=EPS)).double().eval()
    with torch.no_grad():
        block.norm1.weight.copy_(_gain(D, 6))
        block.norm2.weight.copy_(_gain(D, 7))
    layer = LlamaDecoderLayer(_llama_config(), layer_idx=0).double().eval()
    layer.load_state_dict(modern.llama_state_dict(block), strict=True)
    for name in ("input_layernorm", "post_attention_layernorm"):  # float64 norm, same gain (Llama's is float32)
        exact = torch.nn.RMSNorm(D, eps=EPS, dtype=torch.float64)
        exact.load_state_dict(getattr(layer, name).state_dict())
        setattr(layer, name, exact)
    B, T = 2, 7
    keep = selfattn.causal_mask(T)
    additive = torch.zeros(T, T, dtype=torch.float64).masked_fill(~keep, float("-inf")).expand(B, 1, T, T)
    rotation = (torch.ones(B, T, D // H, dtype=torch.float64), torch.zeros(B, T, D // H, dtype=torch.float64))
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out1 = block(x1, keep)
    out2 = layer(x2, attention_mask=additive, position_embeddings=rotation)
    out2 = out2[0] if isinstance(out2, tuple) else out2
    torch.testing.assert_close(out1, out2, atol=1e-12, rtol=0)  # measured: about 1e-15
    out1.sum().backward()
    out2.sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(block.attn.W_Q.grad, layer.self_attn.q_proj.weight.grad.T, atol=1e-12, rtol=0)


def test_llama_state_dict_refuses_qk_norm():
    block = modern.ModernBlock(modern.ModernBlockConfig(D, H, F, qk_norm=True))
    with pytest.raises(ValueError, match="QK-norm"):
        modern.llama_state_dict(block)
