"""Streaming with a fixed memory: a sliding-window KV cache, attention sinks, and what they cost (chapter 11).

A :class:`~selfattn.efficient.KVCache` grows by one position per generated token, so memory and the
work of every step grow without bound. A *sliding window* keeps only the last ``window`` tokens'
keys and values (Beltagy et al. 2020, Longformer, section 3.1; Child et al. 2019 for fixed sparse
patterns; Mistral's "rolling buffer cache", Jiang et al. 2023, section 2), so a step reads at most
``window`` keys however long the text. Xiao et al. 2024 (StreamingLLM) observed that this window
alone breaks down as soon as the first tokens leave it, because trained models park much of their
attention on the first tokens (the "attention sinks"), and that keeping the first four tokens'
keys and values forever restores the loss (their section 3.1 and table 1); section 3.2 builds the
rolling cache with sinks, its positions counted within the cache.

:class:`SlidingWindowCache` is that cache for :class:`~selfattn.models.gpt.GPT`: a ring buffer of
``n_sinks + window`` slots per layer, used through ``GPT.forward_cached`` and ``GPT.generate(...,
make_cache=...)`` (the protocol of :class:`~selfattn.models.gpt.CachePlan`).
:func:`streaming_losses` measures, teacher-forced and token by token on long held-out text, what
the window loses and what sinks change, next to the full cache and to re-encoding the window from
scratch; :func:`streaming_experiment` trains chapter 08's small RoPE model first (claim 28).

Introduced in chapter 11.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .._runcache import shared_run
from .._validate import require_flag, require_positive_int, require_rank, require_tensor, shape_of
from ..masks import causal_mask
from ..models.gpt import GPT, CachePlan
from ..positions import PositionScheme

__all__ = [
    "SlidingWindowCache",
    "CACHE_POSITIONS",
    "make_caches",
    "DEFAULT_STRETCHES",
    "StreamingResult",
    "streaming_losses",
    "streaming_experiment",
    "sink_weights",
]

#: Where :class:`SlidingWindowCache` places the keys it holds. ``"cache"``: by place in the cache
#: (the sinks at 0 .. n_sinks-1, the window after them, oldest first), as StreamingLLM does
#: (Xiao et al. 2024, section 3.2): keys are stored unrotated and rotated at these positions at every
#: step, so the offsets a query sees never exceed ``n_sinks + window - 1``. ``"text"``: by place in
#: the text, keys rotated once when stored (what a plain KV cache does; Mistral's rolling buffer).
CACHE_POSITIONS = ("cache", "text")


def _adds_absolute(scheme) -> bool:
    """The scheme adds a vector per position to the embeddings (learned, sinusoidal)."""
    return type(scheme).add_absolute is not PositionScheme.add_absolute


def _has_score_bias(scheme) -> bool:
    """The scheme adds a bias to the scores (ALiBi)."""
    return type(scheme).score_bias is not PositionScheme.score_bias


def _require_int_at_least(name: str, value, low: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {low}; got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value}")
    return int(value)


def _shape_checked(rotate):
    """``rotate`` that raises unless it returns a tensor of the shape it was given (a wrong shape would
    silently give keys and values of different lengths)."""

    def checked(x: torch.Tensor, start: int) -> torch.Tensor:
        out = rotate(x, start)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = shape_of(out) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"rotate(x, start) must return a tensor of the shape of x {shape_of(x)}; got {got}")
        return out

    return checked


class SlidingWindowCache:
    """The keys and values of one layer's first ``n_sinks`` tokens and last ``window`` tokens.

    A ring buffer of ``capacity = n_sinks + window`` slots, allocated on the first step: slot i < s
    (s = n_sinks) holds text position i forever (the attention sinks of Xiao et al. 2024); text
    position p >= s goes to slot ``s + (p - s) % window``, over the oldest one there. After N tokens
    the cache holds positions ``0 .. s-1`` and ``max(s, N - window) .. N-1``, so a new query at text
    position p reads the sinks and the ``window`` tokens ``p - window + 1 .. p`` (itself included);
    everything between is gone. Memory is constant: the buffers keep their shape however long the
    text (tested).

    Positions (:data:`CACHE_POSITIONS`): with ``positions="cache"`` (default; StreamingLLM's section
    3.2) the held keys are numbered by place in the cache, oldest first: sinks at ``0 .. s-1``, the
    window at ``s ..``, the new query last. The keys are therefore stored *unrotated* and the
    scheme rotates all held keys at these positions at every step (and ALiBi biases them there),
    which is what StreamingLLM does for RoPE models: the relative offsets a query sees never exceed
    ``capacity - 1``, within what a model trained on longer windows has seen. A scheme that adds
    positions to the embeddings (learned, sinusoidal) cannot be renumbered (the position is mixed
    into every layer's keys and values) and is refused. With ``positions="text"`` keys are rotated
    once at their text positions and stored (as a plain KVCache does); then the sinks sit ever
    further from the query, and ALiBi (whose bias assumes keys at ``0 .. S-1``) is refused. With
    RoPE and no sinks the two agree (RoPE sees offsets only; tested).

    A step may take several new tokens while they all fit without evicting anything
    (``n_seen + T_new <= capacity``; the prompt of a short generation); past that, one token per
    step (feed a long prompt token by token, as ``GPT.generate(..., make_cache=...)`` does).

    Args:
        window: W (> 0), the number of most recent tokens kept, the new one included.
        n_sinks: s (>= 0), the number of first tokens kept forever.
        positions: ``"cache"`` or ``"text"`` (:data:`CACHE_POSITIONS`).

    Attributes:
        k, v: the buffers, (B, H, capacity, Dh) and (B, H, capacity, Dv), None before the first step.
        slot_positions: (capacity,) int64, the text position in each slot (-1: empty).
        n_seen: tokens appended so far (the text position of the next one). ``len(cache)``: tokens held.

    Raises:
        TypeError: ``window`` or ``n_sinks`` not an int; ``positions`` not a string.
        ValueError: ``window`` < 1, ``n_sinks`` < 0, an unknown ``positions``; from :meth:`plan`
        and :meth:`update`, see there.

    Source: Xiao et al. 2024 (StreamingLLM), sections 3.1-3.2; Beltagy et al. 2020 (Longformer),
    section 3.1; Jiang et al. 2023 (Mistral 7B), section 2 (rolling buffer cache); chapter 11.
    """

    def __init__(self, window: int, n_sinks: int = 0, *, positions: str = "cache"):
        window = _require_int_at_least("window", window, 1)  # NumPy ints accepted, as everywhere
        n_sinks = _require_int_at_least("n_sinks", n_sinks, 0)
        if not isinstance(positions, str):
            raise TypeError(f"positions must be one of {CACHE_POSITIONS}; got {positions!r} ({type(positions).__name__})")
        if positions not in CACHE_POSITIONS:
            raise ValueError(f"positions must be one of {CACHE_POSITIONS}; got {positions!r}")
        self.window, self.n_sinks, self.positions = window, n_sinks, positions
        self.capacity = n_sinks + window
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.slot_positions = torch.full((self.capacity,), -1, dtype=torch.int64)
        self.n_seen = 0

    def __len__(self) -> int:
        return min(self.n_seen, self.capacity)

    def __repr__(self) -> str:
        return (f"SlidingWindowCache(window={self.window}, n_sinks={self.n_sinks}, positions={self.positions!r}; "
                f"{self.n_seen} tokens seen, {len(self)} held)")

    def slot_of(self, p: int) -> int:
        """The slot that text position ``p`` (an int >= 0) is, was or will be stored in.

        Raises:
            TypeError / ValueError: ``p`` not an int >= 0 (NumPy ints accepted)."""
        p = _require_int_at_least("p", p, 0)
        s = self.n_sinks
        return p if p < s else s + (p - s) % self.window

    def held_positions(self) -> list[int]:
        """The text positions held, oldest first: the sinks, then the window."""
        s, N = self.n_sinks, self.n_seen
        return list(range(min(s, N))) + list(range(max(s, N - self.window), N))

    def plan(self, T: int, scheme, device=None) -> CachePlan:
        """Where ``T`` new tokens sit (see :class:`~selfattn.models.gpt.CachePlan`); changes nothing.

        Raises:
            ValueError: T > 1 new tokens that do not all fit without evicting; a scheme these
            positions cannot serve (positions="cache": learned or sinusoidal; "text": ALiBi).
        """
        T = require_positive_int("T", T)
        if T > 1 and self.n_seen + T > self.capacity:
            raise ValueError(
                f"a SlidingWindowCache takes several new tokens at once only while they fit without evicting "
                f"(tokens seen {self.n_seen} + new {T} <= capacity n_sinks + window = {self.capacity}); past that, "
                "feed one token per step (a long prompt token by token)"
            )
        name = getattr(scheme, "name", type(scheme).__name__)
        if self.positions == "cache" and _adds_absolute(scheme):
            raise ValueError(
                f"positions='cache' renumbers the held keys at every step, which the {name!r} scheme cannot do: it "
                "adds its positions to the embeddings, so they are mixed into every layer's keys and values. "
                "Use SlidingWindowCache(..., positions='text'), or a RoPE, ALiBi or no-position model"
            )
        if self.positions == "text" and _has_score_bias(scheme):
            raise ValueError(
                f"positions='text' keeps keys at their text positions, but the {name!r} scheme's score bias "
                "assumes keys at 0 .. S-1; use SlidingWindowCache(..., positions='cache')"
            )
        S = min(self.n_seen + T, self.capacity)  # keys after this step: all held ones, the new included
        start = S - T if self.positions == "cache" else self.n_seen  # the new queries are the newest keys
        # Every held key precedes the new queries; among the new ones, causal (nothing is evicted then).
        return CachePlan(self.n_seen, start, S, causal_mask(T, S, alignment="bottom_right", device=device))

    def _check(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        for name, x, layout in (("k_new", k_new, "(B, H, T_new, Dh)"), ("v_new", v_new, "(B, H, T_new, Dv)")):
            require_tensor(name, x)
            require_rank(name, x, 4, layout)
        if not k_new.dtype.is_floating_point or k_new.dtype != v_new.dtype:
            raise TypeError(f"k_new and v_new must be floating tensors of one dtype; got {k_new.dtype}, {v_new.dtype}")
        if k_new.shape[:-1] != v_new.shape[:-1]:
            raise ValueError(f"k_new {shape_of(k_new)} and v_new {shape_of(v_new)} must agree except in the last axis")
        if k_new.shape[-2] == 0:
            raise ValueError(
                f"k_new and v_new must hold at least one new token (T_new > 0 along dim -2); got k_new "
                f"{shape_of(k_new)} and v_new {shape_of(v_new)}"
            )
        if self.k is not None and (k_new.dtype != self.k.dtype or k_new.shape[:2] != self.k.shape[:2]
                                   or k_new.shape[-1] != self.k.shape[-1] or v_new.shape[-1] != self.v.shape[-1]):
            raise ValueError(
                f"k_new {shape_of(k_new)} {k_new.dtype} / v_new {shape_of(v_new)} must match the buffers k "
                f"{shape_of(self.k)} / v {shape_of(self.v)} ({self.k.dtype}) except along dim -2"
            )

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor, rotate=None):
        """Store the new tokens' keys and values; return the held keys (rotated) and values, oldest first.

        Args:
            k_new: (B, H, T_new, Dh) unrotated keys; v_new: (B, H, T_new, Dv).
            rotate: the scheme's ``rotate(x, start)`` (positions ``start ..`` along dim -2); None:
                no rotation. With ``positions="cache"`` it is applied to all held keys at ``0 ..``;
                with ``"text"``, to the new keys at their text positions before they are stored.

        Returns:
            ``(K, V)``, (B, H, S, Dh) and (B, H, S, Dv), S = ``len(cache)`` after the step, in the
            order of :meth:`held_positions` (the columns of the step's :meth:`plan`).

        Raises:
            TypeError / ValueError: tensors not of rank 4, not floating, of different dtypes or
            shapes, or not matching the buffers; no new token (T_new = 0); too many new tokens (see
            :meth:`plan`); ``rotate`` not callable. The cache is unchanged then. ValueError also when
            ``rotate`` returns a tensor of another shape than it was given (the cache unchanged).
        """
        self._check(k_new, v_new)
        if rotate is not None and not callable(rotate):
            raise TypeError(f"rotate must be a callable rotate(x, start) or None; got {rotate!r} ({type(rotate).__name__})")
        T = k_new.shape[-2]
        self.plan(T, PositionScheme())  # the number of new tokens, checked before anything changes
        rotate = _shape_checked(rotate or (lambda x, start: x))
        if self.k is None:  # preallocated once; from now on the shapes never change
            B, H, _, Dh = k_new.shape
            self.k = k_new.new_zeros(B, H, self.capacity, Dh)
            self.v = v_new.new_zeros(B, H, self.capacity, v_new.shape[-1])
        if self.positions == "text":
            k_new = rotate(k_new, self.n_seen)  # once, at the text positions, as a plain KV cache does
        new_positions = range(self.n_seen, self.n_seen + T)
        slots = torch.tensor([self.slot_of(p) for p in new_positions], device=self.k.device)  # (T_new,)
        saved = (self.k[:, :, slots].clone(), self.v[:, :, slots].clone(), self.slot_positions.clone(), self.n_seen)
        self.k[:, :, slots] = k_new  # overwrite the oldest window slots (or fill empty ones)
        self.v[:, :, slots] = v_new
        self.slot_positions[slots.cpu()] = torch.tensor(list(new_positions))
        self.n_seen += T
        order = torch.tensor([self.slot_of(p) for p in self.held_positions()], device=self.k.device)  # (S,)
        K, V = self.k[:, :, order], self.v[:, :, order]  # (B, H, S, Dh): oldest first, a copy
        if self.positions == "cache":
            try:
                K = rotate(K, 0)  # renumbered: sinks 0 .. s-1, window s .., the new token last
            except Exception:  # a failing rotate leaves the cache as it was
                self.k[:, :, slots], self.v[:, :, slots], self.slot_positions, self.n_seen = saved
                raise
        return K, V


def make_caches(model: GPT, window: int | None, n_sinks: int = 0, *, positions: str = "cache") -> list:
    """One fresh cache per layer: :class:`SlidingWindowCache` (``window``, ``n_sinks``), or KVCache for None."""
    from ..efficient import KVCache

    if window is None:
        return [KVCache() for _ in model.blocks]
    return [SlidingWindowCache(window, n_sinks, positions=positions) for _ in model.blocks]


# --------------------------------------------------------------------------------------------------
# The measurement (claim 28)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def _streamed_losses(model: GPT, inputs: torch.Tensor, targets: torch.Tensor, caches: list) -> torch.Tensor:
    """Teacher-forced next-token loss at every position, one token per step through ``caches``: (B, N)."""
    out = torch.empty(inputs.shape, dtype=torch.float64)
    for t in range(inputs.shape[1]):
        logits = model.forward_cached(inputs[:, t : t + 1], caches)[:, 0]  # (B, V)
        out[:, t] = F.cross_entropy(logits, targets[:, t], reduction="none").double().cpu()
    return out


@torch.no_grad()
def _recomputed_losses(model: GPT, inputs: torch.Tensor, targets: torch.Tensor, window: int,
                       batch_size: int = 512) -> torch.Tensor:
    """Each position's loss from the last ``window`` tokens re-encoded from scratch at 0 .. window-1: (B, N).

    The first ``window`` positions have no more context than that and are read by one causal pass.
    """
    B, N = inputs.shape
    out = torch.empty(B, N, dtype=torch.float64)
    W = min(window, N)
    head = model(inputs[:, :W])  # (B, W, V): positions 0 .. W-1 with all their context
    out[:, :W] = F.cross_entropy(head.transpose(1, 2), targets[:, :W], reduction="none").double().cpu()
    if N > W:
        windows = inputs.unfold(1, W, 1)[:, 1:]  # (B, N - W, W): window ending at t, for t = W .. N-1
        flat = windows.reshape(-1, W)
        last = torch.cat([model(flat[i : i + batch_size])[:, -1] for i in range(0, flat.shape[0], batch_size)])
        out[:, W:] = F.cross_entropy(last, targets[:, W:].reshape(-1), reduction="none").double().view(B, N - W).cpu()
    return out


@torch.no_grad()
def sink_weights(model: GPT, inputs: torch.Tensor, *, far: int = 64) -> tuple[torch.Tensor, float]:
    """Mean attention weight on position 0 of queries at positions >= ``far``, per layer and head.

    The model reads ``inputs`` (B, N) with the full causal mask (``GPT.forward``, one sequence at a
    time). Returns ``(weights, uniform)``: weights (n_layers, H) float64, the mean over the B
    sequences and the queries ``far .. N-1`` of the weight on the first token; and uniform, the
    mean of ``1 / (q + 1)`` over the same queries, what a head spreading its weight evenly gives it.
    A sink (Xiao et al. 2024, section 3.1; chapter 06's weight parked on [CLS]) is far above uniform.

    Raises:
        ValueError: ``far`` not a positive int below N.
    """
    N = inputs.shape[1]
    far = require_positive_int("far", far)
    if far >= N:
        raise ValueError(f"far must be below the sequence length {N}; got {far}")
    total = torch.zeros(model.config.n_layers, model.config.n_heads, dtype=torch.float64)
    for b in range(inputs.shape[0]):
        _, weights = model(inputs[b : b + 1], return_weights=True)  # n_layers x (1, H, N, N)
        total += torch.stack([w[0, :, far:, 0].double().mean(-1).cpu() for w in weights])  # (n_layers, H)
    uniform = float((1.0 / torch.arange(far + 1, N + 1, dtype=torch.float64)).mean())
    return total / inputs.shape[0], uniform


#: The stretches of positions :func:`streaming_losses` averages over by default, ``(first, end)``.
DEFAULT_STRETCHES = ((0, 64), (64, 256), (256, 1024), (1024, 2048))


@dataclass(frozen=True)
class StreamingResult:
    """What :func:`streaming_losses` measured. Losses are in nats per token.

    Attributes:
        labels: the settings, in order: ``"full cache"``, ``"window W, s sinks"`` for each s,
            ``"recompute last W"``.
        window: W. n_sinks: the sink counts measured. positions: the cache's positions
            (:data:`CACHE_POSITIONS`).
        position_loss: ``position_loss[label]``, the loss at each position 0 .. N-1, averaged over
            the B streams (a tuple of N floats).
        stretches: the ``(first, end)`` ranges of positions (end excluded) of :attr:`stretch_loss`.
        stretch_loss: ``stretch_loss[label][(first, end)]``, the mean loss over those positions.
        reference: the mean loss on ``reference_windows`` windows of ``train_length`` tokens from
            position 0 (:func:`selfattn.experiments.positions.validation_windows`): the model in
            the conditions it was trained in. None when not measured.
        sink_weight: (n_layers, H) nested tuples, :func:`sink_weights` on windows of the training
            length from position 0 (empty without baselines); sink_uniform: the even share it is
            compared with (NaN without baselines); sink_far: the first query counted.
        seconds: ``seconds[label]``, wall-clock time of each setting (never asserted).
        settings: how it was run (streams B, length N, and for :func:`streaming_experiment` the
            training settings and time).
    """

    labels: tuple[str, ...]
    window: int
    n_sinks: tuple[int, ...]
    positions: str
    position_loss: dict[str, tuple[float, ...]]
    stretches: tuple[tuple[int, int], ...]
    stretch_loss: dict[str, dict[tuple[int, int], float]]
    reference: float | None
    sink_weight: tuple[tuple[float, ...], ...]
    sink_uniform: float
    sink_far: int
    seconds: dict[str, float]
    settings: dict = field(default_factory=dict)

    def table(self) -> str:
        """The stretch means as a text table: a row per setting, a column per stretch."""
        cols = [f"{a}-{b - 1}" for a, b in self.stretches]
        lines = [f"{'loss (nats/token), positions':<30}" + "".join(f"{c:>11}" for c in cols)]
        for label in self.labels:
            lines.append(f"{label:<30}" + "".join(f"{self.stretch_loss[label][s]:>11.3f}" for s in self.stretches))
        if self.reference is not None:
            lines.append(f"reference: {self.reference:.3f} on windows of the training length, from position 0")
        return "\n".join(lines)


def _require_sinks(n_sinks_list) -> tuple[int, ...]:
    if isinstance(n_sinks_list, (str, bytes)) or not isinstance(n_sinks_list, Sequence) or not n_sinks_list:
        raise ValueError(f"n_sinks_list must be a non-empty sequence of ints >= 0; got {n_sinks_list!r}")
    for s in n_sinks_list:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"n_sinks_list must hold ints >= 0; got {s!r}")
    if len(set(n_sinks_list)) != len(n_sinks_list):
        raise ValueError(f"n_sinks_list must not repeat a value; got {tuple(n_sinks_list)}")
    return tuple(int(s) for s in n_sinks_list)


@torch.no_grad()
@shared_run
def streaming_losses(
    model: GPT,
    ids: torch.Tensor,
    *,
    window: int = 32,
    n_sinks_list: Sequence[int] = (0, 1, 2, 4),
    positions: str = "cache",
    n_streams: int = 4,
    stream_length: int = 2048,
    stretches: Sequence[tuple[int, int]] | None = None,
    sink_far: int | None = None,
    reference_windows: int = 48,
    extra_settings: Sequence[tuple[int, int]] = (),
    baselines: bool = True,
) -> StreamingResult:
    """Teacher-forced loss at every position of long texts: full cache, sliding windows with sinks, recomputation.

    ``n_streams`` streams of ``stream_length`` tokens, evenly spaced over ``ids``
    (:func:`selfattn.experiments.positions.validation_windows`), are read in parallel, and every
    position's next-token loss is recorded under each setting:

    - ``"full cache"``: every earlier token, at its text position (``GPT.forward`` in one pass,
      equal to decoding with a KVCache; tested): RoPE far past its training length;
    - ``"window W, s sinks"`` for each s in ``n_sinks_list``: token by token through a
      :class:`SlidingWindowCache` (``window``, s, ``positions``) per layer;
    - ``"window w, s sinks"`` for each ``(w, s)`` of ``extra_settings``, e.g. ``(W - 4, 4)``: 4 sinks
      at the same total cache size as ``W`` without sinks (StreamingLLM compares at equal budget);
    - ``"recompute last W"``: each token's loss from the last W tokens re-encoded from scratch at
      positions 0 .. W-1 (what the model saw in training; StreamingLLM's "sliding window with
      re-computation"). A baseline, not an upper bound: a cached window reaches further back through
      the layers (up to about n_layers x W tokens), a recomputed one sees exactly W.

    With ``baselines`` also: the in-distribution reference (the loss on ``reference_windows``
    windows of the training length, from position 0) and :func:`sink_weights` measured in training
    conditions: on windows of the training length from position 0, queries ``sink_far ..
    block_size - 1`` (past the training length the model's attention says little). Without
    ``baselines`` only the window settings are measured (the full cache and recomputation rows are
    absent, the sink weights empty).

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` (run in eval mode, left as it was).
        ids: (M,) integer token ids, M >= n_streams * stream_length + 1 (held-out text).
        window: W (> 0). n_sinks_list: sink counts (ints >= 0, no repeats).
        positions: of the window caches, :data:`CACHE_POSITIONS`.
        n_streams: B (> 0). stream_length: N (> 0).
        stretches: ``(first, end)`` ranges of positions to average over (default
            :data:`DEFAULT_STRETCHES` cut to N; ranges past N are dropped).
        sink_far: first query position counted by :func:`sink_weights` (< block_size; default
            block_size // 4, 16 for a model trained on 64 positions).
        reference_windows: windows for the reference and the sink weights (0: the reference not
            measured; the sink weights then use 48 windows).
        extra_settings: more ``(window, n_sinks)`` pairs to measure (ints, window > 0, sinks >= 0).
        baselines: measure the full cache, the recomputation, the reference and the sink weights.

    Returns:
        A :class:`StreamingResult`.

    Raises:
        TypeError / ValueError: ``model`` not a GPT; ``ids`` not 1-D integer ids or too short; bad
        sizes or sink counts; a stretch that is not ``0 <= first < end <= N``; everything
        :class:`SlidingWindowCache` refuses (e.g. learned positions with ``positions="cache"``).

    Source: Xiao et al. 2024, section 4.1 and figure 3 (the same four settings on Llama-2, MPT,
    Falcon and Pythia); chapter 11 (claim 28).
    """
    from ..experiments.positions import _require_ids, position_losses, validation_windows

    if not isinstance(model, GPT):
        raise TypeError(f"model must be a selfattn.models.gpt.GPT; got {type(model).__name__}")
    _require_ids("ids", ids, model.config.vocab_size)
    sinks = _require_sinks(n_sinks_list)
    B, N = require_positive_int("n_streams", n_streams), require_positive_int("stream_length", stream_length)
    W = require_positive_int("window", window)
    reference_windows = 0 if reference_windows == 0 else require_positive_int("reference_windows", reference_windows)
    if ids.numel() < B * N + 1:
        raise ValueError(f"ids must hold at least n_streams * stream_length + 1 = {B * N + 1} tokens; got shape "
                         f"{shape_of(ids)}")
    if stretches is None:
        stretches = tuple((a, min(b, N)) for a, b in DEFAULT_STRETCHES if a < N)
    stretches = tuple((int(a), int(b)) for a, b in stretches)
    for a, b in stretches:
        if not 0 <= a < b <= N:
            raise ValueError(f"stretches must be (first, end) with 0 <= first < end <= stream_length={N}; got {(a, b)}")
    baselines = require_flag("baselines", baselines)
    extra = []
    for pair in extra_settings:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"extra_settings must hold (window, n_sinks) pairs; got {pair!r}")
        w = require_positive_int("extra_settings window", pair[0])
        s = pair[1]
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"extra_settings n_sinks must be an int >= 0; got {s!r}")
        extra.append((w, s))
    far = max(1, model.config.block_size // 4) if sink_far is None else require_positive_int("sink_far", sink_far)
    if baselines and far >= model.config.block_size:
        raise ValueError(f"sink_far must be below the training length block_size={model.config.block_size}; got {far}")
    for w, s in [(W, s) for s in sinks] + extra:  # refuse a scheme the cache cannot serve before any work
        SlidingWindowCache(w, s, positions=positions).plan(1, model.positions)
    inputs, targets = validation_windows(ids, N, B)  # (B, N) each
    device = next(model.parameters()).device
    inputs, targets = inputs.to(device), targets.to(device)
    was_training = model.training
    model.eval()
    curves, seconds = {}, {}
    try:
        if baselines:
            t0 = time.perf_counter()
            full = model(inputs)  # (B, N, V); equal to decoding with a KVCache
            curves["full cache"] = F.cross_entropy(full.transpose(1, 2), targets, reduction="none").double().cpu()
            seconds["full cache"] = time.perf_counter() - t0
        for w, s in [(W, s) for s in sinks] + extra:
            label = f"window {w}, {s} sink{'s' if s != 1 else ''}"
            if label in curves:
                raise ValueError(f"extra_settings repeats the setting {label!r}")
            t0 = time.perf_counter()
            curves[label] = _streamed_losses(model, inputs, targets, make_caches(model, w, s, positions=positions))
            seconds[label] = time.perf_counter() - t0
        weights = torch.zeros(0, 0, dtype=torch.float64)
        uniform, reference = math.nan, None
        if baselines:
            label = f"recompute last {W}"
            t0 = time.perf_counter()
            curves[label] = _recomputed_losses(model, inputs, targets, W)
            seconds[label] = time.perf_counter() - t0
            T = model.config.block_size
            ref_in, ref_t = validation_windows(ids, T, reference_windows or 48)  # training conditions
            t0 = time.perf_counter()
            weights, uniform = sink_weights(model, ref_in, far=far)
            seconds["sink weights"] = time.perf_counter() - t0
            if reference_windows:
                reference = float(position_losses(model, ref_in, ref_t).mean())
    finally:
        model.train(was_training)
    position_loss = {k: tuple(float(v) for v in c.mean(0)) for k, c in curves.items()}
    stretch_loss = {k: {(a, b): float(c[:, a:b].mean()) for a, b in stretches} for k, c in curves.items()}
    return StreamingResult(
        labels=tuple(curves), window=W, n_sinks=sinks, positions=positions, position_loss=position_loss,
        stretches=stretches, stretch_loss=stretch_loss, reference=reference,
        sink_weight=tuple(tuple(float(x) for x in row) for row in weights), sink_uniform=uniform,
        sink_far=far, seconds=seconds, settings=dict(n_streams=B, stream_length=N),
    )


def streaming_experiment(
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    vocab_size: int,
    *,
    training: Mapping | None = None,
    progress: bool = False,
    **measure,
) -> tuple[StreamingResult, GPT]:
    """Train chapter 08's small RoPE GPT, then :func:`streaming_losses` on ``val_ids``.

    The model is trained by chapter 08's own
    :func:`selfattn.experiments.positions.compare_position_schemes` with ``schemes=("rope",)`` and
    its defaults (d_model 64, 2 layers, 4 heads, d_ff 128, 250 steps of 24 windows of 64 tokens, lr
    3e-3, seed 0), so it is the RoPE model of chapter 08's experiment, weight for weight on one
    machine and thread count, and its losses are comparable with that chapter's.

    Args:
        train_ids, val_ids: 1-D token ids (chapter 14's 90 % / 10 % split). vocab_size: V.
        training: keyword arguments of ``compare_position_schemes`` that change its defaults (not
            ``schemes`` or ``eval_lengths``). progress: its tqdm bar.
        measure: keyword arguments of :func:`streaming_losses` (window, n_sinks_list, ...).

    Returns:
        ``(result, model)``; ``result.settings`` adds chapter 08's settings (sizes, steps, ...,
        ``n_parameters``) and ``train_seconds`` (training and chapter 08's short evaluation).

    Raises:
        TypeError / ValueError: as ``compare_position_schemes`` and :func:`streaming_losses`;
        ``training`` naming ``schemes`` or ``eval_lengths``.

    Source: chapter 08 (the model), chapter 11 (claim 28).
    """
    from ..experiments.positions import compare_position_schemes

    training = dict(training or {})
    if {"schemes", "eval_lengths"} & set(training):
        raise ValueError(f"training must not set schemes or eval_lengths (the model is RoPE, evaluated here); got "
                         f"{sorted(training)}")
    trained = compare_position_schemes(train_ids, val_ids, vocab_size, schemes=("rope",),
                                       eval_lengths=(training.get("train_length", 64),), progress=progress, **training)
    model = trained.models["rope"].eval()  # as chapter 11 hands it on (streaming_losses evaluates in eval mode)
    result = streaming_losses(model, val_ids, **measure)
    settings = dict(result.settings, train_length=trained.train_length, **trained.settings,
                    train_seconds=trained.seconds["rope"])
    settings["n_parameters"] = settings["n_parameters"]["rope"]
    return StreamingResult(**{**result.__dict__, "settings": settings}), model
