"""Choosing the next token from a language model's logits: greedy, temperature, top-k and top-p.

Every rule turns the last position's logits (B, V) into a distribution and picks from it:

- **greedy**: the most probable token (``argmax``);
- **temperature** tau: ``softmax(logits / tau)``; tau < 1 sharpens, tau > 1 flattens;
- **top-k**: only the k most probable tokens keep their probability (renormalised); k = 1 is greedy;
- **top-p** (nucleus, Holtzman et al. 2020): the smallest set of most probable tokens whose total
  probability reaches p; p = 1 keeps every token.

Ties are kept together: a token as probable as the last one kept is kept too, so the result never
depends on how a sort orders equal values (top-k may then keep more than k tokens; tested).
:func:`filter_logits` applies top-k and top-p by setting the others' logits to -inf; :func:`sample`
draws the token; :meth:`selfattn.models.gpt.GPT.generate` uses both.

Introduced in chapter 11 (inference); temperature sampling is chapter 14's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._validate import require_flag, require_rank, require_tensor, shape_of

__all__ = ["filter_logits", "sample"]


def _require_top_k(top_k):
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"top_k must be a positive int or None; got {top_k!r} ({type(top_k).__name__})")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1 (1 is greedy) or None; got {top_k}")
    return int(top_k)


def _require_top_p(top_p):
    if top_p is None:
        return None
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"top_p must be a number in (0, 1] or None; got {top_p!r} ({type(top_p).__name__})")
    if not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (1 keeps every token) or None; got {top_p!r}")
    return float(top_p)


def _require_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise TypeError(f"temperature must be a finite number > 0; got {temperature!r} ({type(temperature).__name__})")
    if not (0 < temperature < math.inf):
        raise ValueError(f"temperature must be a finite number > 0; got {temperature!r}")
    return float(temperature)


def _require_generator(generator):
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None; got {generator!r} ({type(generator).__name__}). "
            "For a seed, pass torch.Generator().manual_seed(seed)"
        )
    return generator


def _require_logits(logits) -> None:
    """logits: a (B, V) floating tensor, V > 0, no NaN, no +inf, at least one finite entry per row."""
    require_tensor("logits", logits)
    require_rank("logits", logits, 2, "(B, V)")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be a floating tensor; got dtype {logits.dtype}")
    if logits.shape[-1] == 0:
        raise ValueError(f"logits must hold at least one token (V > 0); got shape {shape_of(logits)}")
    n_nan, n_inf = int(torch.isnan(logits).sum()), int((logits == math.inf).sum())
    if n_nan or n_inf:
        raise ValueError(
            f"logits must not hold NaN or +inf; got {n_nan} NaN and {n_inf} +inf in a tensor of shape "
            f"{shape_of(logits)}"
        )
    no_finite = ~torch.isfinite(logits).any(dim=-1)  # (B,)
    if bool(no_finite.any()):
        rows = torch.nonzero(no_finite).flatten().tolist()
        raise ValueError(
            "every row of logits needs at least one finite entry (a token that can be chosen); got rows "
            f"{rows[:5]}{'...' if len(rows) > 5 else ''} all -inf in a tensor of shape {shape_of(logits)}"
        )


def filter_logits(logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """``logits`` (B, V) with every token outside the top-k and the top-p nucleus set to -inf.

    Top-k keeps the tokens whose logit is at least the k-th largest (ties at the k-th kept). Top-p
    keeps, per row, the smallest set of most probable tokens (under ``softmax(logits)``) whose
    probabilities sum to at least ``top_p``, plus any token tied with the least probable one kept. Both
    given: a token must pass both. The most probable token always survives.

    Args:
        logits: (B, V) floating, V > 0, finite or -inf (at least one finite entry per row).
        top_k: k >= 1 or None. top_p: p in (0, 1] or None.

    Returns:
        (B, V), the dtype of ``logits``.

    Raises:
        TypeError / ValueError: ``logits`` not a (B, V) floating tensor with V > 0, NaN or +inf in it, a row
        with no finite logit; a bad ``top_k`` or ``top_p``.

    Source: Fan et al. 2018 (top-k); Holtzman et al. 2020, section 3.1 (nucleus sampling); chapter 11.
    """
    _require_logits(logits)
    top_k, top_p = _require_top_k(top_k), _require_top_p(top_p)
    keep = torch.ones_like(logits, dtype=torch.bool)  # (B, V)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest logit
        keep &= logits >= kth  # ties with the k-th are kept
    if top_p is not None and top_p < 1:
        probs = torch.softmax(logits.double(), dim=-1)  # (B, V), float64 so that sums are exact enough
        sorted_p, _ = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the more probable tokens
        n_keep = (before < top_p).sum(dim=-1, keepdim=True)  # (B, 1): tokens until the mass reaches p
        threshold = torch.gather(sorted_p, -1, n_keep - 1)  # (B, 1): the least probable one kept
        keep &= probs >= threshold  # ties with it are kept
    return logits.masked_fill(~keep, -math.inf)


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next-token ids (B, 1) int64 from ``logits`` (B, V).

    Greedy: the argmax (``temperature``, ``top_k`` and ``top_p`` ignored). Otherwise a draw from
    ``softmax(filter_logits(logits / temperature, top_k, top_p))`` with ``torch.multinomial`` and
    ``generator`` (on the generator's device, so a seed gives the same draws on any device). Without
    top-k and top-p it is plain temperature sampling, drawing exactly as chapter 14 does.

    Raises:
        TypeError / ValueError: bad ``logits`` (as :func:`filter_logits`, checked on every path,
        greedy included), ``temperature`` not a finite number > 0, bad ``top_k`` / ``top_p`` (also
        checked when greedy), ``greedy`` not a bool, ``generator`` not a torch.Generator or None.

    The computation runs in the logits' dtype promoted to at least float32, after subtracting each
    row's maximum, so any temperature > 0, however small, is safe (it tends to greedy).

    Source: chapter 14 (temperature); Holtzman et al. 2020 (top-p); chapter 11.
    """
    greedy = require_flag("greedy", greedy)
    temperature = _require_temperature(temperature)
    top_k, top_p = _require_top_k(top_k), _require_top_p(top_p)
    generator = _require_generator(generator)
    _require_logits(logits)  # on every path, greedy too: a NaN row has no most probable token
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)  # (B, V) -> (B, 1)
    # In the logits' dtype, at least float32 (never lower: float64 logits 1e-6 apart stay apart).
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B, V)
    # Subtract each row's maximum first: the maximum becomes 0, the others <= 0 or -inf, so a tiny
    # temperature gives -inf, never +inf or NaN, and tau -> 0 tends to greedy (softmax is unchanged).
    x = x - x.max(dim=-1, keepdim=True).values  # (B, V)
    scaled = torch.where(x == 0, x, x / temperature)  # 0 stays 0 even if tau rounds to 0 in this dtype
    if top_k is not None or top_p is not None:
        scaled = filter_logits(scaled, top_k=top_k, top_p=top_p)
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)  # sample where the generator lives: same stream anywhere
    return torch.multinomial(probs, 1, generator=generator).to(logits.device)  # (B, 1)
