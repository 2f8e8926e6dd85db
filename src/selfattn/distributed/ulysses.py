"""All-to-all sequence parallelism (DeepSpeed-Ulysses) with ``torch.distributed`` (chapter 12).

Each of P ranks holds a sequence shard (B, H, T/P, Dh) of Q, K and V. One ``dist.all_to_all`` per
tensor swaps what is split: afterwards each rank holds *all* T positions of H/P heads,
(B, H/P, T, Dh), attends locally with :func:`selfattn.scaled_dot_product_attention`, and a fourth
all-to-all sends the output back to sequence shards (Jacobs et al. 2023, "DeepSpeed Ulysses: System
Optimizations for Enabling Training of Extreme Long Sequence Transformer Models"). Heads are
independent, so nothing is merged: the attention is the plain formula. The all-to-all is a
:class:`torch.autograd.Function` whose adjoint is the reverse all-to-all, so autograd gives the
exact backward pass.

Bytes sent per rank (e = element size, n = T/P): each all-to-all keeps 1/P of its tensor and sends
the rest, so

- forward: ``4 x (P - 1)/P x B x H x n x Dh x e`` (q, k, v in, the output back), plus
  ``(P - 1) x B x n`` for a key-padding mask (its shard goes to every other rank);
- backward: ``4 x (P - 1)/P x B x H x n x Dh x e`` (the output's gradient in; dq, dk, dv back).

Source: chapter 12; Jacobs et al. (2023).
"""

from __future__ import annotations

import math
import time

import torch

from ..attention import scaled_dot_product_attention
from ._checks import check_shards, group_size_rank
from .comm import StepRecord, Traffic, all_to_all, nbytes
from .layout import shard_positions

__all__ = ["ulysses_attention", "ulysses_bytes_formula", "SeqToHeads"]


def ulysses_bytes_formula(B: int, H: int, T: int, Dh: int, P: int, element_size: int,
                          key_padding_mask: bool = False) -> dict:
    """``{"forward": bytes, "backward": bytes}`` one rank sends in :func:`ulysses_attention`.

    Exact integers: ``4 (P - 1) B (H/P) n Dh e`` is the module's ``4 (P - 1)/P B H n Dh e``."""
    n = T // P
    body = 4 * (P - 1) * B * (H // P) * n * Dh * element_size
    return {"forward": body + ((P - 1) * B * n if key_padding_mask else 0), "backward": body}


def _exchange(x, scatter_dim, gather_dim, group, traffic, phase):
    """Cut ``x`` into P chunks along ``scatter_dim``, send chunk j to rank j, join what arrives along ``gather_dim``."""
    P, r = group_size_rank(group)
    return torch.cat(_counted_all_to_all(list(x.chunk(P, dim=scatter_dim)), r, group, traffic, phase), dim=gather_dim)


def _counted_all_to_all(chunks, rank, group, traffic, phase):
    """:func:`~selfattn.distributed.comm.all_to_all`, recorded as one step of ``traffic``."""
    t0 = time.perf_counter()
    received = all_to_all(chunks, group, traffic, phase, rank)
    if traffic is not None:
        traffic.steps.append(StepRecord(phase, sum(s.phase == phase for s in traffic.steps),
                                        sum(nbytes(c) for j, c in enumerate(chunks) if j != rank),
                                        wait_s=time.perf_counter() - t0))
    return received


class SeqToHeads(torch.autograd.Function):
    """All-to-all from sequence shards (B, H, T/P, Dh) to head shards (B, H/P, T, Dh), or back
    (``inverse=True``). Its adjoint is the reverse all-to-all, which is its backward."""

    @staticmethod
    def forward(ctx, x, inverse, group, traffic):
        ctx.inverse, ctx.group, ctx.traffic = inverse, group, traffic
        dims = (2, 1) if inverse else (1, 2)  # (scatter, gather): heads out and sequence in, or the reverse
        return _exchange(x, *dims, group, traffic, "forward")

    @staticmethod
    def backward(ctx, grad):
        dims = (1, 2) if ctx.inverse else (2, 1)
        return _exchange(grad.contiguous(), *dims, ctx.group, ctx.traffic, "backward"), None, None, None


def ulysses_attention(q, k, v, *, key_padding_mask=None, causal: bool = False, layout: str = "contiguous",
                      scale: float | None = None, group=None, traffic: Traffic | None = None) -> torch.Tensor:
    """This rank's shard of exact self-attention, by all-to-all sequence parallelism.

    Args:
        q, k, v: this rank's shards (B, H, T/P, Dh), cut with ``layout``; H must be divisible by P.
        key_padding_mask: optional (B, T/P) ``torch.bool`` shard, True = real token.
        causal, layout, scale, group, traffic: as :func:`~selfattn.distributed.ring.ring_attention`.

    Returns:
        (B, H, T/P, Dh), differentiable (every rank must call backward too).

    Raises:
        RuntimeError: torch.distributed not initialised.
        TypeError / ValueError: as :func:`~selfattn.distributed.ring.ring_attention`; H not divisible by P.

    Source: Jacobs et al. (2023); chapter 12.
    """
    P, _ = group_size_rank(group)
    causal, layout = check_shards(q, k, v, key_padding_mask, causal, layout, scale, P)
    B, H, n, _ = q.shape
    if H % P:
        raise ValueError(f"all-to-all attention gives each of the P={P} ranks H/P whole heads, so H must be "
                         f"divisible by P; got H={H}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qh, kh, vh = (SeqToHeads.apply(x.contiguous(), False, group, traffic) for x in (q, k, v))  # (B, H/P, T, Dh)
    pos = torch.cat([shard_positions(n * P, P, layout, s) for s in range(P)]).to(q.device)  # gathered order
    keep = (pos[:, None] >= pos[None, :])[None, None] if causal else None  # (1, 1, T, T)
    if key_padding_mask is not None:  # every rank needs the whole (B, T) mask: its shard goes to all
        _, r = group_size_rank(group)
        shards = _counted_all_to_all([key_padding_mask.to(torch.uint8)] * P, r, group, traffic, "forward")
        pad = torch.cat(shards, dim=1).bool()[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
        keep = pad if keep is None else keep & pad
    context = scaled_dot_product_attention(qh, kh, vh, keep, scale=scale)  # (B, H/P, T, Dh)
    return SeqToHeads.apply(context, True, group, traffic)  # (B, H/P, T, Dh) -> (B, H, T/P, Dh)
