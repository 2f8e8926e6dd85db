"""How large the attention logits grow in training, with and without QK-norm.

A tiny causal language model (token and learned position embeddings, ``n_layers``
:class:`~selfattn.modern.ModernBlock` s, a final RMSNorm, an unembedding) learns to copy the
previous token of a random sequence, at a high learning rate. After every step we record the
largest attention logit ``max |Q K^T / sqrt(d_head)|`` over the batch, heads and layers. Without
QK-norm nothing bounds it: ``W_Q`` and ``W_K`` can grow freely. With QK-norm each logit is at most
``sqrt(d_head) * max_i |g_q[i] g_k[i]|`` (:func:`selfattn.modern.qk_norm_score_bound`), so it can
grow only as fast as the two gains. Dehghani et al. 2023 saw the unbounded growth diverge the
training of ViT-22B; here we only measure the logits of a model that trains in seconds.

Training runs on one CPU thread with every random number seeded, so the result does not depend on
the machine. Source: chapter 07.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .._threads import one_thread
from .._validate import require_flag, require_positive_int
from ..masks import causal_mask
from ..modern import ModernBlock, ModernBlockConfig, RMSNorm, attention_scores, qk_norm_score_bound

__all__ = ["LogitGrowthConfig", "LogitGrowthResult", "CopyLM", "train_logit_growth"]


@dataclass(frozen=True)
class LogitGrowthConfig:
    """Sizes of the model and of its training run.

    Attributes:
        vocab: number of token ids. T: sequence length. d_model, n_heads, d_ff, n_layers: the model.
        steps: Adam steps. batch: sequences per step. lr: learning rate (high on purpose).
    """

    vocab: int = 16
    T: int = 16
    d_model: int = 32
    n_heads: int = 2
    d_ff: int = 64
    n_layers: int = 1
    steps: int = 150
    batch: int = 32
    lr: float = 0.05

    def __post_init__(self):
        for name in ("vocab", "T", "d_model", "n_heads", "d_ff", "n_layers", "steps", "batch"):
            require_positive_int(name, getattr(self, name))
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (0 < self.lr < float("inf")):
            raise ValueError(f"lr must be a finite number > 0; got {self.lr!r}")


@dataclass(frozen=True)
class LogitGrowthResult:
    """One run: per step (after the update) the loss, the largest |logit| and, with QK-norm, the bound."""

    qk_norm: bool
    loss: np.ndarray  # (steps,) cross-entropy in nats, before each update
    max_logit: np.ndarray  # (steps + 1,) largest |score| at initialisation and after each update
    bound: np.ndarray | None  # (steps + 1,) sqrt(d_head) * max|g_q g_k|, the largest over layers


class CopyLM(nn.Module):
    """Embeddings, ``n_layers`` modern blocks with a causal mask, a final RMSNorm and an unembedding.

    forward(tokens: (B, T) int64) -> logits (B, T, vocab).
    """

    def __init__(self, config: LogitGrowthConfig, qk_norm: bool):
        super().__init__()
        self.config = config
        block_config = ModernBlockConfig(config.d_model, config.n_heads, config.d_ff, qk_norm=qk_norm)
        self.embed = nn.Embedding(config.vocab, config.d_model)
        self.positions = nn.Embedding(config.T, config.d_model)
        self.blocks = nn.ModuleList(ModernBlock(block_config) for _ in range(config.n_layers))
        self.final_norm = RMSNorm(config.d_model, block_config.norm_eps)
        self.unembed = nn.Linear(config.d_model, config.vocab, bias=False)
        self.register_buffer("mask", causal_mask(config.T), persistent=False)

    def streams(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream entering each block (B, T, D), and after the last one."""
        x = self.embed(tokens) + self.positions.weight[: tokens.shape[1]]  # (B, T, D)
        out = [x]
        for block in self.blocks:
            x = block(x, self.mask)
            out.append(x)
        return out

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.final_norm(self.streams(tokens)[-1]))  # (B, T, D) @ (D, V) -> (B, T, V)

    def max_logit(self, tokens: torch.Tensor) -> float:
        """Largest |score| over the visible (query, key) pairs of every head and layer."""
        with torch.no_grad():
            inputs = self.streams(tokens)[:-1]
            return max(float(attention_scores(b, x).masked_fill(~self.mask, 0).abs().max())
                       for b, x in zip(self.blocks, inputs, strict=True))  # fmt: skip


def train_logit_growth(config: LogitGrowthConfig | None = None, *, qk_norm: bool, seed: int = 0) -> LogitGrowthResult:
    """Train :class:`CopyLM` to predict the previous token, recording the largest attention logit.

    Args:
        config: sizes (default :class:`LogitGrowthConfig`). qk_norm: build the blocks with QK-norm.
        seed: seeds the weights and the batches.

    Returns:
        a :class:`LogitGrowthResult`.

    Raises:
        TypeError: ``config`` not a LogitGrowthConfig, ``qk_norm`` not a bool, ``seed`` not an int.

    Source: chapter 07.
    """
    config = LogitGrowthConfig() if config is None else config
    if not isinstance(config, LogitGrowthConfig):
        raise TypeError(f"config must be a LogitGrowthConfig; got {type(config).__name__}")
    qk_norm = require_flag("qk_norm", qk_norm)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int; got {seed!r}")
    with one_thread():
        torch.manual_seed(int(seed))
        model = CopyLM(config, qk_norm)
        gen = torch.Generator().manual_seed(int(seed) + 1)
        optimiser = torch.optim.Adam(model.parameters(), lr=config.lr)
        probe = torch.randint(config.vocab, (config.batch, config.T), generator=gen)  # fixed batch to measure on
        losses, logits, bounds = [], [model.max_logit(probe)], []

        def bound() -> float:
            return max(qk_norm_score_bound(b.attn) for b in model.blocks)

        if qk_norm:
            bounds.append(bound())
        for _ in range(config.steps):
            tokens = torch.randint(config.vocab, (config.batch, config.T), generator=gen)
            out = model(tokens)  # (B, T, V)
            # position t predicts token t-1; position 0 has nothing before it and is left out
            loss = nn.functional.cross_entropy(out[:, 1:].reshape(-1, config.vocab), tokens[:, :-1].reshape(-1))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
            logits.append(model.max_logit(probe))
            if qk_norm:
                bounds.append(bound())
    return LogitGrowthResult(qk_norm, np.array(losses), np.array(logits), np.array(bounds) if qk_norm else None)
