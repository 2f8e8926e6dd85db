"""Trained sparse attention: DeepSeek-V3.2's lightning indexer and top-k key selection.

A small "indexer" scores every (query, key) pair cheaply, ``I[t, s] = sum_j w[t, j] ReLU(q[t, j] .
k[s])`` over a few indexer heads j, each query keeps its ``k`` best-scored earlier keys, and the main
attention (MLA in DeepSeek-V3.2) runs over those keys only. Beside it, for comparison, the fixed
patterns of chapter 09's kind: a local window plus strided keys (Child et al. 2019), chosen by
position alone.

Source: DeepSeek-AI 2025 (DeepSeek-V3.2), section 2.1 (DeepSeek Sparse Attention, eq. 1); the
indexer of ``transformers``' ``DeepseekV32Indexer``; chapter 11b.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._validate import require_positive_int, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..positions import apply_rope

__all__ = [
    "LightningIndexer",
    "topk_keep",
    "window_strided_keep",
    "sparse_attention",
    "selection_costs",
    "needle_case",
]


class LightningIndexer(nn.Module):
    """DeepSeek-V3.2's indexer: ``n_index_heads`` (Hi) small query heads of width ``index_head_dim``
    (Di) against one shared key per token, ReLU, weighted per head and summed.

    ``q[t, j] = (c_Q[t] W_IQ)_j`` from the query's latent ``c_Q`` (B, T, Rq); ``k[s] = LayerNorm(x[s]
    W_IK)``; the first ``rope_dim`` features of both are rotated by RoPE (pairs (i, i + rope_dim/2));
    ``w[t] = (x[t] W_w) / sqrt(Hi)``; ``I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s] / sqrt(Di))``.

    Shapes:
        forward(x (B, T, D), q_latent (B, T, Rq)) -> index scores (B, T, T), float32 or the input's
        wider dtype, ``-inf`` where the key lies in the query's future.

    Raises:
        TypeError / ValueError: sizes not positive ints, ``rope_dim`` odd or above Di; at call time
        inputs of the wrong shapes.

    Source: DeepSeek-V3.2, section 2.1, eq. 1; ``transformers`` ``DeepseekV32Indexer`` (which this
    matches, parity-tested); chapter 11b.
    """

    def __init__(self, d_model: int, q_lora_rank: int, n_index_heads: int, index_head_dim: int, rope_dim: int,
                 *, rope_base: float = 10000.0):
        super().__init__()
        self.d_model = require_positive_int("d_model", d_model)
        self.q_lora_rank = require_positive_int("q_lora_rank", q_lora_rank)
        self.n_index_heads = require_positive_int("n_index_heads", n_index_heads)
        self.index_head_dim = require_positive_int("index_head_dim", index_head_dim)
        self.rope_dim = require_positive_int("rope_dim", rope_dim)
        if rope_dim % 2 or rope_dim > index_head_dim:
            raise ValueError(f"rope_dim must be even and at most index_head_dim={index_head_dim}; got {rope_dim}")
        self.rope_base = rope_base
        Hi, Di = n_index_heads, index_head_dim
        self.W_IQ = nn.Parameter(torch.randn(q_lora_rank, Hi * Di) / math.sqrt(q_lora_rank))
        self.W_IK = nn.Parameter(torch.randn(d_model, Di) / math.sqrt(d_model))
        self.k_norm = nn.LayerNorm(Di, eps=1e-6)
        self.W_w = nn.Parameter(torch.randn(d_model, Hi) / math.sqrt(d_model))
        self.activation = torch.relu  # DeepSeek-V3.2's choice (for throughput); the tests swap it to show it matters

    def _rope_front(self, x, positions):
        front, back = x.split([self.rope_dim, self.index_head_dim - self.rope_dim], dim=-1)
        return torch.cat([apply_rope(front, positions, base=self.rope_base, layout="half"), back], dim=-1)

    def forward(self, x: torch.Tensor, q_latent: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x)
        require_tensor("q_latent", q_latent)
        if x.ndim != 3 or x.shape[-1] != self.d_model or q_latent.shape != (*x.shape[:2], self.q_lora_rank):
            raise ValueError(f"x must be (B, T, D={self.d_model}) and q_latent (B, T, Rq={self.q_lora_rank}); got "
                             f"{shape_of(x)} and {shape_of(q_latent)}")
        B, T, _ = x.shape
        Hi, Di = self.n_index_heads, self.index_head_dim
        positions = torch.arange(T)
        q = (q_latent @ self.W_IQ).view(B, T, Hi, Di).transpose(1, 2)  # (B, Hi, T, Di)
        q = self._rope_front(q, positions)
        k = self._rope_front(self.k_norm(x @ self.W_IK), positions)  # (B, T, Di): one key per token
        work = torch.promote_types(x.dtype, torch.float32)
        scores = self.activation(q.to(work) @ k.to(work)[:, None].transpose(-1, -2) / math.sqrt(Di))  # (B, Hi, T, T)
        w = (x @ self.W_w).to(work) / math.sqrt(Hi)  # (B, T, Hi): each query weighs its indexer heads
        index = torch.einsum("bth,bhts->bts", w, scores)  # (B, T, T)
        return index.masked_fill(~causal_mask(T), float("-inf"))

    @classmethod
    def from_hf(cls, indexer, *, rope_base: float = 10000.0) -> LightningIndexer:
        """Copy a ``transformers`` ``DeepseekV32Indexer``: ``wq_b`` -> ``W_IQ``, ``wk`` -> ``W_IK``,
        ``k_norm`` -> ``k_norm``, ``weights_proj`` -> ``W_w`` (``nn.Linear`` weights transposed)."""
        mine = cls(indexer.hidden_size, indexer.q_lora_rank, indexer.n_heads, indexer.head_dim,
                   indexer.qk_rope_head_dim, rope_base=rope_base)
        with torch.no_grad():
            mine.W_IQ.data = indexer.wq_b.weight.detach().T.clone()
            mine.W_IK.data = indexer.wk.weight.detach().T.clone()
            mine.W_w.data = indexer.weights_proj.weight.detach().T.clone()
            mine.k_norm.load_state_dict(indexer.k_norm.state_dict())
        return mine.to(indexer.wk.weight.dtype)


def topk_keep(index_scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep-mask (..., T, S) of each query's ``k`` highest-scored keys among those it may see (scores
    ``-inf`` where it may not); a query that sees fewer than ``k`` keys keeps all of them.

    Raises:
        TypeError / ValueError: ``index_scores`` not a floating tensor of rank >= 2, ``k`` not a positive int.

    Source: DeepSeek-V3.2, section 2.1 (top-k selector); chapter 11b.
    """
    require_tensor("index_scores", index_scores)
    k = require_positive_int("k", k)
    if index_scores.ndim < 2 or not index_scores.dtype.is_floating_point:
        raise ValueError(f"index_scores must be a floating (..., T, S) tensor; got {shape_of(index_scores)} {index_scores.dtype}")
    k = min(k, index_scores.shape[-1])
    chosen = index_scores.topk(k, dim=-1).indices  # (..., T, k)
    keep = torch.zeros_like(index_scores, dtype=torch.bool).scatter(-1, chosen, True)
    return keep & torch.isfinite(index_scores)  # never a key the query may not see


