"""A sink grown by training: a small GPT with a fixed first token, and the window caches that keep or evict it.

Chapter 11 measured StreamingLLM's window cache on chapter 08's RoPE model and found no sink to lose
(that model's own finding). Xiao et al. 2023 (StreamingLLM, section 3.1) explain sinks by the softmax:
a head with nothing to read must still put its weight somewhere, and the initial tokens, visible to
almost every later token, are where models learn to put it, whatever those tokens are (their
position, not their meaning, matters); section 3.3 finds that models trained without a dedicated
sink token use several initial tokens as sinks, and one trained with a learnable sink token uses
that one. Here every window starts with one fixed token, so the sink, if one grows, is one token
to evict or keep. :func:`train_with_bos` trains chapter 14's
:class:`~selfattn.models.gpt.GPT` on windows that all begin with one fixed token (``BOS``, an extra
id ``vocab_size``); :func:`sink_experiment` then measures

- the weight each head gives position 0 against an even spread (:func:`~selfattn.inference.streaming.sink_weights`);
- the next-token loss on long streams read through chapter 11's
  :class:`~selfattn.inference.streaming.SlidingWindowCache` of one size, ``window`` slots, with no
  sink (the BOS is evicted after ``window`` tokens) and with the BOS kept in one of them (a window
  of ``window - 1``): StreamingLLM compares caches of equal size (e.g. 4 + 1020 against 1024);
- a retrieval probe: a stretch of 32 held-out tokens written twice (half the training windows hold
  a stretch of 32 and its copy, cut to the window: 31 of the copy's tokens are inputs, so the model
  learns to look the answer up 31 tokens back): the loss on the copy, from the full cache and from
  windows shorter and longer than the distance to the answer.

Introduced in chapter 11c (claims 38 and 28).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._runcache import shared_run
from .._validate import require_positive_int
from ..inference.streaming import _streamed_losses, make_caches, sink_weights
from ..models.gpt import GPT, GPTConfig

__all__ = ["SinkRun", "bos_batch", "train_with_bos", "stream_losses", "retrieval_probe", "sink_experiment"]


def bos_batch(ids: torch.Tensor, n: int, length: int, bos: int, generator: torch.Generator,
              repeat_share: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` training windows of ``length`` tokens, each starting with ``bos``, and their targets.

    The first ``round(n * repeat_share)`` rows are BOS, a stretch of ``h = length // 2`` tokens of
    the text and the same stretch again, cut to the window: the inputs are BOS, the h tokens and the
    first ``length - h - 1`` of the copy (31 for length 64), the targets run one token further (each
    copy token ``h`` positions after its source, read ``h - 1`` back from the query before it); the rest
    are BOS and ``length - 1`` tokens of plain text. Returns ``(inputs, targets)``, each (n, length) int64.
    """
    half = length // 2
    starts = torch.randint(0, ids.numel() - length - 1, (n,), generator=generator).tolist()
    n_rep = round(n * repeat_share)
    rows = []
    for r, i in enumerate(starts):
        body = torch.cat([ids[i:i + half], ids[i:i + length - half]]) if r < n_rep else ids[i:i + length]
        rows.append(torch.cat([torch.tensor([bos]), body]))  # (length + 1,): the targets run one further
    seq = torch.stack(rows)
    return seq[:, :-1], seq[:, 1:]


@dataclass
class SinkRun:
    """One seed's trained model and what was measured on it (losses in nats per token).

    Attributes:
        seed, bos: the seed and the BOS id. model: the trained GPT (eval mode).
        sink_weight: (n_layers, H) float64, mean weight on position 0 of queries ``far ..``.
        uniform: the mean of 1 / (q + 1) over the same queries: an even spread's weight on position 0.
        stream: ``{label: {(first, end): mean loss}}`` for ``"window W, no sink"``, ``"BOS + window W-1"``
            (equal sizes) and ``"BOS + window W"`` (one slot more), and ``"full cache (first T)"``.
        probe: ``{label: mean loss on the copy}``: ``"first copy"``, ``"full cache"`` and
            ``"window w, BOS kept"`` for each probe window.
        settings: sizes and steps; seconds: training and measuring times.
    """

    seed: int
    bos: int
    model: GPT
    sink_weight: torch.Tensor
    uniform: float
    stream: dict
    probe: dict
    settings: dict
    seconds: dict


