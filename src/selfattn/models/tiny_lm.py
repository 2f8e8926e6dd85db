"""A tiny next-token language model made of the package's parts, and its training loop.

The model is a GPT-style decoder: a token embedding plus a learned position embedding, a stack of
pre-norm :class:`~selfattn.block.TransformerBlock` layers, a final layer norm and a linear
read-out to the vocabulary. Whether it is causal is not a setting of the model: the caller passes
the mask to :meth:`TinyLM.forward` (``selfattn.causal_mask(T)`` or ``None``), so chapter 04 trains
*the same* model with and without the mask and nothing else changes.

Introduced in chapter 04 (claim 12: without the causal mask, training can peek).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import require_flag, require_positive_int, require_rank, require_tensor, shape_of
from ..block import BlockConfig, TransformerBlock
from ..data import random_windows
from ..embeddings import TokenEmbedding

__all__ = ["TinyLMConfig", "TinyLM", "next_token_loss", "blind_next_token_loss", "train_next_token"]


@dataclass(frozen=True)
class TinyLMConfig:
    """Sizes of a :class:`TinyLM`, validated at construction.

    Attributes:
        vocab_size: V, number of token ids (> 0).
        block_size: the longest input, T_max (> 0); the position table has this many rows.
        d_model: width D (> 0), divisible by ``n_heads``. n_heads: H (> 0).
        n_layers: number of Transformer blocks (> 0). d_ff: feed-forward width F (> 0).
    """

    vocab_size: int
    block_size: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 1
    d_ff: int = 256

    def __post_init__(self):
        require_positive_int("vocab_size", self.vocab_size)
        require_positive_int("block_size", self.block_size)
        require_positive_int("n_layers", self.n_layers)
        BlockConfig(self.d_model, self.n_heads, self.d_ff)  # validates d_model, n_heads, d_ff

    @property
    def block_config(self) -> BlockConfig:
        return BlockConfig(self.d_model, self.n_heads, self.d_ff)


class TinyLM(nn.Module):
    """Next-token model: ``logits = W_out(LN(blocks(E[ids] + P[:T])))``.

    Args:
        config: a :class:`TinyLMConfig`.

    Shapes:
        forward(input_ids (B, T) int64, mask: boolean keep-mask broadcastable to (B, H, T, T) or
        None, position_ids: (B, T) or (T,) integers in [0, block_size) or None) -> logits (B, T, V)
        float32: ``logits[b, t]`` scores the token that follows ``input_ids[b, t]``. Without
        ``position_ids`` column t is at position t; with them, row b's column t reads row
        ``position_ids[b, t]`` of the position table (packed documents restart at 0, chapter 04;
        left-padded prompts start at their first real token, chapter 05).

    Raises:
        TypeError / ValueError: ``input_ids`` not (B, T) integers in [0, V), T = 0, T > block_size, a
        bad mask (see :func:`selfattn.scaled_dot_product_attention`), or ``position_ids`` not integers
        of shape (B, T) or (T,) in [0, block_size).

    Source: chapter 04 (Radford et al. 2018's decoder-only layout, with pre-norm blocks).
    """

    def __init__(self, config: TinyLMConfig):
        super().__init__()
        if not isinstance(config, TinyLMConfig):
            raise TypeError(f"config must be a TinyLMConfig; got {type(config).__name__}")
        self.config = config
        self.token_embedding = TokenEmbedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Parameter(
            torch.randn(config.block_size, config.d_model) * 0.02
        )
        self.blocks = nn.ModuleList(
            TransformerBlock(config.block_config) for _ in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        require_tensor("input_ids", input_ids)
        require_rank("input_ids", input_ids, 2, "(B, T)")
        T = input_ids.shape[1]
        if T == 0:
            raise ValueError(f"input_ids must hold at least one token (T > 0); got shape {shape_of(input_ids)}")
        if T > self.config.block_size:
            raise ValueError(
                f"input_ids may hold at most block_size={self.config.block_size} positions; "
                f"got shape {shape_of(input_ids)}"
            )
        if position_ids is None:
            positions = self.position_embedding[:T]  # (T, D): column t at position t
        else:
            positions = self.position_embedding[self._check_positions(position_ids, input_ids)]  # (B, T, D) or (T, D)
        x = self.token_embedding(input_ids) + positions  # (B, T, D) + (T, D) or (B, T, D)
        for block in self.blocks:
            x = block(x, mask)  # (B, T, D); the mask is the only thing that makes it causal
        return self.lm_head(self.ln_f(x))  # (B, T, D) @ (D, V) -> (B, T, V)


    def _check_positions(self, position_ids, input_ids: torch.Tensor) -> torch.Tensor:
        """``position_ids`` as int64, after checking its type, shape (B, T) or (T,) and range."""
        require_tensor("position_ids", position_ids)
        if position_ids.dtype.is_floating_point or position_ids.dtype.is_complex or position_ids.dtype == torch.bool:
            raise TypeError(f"position_ids must be an integer tensor; got dtype {position_ids.dtype}")
        if tuple(position_ids.shape) not in (tuple(input_ids.shape), tuple(input_ids.shape[1:])):
            raise ValueError(
                f"position_ids must have the shape of input_ids {shape_of(input_ids)} (B, T) or (T,); "
                f"got {shape_of(position_ids)}"
            )
        low, high = int(position_ids.min()), int(position_ids.max())
        if low < 0 or high >= self.config.block_size:
            raise ValueError(
                f"position_ids must lie in [0, block_size={self.config.block_size}); got values from {low} to {high}"
            )
        return position_ids.to(device=self.position_embedding.device, dtype=torch.int64)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of ``logits`` (B, T, V) against ``targets`` (B, T).

    Source: chapter 04.
    """
    B, T, V = logits.shape
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))  # (B*T, V), (B*T,)