def window_strided_keep(T: int, window: int, stride: int) -> torch.Tensor:
    """Causal keep-mask (T, T) of a fixed pattern: the ``window`` most recent keys (itself included)
    and every key at a position that is a multiple of ``stride`` (Child et al. 2019's strided
    pattern, with chapter 09's window). Chosen by position alone.

    Raises:
        TypeError / ValueError: arguments not positive ints.

    Source: Child et al. 2019, section 4.2; chapter 09's sliding window; chapter 11b.
    """
    T, window, stride = (require_positive_int(n, v) for n, v in (("T", T), ("window", window), ("stride", stride)))
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, 1), (1, T)
    return (j <= i) & ((i - j < window) | (j % stride == 0))


def sparse_attention(q, k, v, keep, *, scale: float | None = None):
    """Attention over the kept keys only: ``selfattn.scaled_dot_product_attention`` with ``keep``
    (True = may attend) ANDed with the causal mask. q, k, v: (..., T, Dh); keep broadcastable to
    (..., T, T). Raises as that function does. Source: chapter 11b."""
    T = q.shape[-2]
    return scaled_dot_product_attention(q, k, v, keep & causal_mask(T, k.shape[-2]), scale=scale)


def selection_costs(T: int, *, k: int, n_heads: int, d_qk: int, d_v: int, n_index_heads: int, index_head_dim: int,
                    cache_numbers: int, bytes_per_number: float = 2, index_bytes_per_number: float = 1) -> dict:
    """FLOPs and bytes read per layer for the last query of a T-token sequence (a decode step), for
    dense attention, an indexer's top-k and a fixed pattern of k keys.

    Dense: ``2 T H (d_qk + d_v)`` FLOPs, reading ``T x cache_numbers`` numbers. Top-k: the indexer,
    ``2 T Hi Di`` (+ ``T Hi`` for the weighted sum), reading ``T`` indexer keys of ``Di`` numbers at
    ``index_bytes_per_number`` (FP8 in DeepSeek-V3.2: 1 byte), then attention over ``min(k, T)``
    keys. Fixed: attention over ``min(k, T)`` keys, nothing else.

    Returns: dict ``{"dense": (flops, bytes), "topk": (...), "fixed": (...)}``.

    Raises: TypeError / ValueError: sizes not positive ints.

    Source: counted from the definitions above; DeepSeek-V3.2, section 2.1 (O(L^2) indexer, O(L k)
    main attention); chapter 11b.
    """
    T, k = require_positive_int("T", T), require_positive_int("k", k)
    H, dqk, dv, Hi, Di = (require_positive_int(n, x) for n, x in (("n_heads", n_heads), ("d_qk", d_qk), ("d_v", d_v),
                          ("n_index_heads", n_index_heads), ("index_head_dim", index_head_dim)))
    kk = min(k, T)
    attend = 2 * H * (dqk + dv)
    dense = (attend * T, T * cache_numbers * bytes_per_number)
    index = (2 * T * Hi * Di + T * Hi, T * Di * index_bytes_per_number)
    fixed = (attend * kk, kk * cache_numbers * bytes_per_number)
    return {"dense": dense, "topk": (index[0] + fixed[0], index[1] + fixed[1]), "fixed": fixed}


def needle_case(T: int = 256, needle: int = 40, d_head: int = 16, *, strength: float = 3.0, seed: int = 0):
    """A retrieval case for the last query: random unit-scale queries, keys and values (one head,
    float64) and one key far back, at ``needle``, aligned with the last query so that dense attention
    reads mostly its value.

    Returns: ``(q, k, v)`` each (1, T, d_head).

    Raises: TypeError / ValueError: sizes not positive ints, ``needle`` not below T - 1.

    Source: chapter 11b (the needle-in-a-haystack probe, as chapter 11's retrieval probe).
    """
    T, d_head = require_positive_int("T", T), require_positive_int("d_head", d_head)
    if isinstance(needle, bool) or not isinstance(needle, int) or not 0 <= needle < T - 1:
        raise ValueError(f"needle must be an int in [0, T - 1) = [0, {T - 1}); got {needle!r}")
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, d_head, generator=g, dtype=torch.float64) for _ in range(3))
    k[0, needle] = strength * q[0, -1] / q[0, -1].norm() * math.sqrt(d_head)  # score ~ strength * |q| sqrt(Dh) / sqrt(Dh)
    return q, k, v
