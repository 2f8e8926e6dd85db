"""selfattn.gqa against the grouped-query attention of a transformers Llama layer (random weights,
nothing downloaded): its repeat_kv equals ours exactly, and a whole LlamaAttention layer with
num_key_value_heads < num_attention_heads equals GroupedQueryAttention with the same weights. Llama's
eager softmax runs in float32 whatever the input dtype, so the layer is compared at 1e-6 in float64
(the rotation is made the identity: cos = 1, sin = 0)."""

from __future__ import annotations

import pytest
import torch

import selfattn
from selfattn.gqa import GQAConfig, GroupedQueryAttention, repeat_kv

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaAttention  # noqa: E402
from transformers.models.llama.modeling_llama import repeat_kv as hf_repeat_kv  # noqa: E402


@pytest.mark.parametrize("n_rep", [1, 2, 4])
def test_repeat_kv_equals_transformers(n_rep):
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(n_rep))
    assert torch.equal(repeat_kv(x, n_rep), hf_repeat_kv(x, n_rep))


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4, 8])
def test_llama_attention_layer_equals_grouped_query_attention(n_kv_heads):
    D, H, T = 64, 8, 9
    config = transformers.LlamaConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=n_kv_heads,
                                      head_dim=D // H, attention_bias=False, attention_dropout=0.0)  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    llama = LlamaAttention(config, layer_idx=0).double().eval()
    ours = GroupedQueryAttention(GQAConfig(D, H, n_kv_heads, bias=False)).double().eval()
    with torch.no_grad():  # nn.Linear stores (out, in); we store (in, out)
        ours.W_Q.copy_(llama.q_proj.weight.T)
        ours.W_K.copy_(llama.k_proj.weight.T)
        ours.W_V.copy_(llama.v_proj.weight.T)
        ours.W_O.copy_(llama.o_proj.weight.T)
    x = torch.randn(2, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    identity = (torch.ones(2, T, D // H, dtype=torch.float64), torch.zeros(2, T, D // H, dtype=torch.float64))
    causal = torch.zeros(T, T, dtype=torch.float64).masked_fill(~selfattn.causal_mask(T), float("-inf"))
    with torch.no_grad():
        theirs, _ = llama(x, position_embeddings=identity, attention_mask=causal[None, None])
        mine = ours(x, mask=selfattn.causal_mask(T))
    assert (mine - theirs).abs().max().item() < 1e-6
