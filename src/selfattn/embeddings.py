"""Token embeddings: the context-free table lookup, and BERT's input embeddings.

A token embedding is a row of a (V, D) table chosen by the token's id: the same token gets the
same vector in every sentence (claim 1, chapter 01). BERT adds a learned vector per position
and per segment ("token type") and normalizes the sum (Devlin et al. 2019, section 3, figure 2);
without the position term, attention could not tell word order (chapter 07).
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import (
    require_positive_int,
    require_probability,
    require_rank,
    require_tensor,
    shape_of,
)

__all__ = ["TokenEmbedding", "BertEmbeddings"]


def _require_ids(name: str, ids, upper: int, what: str) -> None:
    """``ids`` must be a (B, T) integer tensor with values in [0, upper)."""
    require_tensor(name, ids)
    require_rank(name, ids, 2, "(B, T)")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an int64 or int32 tensor; got dtype {ids.dtype}")
    # Not while torch.compile traces: reading min and max is a device-to-host sync and a graph break
    # (an id out of range still fails, in the lookup itself).
    if ids.numel() and not torch.compiler.is_compiling() and (int(ids.min()) < 0 or int(ids.max()) >= upper):
        raise ValueError(
            f"{name} must be in [0, {what}={upper}); got min {int(ids.min())}, max {int(ids.max())} "
            f"in a tensor of shape {shape_of(ids)}"
        )


class TokenEmbedding(nn.Module):
    """The lookup ``E[input_ids]`` in a learned (V, D) table ``weight``.

    Args:
        vocab_size: V (> 0). d_model: D (> 0).

    Shapes:
        forward(input_ids: (B, T) int64) -> (B, T, D).

    Raises:
        TypeError: ids not an integer tensor. ValueError: not (B, T), or an id outside [0, V).

    Source: chapter 01 (claim 1: an embedding lookup is context-free).
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.vocab_size = require_positive_int("vocab_size", vocab_size)
        self.d_model = require_positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * 0.02)  # BERT's init std

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        _require_ids("input_ids", input_ids, self.vocab_size, "vocab_size")
        return self.weight[input_ids]  # (B, T) -> (B, T, D)


class BertEmbeddings(nn.Module):
    """BERT's input: ``LayerNorm(E_token[ids] + E_position[0..T-1] + E_type[token_type_ids])``.

    Args:
        vocab_size: V. d_model: D. max_positions: the longest T (> 0).
        type_vocab_size: number of segments (2 in BERT). layer_norm_eps: > 0 (1e-12 in BERT).
        dropout: probability in [0, 1) on the output, training mode only.

    Shapes:
        forward(input_ids: (B, T) int, token_type_ids: (B, T) int or None meaning all 0)
        -> (B, T, D) in the parameters' dtype.

    Raises:
        TypeError / ValueError: bad sizes; ids that are not (B, T) integer tensors or lie outside
        their table; T > max_positions; token_type_ids of another shape than input_ids.

    Source: Devlin et al. 2019, section 3.1; chapter 07.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        max_positions: int,
        type_vocab_size: int = 2,
        layer_norm_eps: float = 1e-12,
        dropout: float = 0.0,
    ):
        super().__init__()
        require_positive_int("max_positions", max_positions)
        require_positive_int("type_vocab_size", type_vocab_size)
        require_probability("dropout", dropout)
        if not layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0; got {layer_norm_eps!r}")
        self.token = TokenEmbedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model)
        self.token_type = nn.Embedding(type_vocab_size, d_model)
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.token(input_ids)  # (B, T) -> (B, T, D); validates input_ids
        T = input_ids.shape[1]
        if T > self.position.num_embeddings:
            raise ValueError(
                f"input_ids has T={T} positions; at most max_positions={self.position.num_embeddings}"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        _require_ids(
            "token_type_ids", token_type_ids, self.token_type.num_embeddings, "type_vocab_size"
        )
        if token_type_ids.shape != input_ids.shape:
            raise ValueError(
                f"token_type_ids must have the shape of input_ids {shape_of(input_ids)}; "
                f"got {shape_of(token_type_ids)}"
            )
        positions = torch.arange(T, device=input_ids.device)  # (T,): 0, 1, ..., T-1
        x = (
            x + self.position(positions) + self.token_type(token_type_ids)
        )  # (B, T, D) + (T, D) + (B, T, D)
        return self.dropout(self.layer_norm(x))