def train_with_bos(train_ids: torch.Tensor, vocab_size: int, *, seed: int = 0, steps: int = 600,
                   batch_size: int = 24, block_size: int = 64, d_model: int = 64, n_heads: int = 4,
                   n_layers: int = 2, d_ff: int = 128, lr: float = 3e-3, repeat_share: float = 0.5) -> GPT:
    """A RoPE GPT of vocabulary ``vocab_size + 1`` (id ``vocab_size`` is BOS), trained on :func:`bos_batch`.

    AdamW (weight decay 0.01), clipping at norm 1, 5 % linear warm-up, cosine decay to 10 % of ``lr``
    (chapter 14's schedule). Deterministic for a seed on one thread count.

    Raises:
        TypeError / ValueError: a size or ``steps`` that is not a positive int.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("block_size", block_size)):
        require_positive_int(name, value)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size + 1, block_size=block_size, d_model=d_model, n_heads=n_heads,
                          n_layers=n_layers, d_ff=d_ff, positions="rope"))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    schedule = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        x, y = bos_batch(train_ids, batch_size, block_size, vocab_size, generator, repeat_share)
        loss = F.cross_entropy(model(x).transpose(1, 2), y)  # (B, V, T) against (B, T)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
    return model.eval()


def _streams(ids: torch.Tensor, n_streams: int, length: int, bos: int):
    """``n_streams`` evenly spaced texts of ``length`` tokens, BOS first: (inputs, targets), (B, length)."""
    starts = torch.linspace(0, ids.numel() - length - 1, n_streams).long().tolist()
    text = torch.stack([ids[i:i + length] for i in starts])  # (B, length)
    return torch.cat([torch.full((n_streams, 1), bos), text[:, :-1]], dim=1), text


@torch.no_grad()
def stream_losses(model: GPT, ids: torch.Tensor, bos: int, *, window: int = 32, n_streams: int = 4,
                  length: int = 256, stretches=((0, 32), (32, 64), (64, 256))) -> dict:
    """Teacher-forced loss, token by token, through two window caches of ``window`` slots each.

    ``"window W, no sink"``: the last W tokens; position p >= W has lost the BOS. ``"BOS + window
    W-1"``: the BOS kept in one slot and the last W - 1 tokens in the others (chapter 11's cache,
    positions renumbered in the cache): the same memory, as StreamingLLM compares (Xiao et al. 2023,
    table 1: 4 + 1020 against 1024). Up to position W - 1 both hold the same tokens. And ``"BOS +
    window W"`` (W + 1 slots, chapter 11's ``SlidingWindowCache(W, 1)``): the text of the window of W
    and the BOS: one slot more than the others, one older token than ``"BOS + window W-1"``, and its
    BOS one position further from every query.
    Returns ``{label: {(first, end): mean loss}}``, with ``"full cache (first T)"`` (T the training
    length) on the stretches that end by T: the model with all its context, as trained.
    """
    inputs, targets = _streams(ids, n_streams, length, bos)
    T = model.config.block_size
    full = F.cross_entropy(model(inputs[:, :T]).transpose(1, 2), targets[:, :T], reduction="none")  # (B, T)
    out = {f"full cache (first {T})": {(a, b): float(full[:, a:b].mean()) for a, b in stretches if b <= T}}
    if window < 2:
        raise ValueError(f"window must be at least 2 (one slot for the BOS, one for the text); got {window}")
    settings = ((f"window {window}, no sink", window, 0), (f"BOS + window {window - 1}", window - 1, 1),
                (f"BOS + window {window}", window, 1))
    for label, w, n_sinks in settings:
        curve = _streamed_losses(model, inputs, targets, make_caches(model, w, n_sinks))  # (B, N): W slots each
        out[label] = {(a, b): float(curve[:, a:b].mean()) for a, b in stretches}
    return out


@torch.no_grad()
def retrieval_probe(model: GPT, ids: torch.Tensor, bos: int, *, windows=(8, 16, 32), n_probes: int = 32,
                    seed: int = 7) -> dict:
    """Loss on a repeated stretch of held-out text: the answer lies ``block_size // 2 - 1`` tokens back.

    Each probe is BOS, a stretch of ``h = block_size // 2`` held-out tokens, the same stretch again.
    Returns the mean loss over the copy's predictions (its tokens 2 .. h, each ``h - 1`` tokens
    after its source) from the full cache (``"full cache"``), over the first copy's predictions
    (``"first copy"``: what the text itself costs) and through a window cache of each size with the
    BOS kept: a window that holds fewer than ``h`` tokens cannot read the answer.
    """
    half = model.config.block_size // 2
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - half - 1, (n_probes,), generator=generator).tolist()
    seq = torch.stack([torch.cat([torch.tensor([bos]), ids[i:i + half], ids[i:i + half]]) for i in starts])
    inputs, targets = seq[:, :-1], seq[:, 1:]  # (n, 2h)
    copy, first = slice(half + 1, 2 * half), slice(1, half)  # predictions of copy tokens 2 .., first tokens 2 ..
    full = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")  # (n, 2h)
    out = {"first copy": float(full[:, first].mean()), "full cache": float(full[:, copy].mean())}
    for w in windows:
        curve = _streamed_losses(model, inputs, targets, make_caches(model, w, 1))  # (n, 2h)
        out[f"window {w}, BOS kept"] = float(curve[:, copy].mean())
    return out


@shared_run
def sink_experiment(train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int, *, seed: int = 0,
                    steps: int = 600, window: int = 32, far: int = 16, **training) -> SinkRun:
    """Train with a fixed BOS (:func:`train_with_bos`), then measure sink weights, streams and the probe.

    Source: Xiao et al. 2023 (StreamingLLM), sections 3.1-3.3 and figure 3; chapter 11c (claims 38, 28).
    """
    t0 = time.perf_counter()
    model = train_with_bos(train_ids, vocab_size, seed=seed, steps=steps, **training)
    t1 = time.perf_counter()
    bos = vocab_size
    T = model.config.block_size
    starts = torch.linspace(0, val_ids.numel() - T - 1, 48).long().tolist()
    windows = torch.stack([torch.cat([torch.tensor([bos]), val_ids[i:i + T - 1]]) for i in starts])  # (48, T)
    with torch.no_grad():
        weights, uniform = sink_weights(model, windows, far=far)
    stream = stream_losses(model, val_ids, bos, window=window)
    probe = retrieval_probe(model, val_ids, bos)
    t2 = time.perf_counter()
    settings = dict(steps=steps, window=window, far=far, block_size=T, d_model=model.config.d_model,
                    n_layers=model.config.n_layers, n_heads=model.config.n_heads,
                    n_parameters=sum(p.numel() for p in model.parameters()))
    return SinkRun(seed, bos, model, weights, uniform, stream, probe, settings,
                   dict(train=t1 - t0, measure=t2 - t1))
