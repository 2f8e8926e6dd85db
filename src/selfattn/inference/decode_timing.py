"""How fast a GPT generates, with and without the KV cache, against the length of the context.

:func:`time_decode` runs greedy decoding on a :class:`~selfattn.models.gpt.GPT` from prompts of
several lengths and times each generated token. With the cache a step feeds one new token through
the model and reads the cached keys and values; without it a step recomputes the whole sequence
(what ``GPT.generate(..., use_cache=False)`` does). The loop is :meth:`GPT.generate`'s own (the
tokens are the same, tested), with a clock around each step and the prefill left out of the cached
timing: it is paid once per prompt, not per token.

Timings are reported as numbers and figures, never asserted: a busy machine must not break a test.

Source: chapter 10 (the cache), chapter 14 (the model); chapter 11.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .._validate import require_flag, require_positive_int
from ..efficient import KVCache
from ..models.gpt import GPT, GPTConfig

__all__ = ["CAPSTONE_SIZES", "capstone_sized_gpt", "DecodeTiming", "time_decode"]

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
