"""KV cache: decoding one token at a time with the cache equals full causal attention, token by
token, for a small stack of causal self-attention layers built from the package's attention."""

import math

import pytest
import torch
from torch import nn

import selfattn
from selfattn.efficient import KVCache, cached_attention


class _CausalLayer(nn.Module):
    """Multi-head causal self-attention + residual, per-head W_Q/W_K/W_V of shape (H, D, Dh)."""

    def __init__(self, d_model, n_heads, g):
        super().__init__()
        d_head = d_model // n_heads
        std = 1 / math.sqrt(d_model)
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.randn(n_heads, d_model, d_head, generator=g) * std)
                                        for _ in range(3))
        self.W_O = nn.Parameter(torch.randn(n_heads * d_head, d_model, generator=g) * std)

    def qkv(self, X):
        # (B, T, D) @ (H, D, Dh) -> (B, H, T, Dh)
        return tuple(torch.einsum("btd,hde->bhte", X, W) for W in (self.W_Q, self.W_K, self.W_V))

    def merge(self, X, context):
        B, H, T, Dh = context.shape
        return X + context.transpose(1, 2).reshape(B, T, H * Dh) @ self.W_O  # (B, H, T, Dh) -> (B, T, D)

    def forward(self, X):
        q, k, v = self.qkv(X)
        return self.merge(X, selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(X.shape[1])))

    def step(self, X_new, cache):
        q, k, v = self.qkv(X_new)
        return self.merge(X_new, cached_attention(q, k, v, cache))


class _TinyDecoder(nn.Module):
    def __init__(self, vocab=11, d_model=16, n_heads=4, n_layers=3, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(vocab, d_model, generator=g))
        self.pos = nn.Parameter(torch.randn(64, d_model, generator=g) * 0.5)
        self.layers = nn.ModuleList(_CausalLayer(d_model, n_heads, g) for _ in range(n_layers))

    def forward(self, ids):  # full recomputation: logits (B, T, vocab)
        X = self.embed[ids] + self.pos[: ids.shape[1]]
        for layer in self.layers:
            X = layer(X)
        return X @ self.embed.T

    def step(self, ids_new, start, caches):  # only the new positions, with the caches
        X = self.embed[ids_new] + self.pos[start:start + ids_new.shape[1]]
        for layer, cache in zip(self.layers, caches, strict=True):
            X = layer.step(X, cache)
        return X @ self.embed.T


@torch.no_grad()
def test_cached_decoding_equals_full_recomputation_token_by_token():
    model = _TinyDecoder().double()
    prompt = torch.tensor([[1, 4, 2], [3, 3, 7]])
    caches = [KVCache() for _ in model.layers]
    ids = prompt
    logits = model.step(prompt, 0, caches)  # the prompt in one go: bottom-right == square causal
    for _ in range(8):
        full = model(ids)
        torch.testing.assert_close(logits, full[:, -logits.shape[1]:], atol=1e-12, rtol=1e-12)
        next_id = full[:, -1].argmax(-1, keepdim=True)  # greedy
        ids = torch.cat([ids, next_id], dim=1)
        logits = model.step(next_id, ids.shape[1] - 1, caches)
    assert all(len(c) == ids.shape[1] for c in caches)


def test_cached_attention_equals_last_rows_of_full_causal_attention():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    full = selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(9))
    cache = KVCache()
    cached_attention(q[..., :5, :], k[..., :5, :], v[..., :5, :], cache)
    for t in range(5, 9):  # one token at a time: mask causal_mask(1, t + 1, alignment="bottom_right")
        row = cached_attention(q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :], cache)
        torch.testing.assert_close(row, full[..., t:t + 1, :], atol=1e-14, rtol=0)


def test_cache_rejects_mismatched_shapes():
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="must match the cached"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(TypeError, match="k_new"):
        cache.append([1], torch.zeros(1))


def test_a_failed_call_leaves_the_cache_unchanged():
    # Regression: cached_attention appended before checking, so a call that raised had already grown
    # the cache (k by 3 positions, v by 2) and every later call failed.
    cache = KVCache()
    x = torch.randn(1, 1, 2, 4)
    cached_attention(x, x, x, cache)
    with pytest.raises(ValueError, match="same shape except the last axis"):
        cached_attention(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 2, 4), cache)
    with pytest.raises(ValueError, match="d_head"):  # q of the wrong width: fails inside the attention
        cached_attention(torch.randn(1, 1, 1, 5), torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4), cache)
    assert len(cache) == 2 and cache.v.shape[-2] == 2
    y = torch.randn(1, 1, 1, 4)
    out = cached_attention(y, y, y, cache)  # still usable, and still right
    full = torch.cat([x, y], dim=-2)
    expected = selfattn.scaled_dot_product_attention(full, full, full, selfattn.causal_mask(3))[..., 2:, :]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert len(cache) == 3


def test_more_new_queries_than_new_keys_is_an_error_not_zero_rows():
    # Regression: q_new with 5 rows and k_new with 1 gave 4 silent zero rows (no key visible to them).
    with pytest.raises(ValueError, match="q_new and k_new must hold the same new positions"):
        cached_attention(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), KVCache())


def test_cache_rejects_a_dtype_change():
    # Regression: appending float64 to a float32 cache silently promoted the whole cache.
    cache = KVCache()
    cache.append(torch.zeros(1, 3, 4), torch.zeros(1, 3, 4))
    with pytest.raises(TypeError, match="cache's dtype torch.float32"):
        cache.append(torch.zeros(1, 1, 4, dtype=torch.float64), torch.zeros(1, 1, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="one dtype"):
        cache.append(torch.zeros(1, 1, 4), torch.zeros(1, 1, 4, dtype=torch.float64))
    assert cache.k.dtype == torch.float32 and len(cache) == 3


def test_no_new_position_is_an_error_that_names_q_new():
    # Regression: T_new = 0 failed inside causal_mask with "T must be > 0; got 0".
    cache = KVCache()
    x = torch.randn(1, 1, 0, 4)
    with pytest.raises(ValueError, match=r"q_new, k_new and v_new must hold at least one new position \(T_new > 0\)"):
        cached_attention(x, x, x, cache)
    assert len(cache) == 0


@pytest.mark.parametrize("cache", [None, {}, [torch.zeros(1, 1, 2, 4)]])
def test_a_cache_that_is_not_a_kvcache_is_refused_by_name(cache):
    # Regression: cache=None raised AttributeError ('NoneType' object has no attribute 'extended').
    x = torch.randn(1, 1, 2, 4)
    with pytest.raises(TypeError, match=rf"cache must be a selfattn.efficient.KVCache .*got {type(cache).__name__}"):
        cached_attention(x, x, x, cache)
