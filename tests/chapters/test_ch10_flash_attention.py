"""Claim of chapter 10 (FlashAttention from first principles), against independent oracles.

Claim 17: tiled attention with an online softmax gives the same result (output, log-sum-exp and
gradients; against the NumPy reference and the plain torch path) with memory linear in length.
"""

from __future__ import annotations

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
