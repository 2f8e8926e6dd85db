"""How fast a GPT generates, with and without the KV cache, against the length of the context.

:func:`time_decode` runs greedy decoding on a :class:`~selfattn.models.gpt.GPT` from prompts of
several lengths and times each generated token. With the cache a step feeds one new token through
the model and reads the cached keys and values; without it a step recomputes the whole sequence
(what ``GPT.generate(..., use_cache=False)`` does). The loop is :meth:`GPT.generate`'s own (the
tokens are the same, tested), with a clock around each step and the prefill left out of the cached
timing: it is paid once per prompt, not per token.

:func:`time_decode_step_sweep` is the roofline experiment of claim 25: one decode step of
attention over a fixed cache, timed while the query heads per key/value head (the GQA group) go
1 -> 8 and while a batch of sequences sharing that cache grows, i.e. more FLOPs on the same bytes.
:func:`decode_step_counts` counts what the step must do and move (exact, load-free);
:func:`decode_sweep_text` turns a sweep into the chapter's sentences, following what was measured.

Timings are reported as numbers and figures, never asserted: a busy machine must not break a test.

Source: chapter 10 (the cache), chapter 14 (the model); chapter 11.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._validate import require_flag, require_positive_int
from ..efficient import KVCache
from ..models.gpt import GPT, GPTConfig

__all__ = ["CAPSTONE_SIZES", "capstone_sized_gpt", "DecodeTiming", "time_decode", "decode_step_counts",
           "DecodeStepPoint", "DecodeSweep", "CPU_QUERY_BLOCK", "CPU_QUERY_SPLIT_BELOW",
           "time_decode_step_sweep", "decode_sweep_text"]

#: The sizes of chapter 14's capstone model (notebooks/14_capstone_gpt.ipynb); its vocabulary is the
#: 94 characters of the course's corpus.
CAPSTONE_SIZES = {"vocab_size": 94, "block_size": 64, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 256,
                  "positions": "rope"}


def capstone_sized_gpt(seed: int = 0, **overrides) -> GPT:
    """An untrained :class:`GPT` with the capstone's sizes (:data:`CAPSTONE_SIZES`, any of them
    overridden by keyword), in eval mode. Timing does not need trained weights: every step does the
    same arithmetic whatever the weights. RoPE lets it run past ``block_size``."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**CAPSTONE_SIZES, **overrides})).eval()


@dataclass
class DecodeTiming:
    """What :func:`time_decode` measured.

    Attributes:
        context_lengths: prompt lengths L; the timed steps generate tokens L+1 .. L+n_new.
        seconds_per_token: {True: cached, False: uncached} -> median seconds per generated token at
            each L (missing key: not measured).
        n_new, repeats, batch: the sizes of the run. threads: ``torch.get_num_threads()``.
        tokens: the ids generated at the last L, for checking: {True: (batch, L + n_new + 1) (the
            prefill's token and n_new timed ones), False: (batch, L + n_new)}.

    Properties: ``tokens_per_second`` ({use_cache: list}) and ``speedup`` (cached tokens/s over
    uncached, per L; None unless both were measured).
    """

    context_lengths: list[int]
    seconds_per_token: dict[bool, list[float]]
    n_new: int
    repeats: int
    batch: int
    threads: int
    tokens: dict[bool, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def tokens_per_second(self) -> dict[bool, list[float]]:
        return {k: [self.batch / s for s in v] for k, v in self.seconds_per_token.items()}

    @property
    def speedup(self) -> list[float] | None:
        if set(self.seconds_per_token) != {True, False}:
            return None
        return [u / c for c, u in zip(self.seconds_per_token[True], self.seconds_per_token[False], strict=True)]


def _decode_steps(model: GPT, prompt: torch.Tensor, n_new: int, use_cache: bool) -> tuple[float, torch.Tensor]:
    """Greedy decoding as in :meth:`GPT.generate`; returns (seconds of the n_new steps, ids)."""
    ids = prompt
    caches = [KVCache() for _ in model.blocks] if use_cache else None
    step_input, elapsed = ids, 0.0
    for step in range(n_new):
        start = time.perf_counter()
        if use_cache:
            logits = model.forward_cached(step_input, caches)[:, -1]  # (B, V)
        else:
            logits = model(ids)[:, -1]  # the whole sequence again: (B, T, V) -> (B, V)
        next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1), greedy
        if not (use_cache and step == 0):  # a cached run's first step is the prefill: paid once, not per token
            elapsed += time.perf_counter() - start
        ids = torch.cat([ids, next_id], dim=1)  # (B, T) -> (B, T + 1)
        step_input = next_id
    return elapsed, ids