@torch.no_grad()
def blind_next_token_loss(
    model: TinyLM, inputs: torch.Tensor, targets: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """The loss when the model must predict each next token *without seeing it*.

    For every t, the model is run on the prefix ``inputs[:, :t + 1]`` alone, the way it was
    trained (with ``causal_mask(t + 1)`` if ``causal``, else with no mask), and only its last
    position's logits predict ``targets[:, t]``. Nothing after position t is in the input: this is
    how a language model is used to generate text. For a causal model it equals the ordinary
    (teacher-forced) loss; for a model that peeked at the future during training it is much larger.

    Args:
        model: a :class:`TinyLM`, on any device. inputs, targets: (B, T) int64, ``targets`` the
            inputs shifted by 1 (moved to the model's device).
        causal: whether the model was trained with the causal mask.

    Returns:
        A scalar tensor: mean cross-entropy in nats per token over all B * T predictions.

    Source: chapter 04 (claim 12).
    """
    causal = require_flag("causal", causal)
    from ..masks import causal_mask

    device = model.lm_head.weight.device
    inputs, targets = inputs.to(device), targets.to(device)
    T = inputs.shape[1]
    last_logits = []
    for t in range(T):
        mask = causal_mask(t + 1, device=device) if causal else None
        last_logits.append(model(inputs[:, : t + 1], mask)[:, -1])  # (B, t + 1, V) -> (B, V)
    logits = torch.stack(last_logits, dim=1)  # T x (B, V) -> (B, T, V)
    return next_token_loss(logits, targets)


def train_next_token(
    model: TinyLM,
    ids: torch.Tensor,
    *,
    causal: bool,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` to predict the next token of random windows of ``ids``; return the losses.

    Args:
        model: a :class:`TinyLM` (trained in place, left in eval mode), on any device; the batches
            are moved to it.
        ids: 1-D int64 tensor, the encoded corpus.
        causal: pass ``selfattn.causal_mask(T)`` to every forward (True) or no mask at all (False).
        steps: number of AdamW steps (> 0). batch_size: windows per step, each ``block_size`` long.
        lr: peak learning rate; it decays to 10 % along a cosine.
        seed: seeds the window sampler, so two runs see the same batches.

    Returns:
        The training loss (nats per token) of every step, a list of ``steps`` floats.

    Raises:
        TypeError / ValueError: as :func:`selfattn.data.random_windows`; ``steps`` not a positive int.

    Source: chapter 04.
    """
    causal = require_flag("causal", causal)
    from ..masks import causal_mask

    steps = require_positive_int("steps", steps)
    T = model.config.block_size
    device = model.lm_head.weight.device  # batches follow the model (CPU or GPU)
    mask = causal_mask(T, device=device) if causal else None
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
    )
    model.train()
    losses = []
    for _ in range(steps):
        inputs, targets = random_windows(
            ids, batch_size, T, generator
        )  # sampled on the CPU: reproducible
        loss = next_token_loss(model(inputs.to(device), mask), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses
