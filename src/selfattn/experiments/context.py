"""Is it attention that brings context into a token's vector? An intervention on the real model.

:func:`run_reading_only_itself` runs all-MiniLM-L6-v2 (the package's encoder with its real
weights) with one change in the forward pass: every attention layer gets a diagonal keep-mask, so
each position may read only itself (its weights are the identity matrix). Everything else (the
embeddings with their positions, W_V and W_O, the residual connections, the layer norms, the
feed-forward networks) runs unchanged, and all of it works on one position at a time. So if
context reaches a token's vector through attention and nowhere else, the intervened model gives a
token at a given position the same vector in every sentence. Source: chapter 01 (claim 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..pretrained import MiniLM, TokenBatch

__all__ = ["SelfOnlyRun", "run_reading_only_itself"]


@dataclass(frozen=True)
class SelfOnlyRun:
    """What :func:`run_reading_only_itself` returns.

    Attributes:
        batch: the :class:`~selfattn.pretrained.TokenBatch` (padded to the longest sentence).
        hidden_states: n_layers + 1 tensors (B, T, D) float32: the embeddings, then every layer.
        weights: n_layers tensors (B, H, T, T) of attention weights (the identity, by construction).
    """

    batch: TokenBatch
    hidden_states: tuple[torch.Tensor, ...]
    weights: tuple[torch.Tensor, ...]


def run_reading_only_itself(minilm: MiniLM, sentences: str | Sequence[str]) -> SelfOnlyRun:
    """Run MiniLM with every attention layer allowed to read only the query's own position.

    Args:
        minilm: a :class:`~selfattn.pretrained.MiniLM` (e.g. ``load_minilm()``).
        sentences: one string or a list of strings.

    Returns:
        A :class:`SelfOnlyRun`; float32, CPU, no gradient.

    Raises:
        TypeError / ValueError: as :meth:`~selfattn.pretrained.MiniLM.tokenize`.

    Source: chapter 01 (claim 2).
    """
    batch = minilm.tokenize(list(sentences) if not isinstance(sentences, str) else sentences)
    encoder = minilm.encoder()
    T = batch.input_ids.shape[1]
    own_position = torch.eye(T, dtype=torch.bool)[None, None]  # (1, 1, T, T): query i may read key i only
    with torch.no_grad():
        x = encoder.embeddings(batch.input_ids)  # (B, T) -> (B, T, D): token + position + segment, normalised
        hidden_states, weights = [x], []
        for block in encoder.blocks:
            x, w = block(x, own_position, return_weights=True)  # (B, T, D), (B, H, T, T)
            hidden_states.append(x)
            weights.append(w)
    return SelfOnlyRun(batch, tuple(hidden_states), tuple(weights))