@torch.no_grad()
def time_decode(model: GPT, context_lengths: Sequence[int], *, use_cache: bool | Sequence[bool] = (True, False),
                n_new: int = 8, repeats: int = 3, batch: int = 1, seed: int = 0,
                num_threads: int | None = None) -> DecodeTiming:
    """Seconds per generated token (greedy, no grad) at each prompt length, with and/or without the cache.

    For each L in ``context_lengths`` a random prompt (B, L) is decoded for ``n_new`` tokens
    (cached: ``n_new + 1`` steps, the first being the prefill of the prompt, untimed; uncached:
    ``n_new`` steps over L .. L + n_new - 1 tokens, each recomputing the whole sequence). The
    cached and uncached runs alternate, ``repeats`` rounds, so that the load of a shared machine
    slows them alike; the median of the rounds' mean step times is reported.

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` (put in eval mode for the run, then restored).
        context_lengths: prompt lengths, positive ints (with learned positions L + n_new + 1 <= block_size).
        use_cache: True, False, or both (the default, giving :attr:`DecodeTiming.speedup`).
        n_new: tokens timed per run (> 0). repeats: rounds (> 0). batch: sequences decoded at once.
        seed: of the random prompts.
        num_threads: if given, ``torch.set_num_threads`` for the run (restored after). Why: a cached
            step of a small model is many tiny operations; with 2 OpenMP threads that spin while
            they wait (the default ``OMP_WAIT_POLICY``) on a machine busy with other jobs, each one
            can cost milliseconds (measured: 48 ms a step instead of 1.6 ms with one thread).
            ``num_threads=1``, or ``OMP_WAIT_POLICY=PASSIVE`` set before torch is imported, avoids it.

    Returns:
        :class:`DecodeTiming`.

    Raises:
        TypeError / ValueError: ``model`` not a GPT; lengths, n_new, repeats or batch not positive
        ints; ``use_cache`` not a bool or a non-empty sequence of bools; (learned positions) lengths
        past the table.

    Source: chapter 11 (the cost of decoding without a cache, claim 25).
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a selfattn.models.gpt.GPT; got {type(model).__name__}")
    lengths = [require_positive_int("context_lengths[i]", L) for L in context_lengths]
    if not lengths:
        raise ValueError("context_lengths must hold at least one prompt length; got an empty sequence")
    if isinstance(use_cache, (list, tuple)):
        modes = list(use_cache)
    else:
        modes = [require_flag("use_cache", use_cache)]
    if not modes:
        raise ValueError("use_cache must be True, False or a non-empty sequence of them; got an empty sequence")
    modes = list(dict.fromkeys(require_flag("use_cache", m) for m in modes))  # in order, no repeats
    n_new = require_positive_int("n_new", n_new)
    repeats = require_positive_int("repeats", repeats)
    batch = require_positive_int("batch", batch)
    if num_threads is not None:
        num_threads = require_positive_int("num_threads", num_threads)
    limit = model.positions.max_positions
    if limit is not None and max(lengths) + n_new + 1 > limit:
        raise ValueError(
            f"context length {max(lengths)} + n_new {n_new} + 1 exceeds the {model.positions.name} position table "
            f"of {limit} rows; use a RoPE, ALiBi or no-position model, or shorter contexts"
        )
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    was_training, threads_before = model.training, torch.get_num_threads()
    model.eval()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    seconds: dict[bool, list[float]] = {m: [] for m in modes}
    tokens: dict[bool, torch.Tensor] = {}
    try:
        for L in lengths:
            prompt = torch.randint(0, model.config.vocab_size, (batch, L), generator=generator).to(device)
            _decode_steps(model, prompt, 2, modes[0])  # warm-up: first-call costs belong to neither mode
            rounds: dict[bool, list[float]] = {m: [] for m in modes}
            for _ in range(repeats):
                for m in modes:
                    elapsed, ids = _decode_steps(model, prompt, n_new if not m else n_new + 1, m)
                    rounds[m].append(elapsed / n_new)
                    tokens[m] = ids
            for m in modes:
                seconds[m].append(statistics.median(rounds[m]))
        threads = torch.get_num_threads()
    finally:
        model.train(was_training)
        torch.set_num_threads(threads_before)
    return DecodeTiming(lengths, seconds, n_new, repeats, batch, threads, tokens)


def decode_step_counts(n_kv_heads: int, group_size: int, batch: int, context_len: int, d_head: int,
                       bytes_per_number: int = 4) -> tuple[int, int]:
    """(FLOPs, bytes) of one decode step of attention with the least possible memory traffic.

    ``batch`` sequences share one cache of ``context_len`` positions (a shared prompt, as in parallel
    sampling), each with ``n_kv_heads * group_size`` query heads (grouped-query attention: ``group_size``
    query heads read each key/value head). FLOPs: per query head ``2 S Dh`` for the scores ``q K^T`` and
    ``2 S Dh`` for ``weights @ V`` (a multiply and an add each; the softmax's ``O(S)`` left out). Bytes:
    K and V read once, ``2 H_kv S Dh`` numbers, plus the queries read and the outputs written,
    ``2 B H_kv G Dh`` numbers (a fused kernel: the scores never reach slow memory). Intensity is
    therefore about ``B G / 2`` FLOP per byte in float32 and ``B G`` in bfloat16: growing with the
    group and the batch, the same bytes.

    Raises: TypeError / ValueError: an argument not a positive int. Source: chapter 11 (claim 25).
    """
    H_kv, G, B, S, Dh, nb = (require_positive_int(name, v) for name, v in (
        ("n_kv_heads", n_kv_heads), ("group_size", group_size), ("batch", batch), ("context_len", context_len),
        ("d_head", d_head), ("bytes_per_number", bytes_per_number)))
    flops = 4 * B * H_kv * G * S * Dh
    numbers = 2 * H_kv * S * Dh + 2 * B * H_kv * G * Dh
    return flops, nb * numbers


@dataclass(frozen=True)
class DecodeStepPoint:
    """One timed configuration of :func:`time_decode_step_sweep`.

    Attributes: group_size, batch: as in :func:`decode_step_counts`. flops, bytes: counted per step.
    seconds: median over the repeats. samples: every repeat's seconds. Properties: ``intensity``
    (FLOP/byte), ``flops_per_s`` and ``bytes_per_s`` achieved (counted over the median time), ``spread``
    (slowest repeat over fastest, minus 1).
    """

    group_size: int
    batch: int
    flops: int
    bytes: int
    seconds: float
    samples: tuple[float, ...]

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds

    @property
    def spread(self) -> float:
        return max(self.samples) / min(self.samples) - 1


@dataclass(frozen=True)
class DecodeSweep:
    """What :func:`time_decode_step_sweep` measured.

    Attributes:
        groups: points at batch 1, group size 1 -> max (more query heads per key/value head).
        batches: points at the largest group size, batch 1 -> max (more sequences sharing the cache).
        overhead_seconds: median seconds of the same call over a cache of ``overhead_context``
            positions and one query: what one call costs when there is almost nothing to read or compute.
        n_kv_heads, context_len, d_head, threads: the sizes of the run.
    """

    groups: list[DecodeStepPoint]
    batches: list[DecodeStepPoint]
    overhead_seconds: float
    n_kv_heads: int
    context_len: int
    d_head: int
    threads: int
    overhead_context: int = 16


#: PyTorch's CPU flash kernel (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``) splits the queries
#: into blocks of 32 when a call has fewer than 192 of them, and streams all of K and V once per block. Up to
#: this many queries per key/value head, one call reads the cache once, as :func:`decode_step_counts` counts.
CPU_QUERY_BLOCK = 32
#: ... and only below this many queries per call (from 192 the kernel's query blocks are larger: 64, and 256
#: from 768), so "one block of 32" is a statement about calls of fewer than 192 queries.
CPU_QUERY_SPLIT_BELOW = 192


def _decode_step_fn(n_kv_heads: int, group_size: int, batch: int, context_len: int, d_head: int,
                    k: torch.Tensor, v: torch.Tensor, generator: torch.Generator):
    # the B x G query heads of one key/value head attend to the same keys: fold them into the query axis
    q = torch.randn(1, n_kv_heads, batch * group_size, d_head, generator=generator)  # (1, H_kv, B G, Dh)
    ks, vs = k[:, :, :context_len], v[:, :, :context_len]  # (1, H_kv, S, Dh), views of the one cache

    def step():
        # PyTorch's fused CPU kernel (chapter 10): the scores stay in tiles, so its traffic is the counted one
        return F.scaled_dot_product_attention(q, ks, vs)  # (1, H_kv, B G, Dh)
    return step


@torch.no_grad()
def time_decode_step_sweep(group_sizes: Sequence[int] = (1, 2, 4, 8), batches: Sequence[int] = (1, 2, 4), *,
                           n_kv_heads: int = 8, context_len: int = 32768, d_head: int = 64, repeats: int = 5,
                           overhead_context: int = 16, seed: int = 0,
                           num_threads: int | None = None) -> DecodeSweep:
    """Time one decode step of attention over a fixed float32 cache, for more FLOPs on the same bytes.

    The cache (K and V, ``(1, n_kv_heads, context_len, d_head)`` each; 128 MiB with the defaults, larger
    than the last-level cache of typical CPUs) is built once. Each configuration runs
    ``F.scaled_dot_product_attention`` with ``batch x group_size`` queries per key/value head; all
    configurations are interleaved, ``repeats`` rounds, so that a burst of other work slows them
    alike; the median is reported. First the group grows at batch 1, then the batch at the largest group.
    A last configuration, one query over ``overhead_context`` positions, measures what a call costs with
    almost nothing to do.

    The largest group times the largest batch may not exceed :data:`CPU_QUERY_BLOCK` (32): the batch's
    and group's queries are folded into one call's query axis, and PyTorch's CPU kernel reads K and V once
    per block of 32 queries, so more queries would read the cache several times and the counted bytes
    would be only a lower bound (exact only if one head's K and V stayed in the last-level cache).

    Raises: TypeError / ValueError: sizes not positive ints, empty or unsorted sweeps, or more than
    :data:`CPU_QUERY_BLOCK` queries per key/value head in one call.
    Source: Williams et al. 2009 (the roofline); chapter 11 (claim 25).
    """
    groups = [require_positive_int("group_sizes[i]", g) for g in group_sizes]
    sizes = [require_positive_int("batches[i]", b) for b in batches]
    for name, values in (("group_sizes", groups), ("batches", sizes)):
        if len(values) < 2 or sorted(set(values)) != values:
            raise ValueError(f"{name} must be at least two increasing sizes; got {values}")
    if groups[-1] * sizes[-1] > CPU_QUERY_BLOCK:
        raise ValueError(f"group_sizes[-1] * batches[-1] must be at most {CPU_QUERY_BLOCK} queries per key/value head "
                         f"(PyTorch's CPU kernel reads K and V once per block of {CPU_QUERY_BLOCK} queries, so more "
                         f"would read the cache several times); got {groups[-1]} * {sizes[-1]} = "
                         f"{groups[-1] * sizes[-1]}")
    H_kv, S, Dh = (require_positive_int(n, x) for n, x in
                   (("n_kv_heads", n_kv_heads), ("context_len", context_len), ("d_head", d_head)))
    repeats = require_positive_int("repeats", repeats)
    overhead_context = require_positive_int("overhead_context", overhead_context)
    if num_threads is not None:
        num_threads = require_positive_int("num_threads", num_threads)
    generator = torch.Generator().manual_seed(seed)
    k = torch.randn(1, H_kv, S, Dh, generator=generator)
    v = torch.randn(1, H_kv, S, Dh, generator=generator)
    configs = [(g, 1) for g in groups] + [(groups[-1], b) for b in sizes[1:]]
    threads_before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        fns = {c: _decode_step_fn(H_kv, c[0], c[1], S, Dh, k, v, generator) for c in configs}
        fns["overhead"] = _decode_step_fn(1, 1, 1, overhead_context, Dh, k, v, generator)
        for fn in fns.values():
            fn()  # warm-up: first-call costs belong to no configuration
        samples: dict = {c: [] for c in fns}
        for _ in range(repeats):
            for c, fn in fns.items():
                start = time.perf_counter()
                fn()
                samples[c].append(time.perf_counter() - start)
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads_before)

    def point(c):
        flops, nbytes = decode_step_counts(H_kv, c[0], c[1], S, Dh)
        return DecodeStepPoint(c[0], c[1], flops, nbytes, statistics.median(samples[c]), tuple(samples[c]))

    group_points = [point((g, 1)) for g in groups]
    batch_points = [group_points[-1]] + [point((groups[-1], b)) for b in sizes[1:]]
    return DecodeSweep(group_points, batch_points, statistics.median(samples["overhead"]), H_kv, S, Dh, threads,
                       overhead_context)


def _growth(points: Sequence[DecodeStepPoint]) -> float:
    """How the time grows with the FLOPs across ``points``: log(t_last / t_first) / log(F_last / F_first)
    (0: flat, the same time for more arithmetic; 1: in proportion to the FLOPs)."""
    return math.log(points[-1].seconds / points[0].seconds) / math.log(points[-1].flops / points[0].flops)


def decode_sweep_text(sweep: DecodeSweep, balance: float, *, gpu_balance: float | None = None,
                      gpu_name: str = "an H100 SXM") -> tuple[str, str]:
    """(main, notes): the chapter's sentences on a :class:`DecodeSweep`, and the caveats for its
    collapsed "Lab notes" box. The text follows the numbers.

    ``balance``: this machine's measured balance (FLOP/byte, float32). ``gpu_balance``: a published
    GPU's (dense bf16 FLOP/s over HBM bytes/s); the GPU sentence is arithmetic on it, not a measurement.

    Rules: the sweep's time change counts only when it is larger than the spread between the repeats
    of the two end points; otherwise the text says this run cannot tell. Flat time (growth below 0.25
    of the FLOPs' growth) is read as "not arithmetic": per-call costs when the tiny-cache call takes at
    least half of the smallest step, memory traffic otherwise. Growth above 0.75 is read as arithmetic.

    Raises: TypeError: not a DecodeSweep. ValueError: a balance that is not a finite number > 0.
    Source: chapter 11 (claim 25).
    """
    if not isinstance(sweep, DecodeSweep):
        raise TypeError(f"sweep must be a DecodeSweep (from time_decode_step_sweep); got {type(sweep).__name__}")
    for name, value in (("balance", balance), ("gpu_balance", gpu_balance)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0 (FLOP per byte); got {value!r}")
    first = sweep.groups[0]
    notes, sentences, growth = [], [], {}
    for label, points in (("query heads per key/value head", sweep.groups), ("sequences sharing the cache", sweep.batches)):
        a, b = points[0], points[-1]
        change = b.seconds / a.seconds
        noise = max(a.spread, b.spread)
        n_a, n_b = (a.group_size, b.group_size) if points is sweep.groups else (a.batch, b.batch)
        what = (f"from {n_a} to {n_b} {label} ({b.flops / a.flops:.0f} times the FLOPs on the same bytes, "
                f"intensity {a.intensity:.2g} to {b.intensity:.2g} FLOP/byte)")
        notes.append(f"Going {what}, the median step went from {a.seconds * 1e3:.1f} to {b.seconds * 1e3:.1f} ms; "
                     f"the repeats of these two points spread by up to {noise:.0%}.")
        if abs(change - 1) <= noise:
            growth[label] = None
            sentences.append(f"going {what}, the step time changed by {change - 1:+.0%}, which this run cannot tell "
                             "from no change")
            continue
        growth[label] = g = _growth(points)
        how = ("stayed nearly flat" if g < 0.25 else "grew almost in proportion" if g > 0.75 else
               "grew, though less than the FLOPs")
        sentences.append(f"going {what}, the step time {how} ({change:.2f} times)")
    overhead_share = sweep.overhead_seconds / first.seconds
    g_groups = growth["query heads per key/value head"]
    if overhead_share >= 0.5:
        cause = (f"A call over an almost empty cache takes {overhead_share:.0%} of the smallest step: on this CPU "
                 "per-operation costs dominate, and neither bytes nor FLOPs set the time.")
    elif g_groups is None or g_groups < 0.25:
        cause = ("More arithmetic on the same bytes cost little at small groups: memory traffic, not arithmetic, "
                 "set the time of the smallest step.")
    elif first.intensity < balance:
        cause = ("The time grew with the queries even below this machine's balance, so the step is not purely "
                 "limited by memory traffic here: the work per query (scores, exponentials, products) costs time "
                 "that the two roofs do not predict.")
    else:
        cause = "The time grew with the arithmetic: on this run the arithmetic set the step's time."
    knee = [p for p in sweep.groups + sweep.batches[1:] if p.intensity >= balance]
    notes.append(f"This machine's measured balance is {balance:.2g} FLOP/byte (float32)"
                 + (f"; the counted intensity, about B G / 2, reaches it at about {2 * balance:.2g} queries per "
                    f"key/value head, and the first measured point above it has {knee[0].batch * knee[0].group_size}."
                    if knee else "; no point of the sweep reaches it."))
    notes.append(f"A call over a cache of {sweep.overhead_context} positions took {sweep.overhead_seconds * 1e3:.3f} ms; the step "
                 f"over the full cache at one query per key/value head took {first.seconds * 1e3:.1f} ms "
                 f"({sweep.threads} threads, {sweep.context_len:,} cached positions, {sweep.n_kv_heads} key/value "
                 f"heads of width {sweep.d_head}, float32).")
    main = "On this machine, " + "; ".join(sentences) + ". " + cause
    if gpu_balance is not None:
        main += (f"\n\nOn {gpu_name}, by arithmetic on published numbers, bfloat16 decode does about $B G$ FLOP per "
                 f"byte against a balance of {gpu_balance:.0f}: a group of 8 stays memory-bound unless about "
                 f"{math.ceil(gpu_balance / 8)} sequences share one cache (separate sequences bring their own "
                 "caches, and with them their own bytes).")
    return main, " ".join(notes)
