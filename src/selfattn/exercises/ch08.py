"""Checks for the exercises of chapter 08 (positions).

8.1 RoPE in the interleaved layout; 8.2 ALiBi's slopes for any number of heads; 8.3 causal
attention with RoPE on queries and keys; 8.4 the score depends on the offset only. Each check runs
the learner's function on its own inputs, compares it with :mod:`selfattn.positions` and names the
usual mistake: the half layout instead of the interleaved one, the rotation turned the wrong way,
frequencies ``base^(+2i/Dh)`` or ``base^(-i/Dh)`` or counted from 1, the positions ignored or
replaced by ``0..T-1``; the geometric sequence used for every H, an exponent off by one; values
rotated, or only one of q and k.

A function whose body is still empty (``pass``, ``...`` or a docstring) counts as not attempted,
like one that raises ``NotImplementedError``; one with code that returns None is told it forgot
``return``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import positions as _pos
from .. import ref
from . import (
    call_learner,
    checker,
    compare_arrays,
    failed,
    is_empty_stub,
    not_attempted,
    passed,
    to_numpy,
)

__all__ = ["check_apply_rope", "check_alibi_slopes", "check_rope_attention", "check_relative_score"]

_EX1 = "8.1 RoPE, interleaved"
_EX2 = "8.2 ALiBi slopes"
_EX3 = "8.3 attention with RoPE"
_EX4 = "8.4 relative scores"

# Loose enough for a correct answer computed in float32 (angles of positions up to 40 lose ~1e-5),
# far tighter than any of the mistakes below (they are off by O(1)).
_TOL = 1e-4


def _close(a: np.ndarray | None, b: np.ndarray) -> bool:
    return a is not None and a.shape == b.shape and bool(np.isfinite(a).all()) and np.allclose(a, b, atol=_TOL, rtol=_TOL)


def _rope_with(x: torch.Tensor, positions: torch.Tensor, theta: torch.Tensor, layout: str = "interleaved") -> np.ndarray:
    """RoPE with any frequencies ``theta`` (Dh/2,): what a learner with a wrong frequency formula computes."""
    angles = positions.double()[:, None] * theta[None, :]  # (T, 1) * (1, Dh/2) -> (T, Dh/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    x = x.double()
    if layout == "half":
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).numpy()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).numpy()


def _rope_cases():
    gen = torch.Generator().manual_seed(8)
    return [
        ("positions 0..4", torch.randn(5, 8, generator=gen, dtype=torch.float64), torch.arange(5), 10000.0),
        ("positions [3, 0, 7, 40]", torch.randn(4, 6, generator=gen, dtype=torch.float64),
         torch.tensor([3, 0, 7, 40]), 100.0),
        ("one pair", torch.randn(3, 2, generator=gen, dtype=torch.float64), torch.tensor([1, 2, 5]), 10000.0),
    ]  # fmt: skip


def _rope_mistakes(x: torch.Tensor, positions: torch.Tensor, base: float) -> list[tuple[np.ndarray, str]]:
    """The classic wrong answers for one case, each with what to tell the learner."""
    Dh = x.shape[-1]
    i = torch.arange(Dh // 2, dtype=torch.float64)
    right = base ** (-2 * i / Dh)
    T = x.shape[0]
    ignored_base = [] if base == 10000.0 else [
        (_pos.apply_rope(x, positions, base=10000.0, layout="interleaved").numpy(),
         f"You used base 10000 instead of the base argument (this case passes base = {base:g}): "
         "theta_i = base^(-2i/Dh) with the base you are given.")]
    return ignored_base + [
        (x.numpy(), "Your output equals the input, as if every row sat at position 0: nothing was rotated. "
                    "Each pair must turn by the angle position × theta_i; did you use the positions?"),
        (_pos.apply_rope(x, torch.arange(T), base=base, layout="interleaved").numpy(),
         "You rotated row t by t × theta_i, ignoring the positions argument: the rows can sit at any "
         f"positions (here {positions.tolist()}), as in a KV cache or a packed batch."),
        (_pos.apply_rope(x, positions, base=base, layout="half").numpy(),
         "You used the half layout, pairing feature i with feature i + Dh/2 (GPT-NeoX, Llama, Hugging Face's "
         "rotate_half). This exercise asks for the interleaved layout of the paper: pair i is features "
         "(2i, 2i+1), that is x[..., 0::2] and x[..., 1::2]."),
        (_pos.apply_rope(x, -positions, base=base, layout="interleaved").numpy(),
         "The rotation goes the wrong way: pair (a, b) at angle t must become (a cos t - b sin t, "
         "a sin t + b cos t), a counter-clockwise turn; you turned it clockwise (the signs of the sin terms "
         "are swapped)."),
        (_rope_with(x, positions, base ** (2 * i / Dh)),
         "Your frequencies grow with i: theta_i = base^(-2i/Dh), with a minus sign, so the first pair turns "
         "fastest (1 radian per position) and the last one slowest."),
        (_rope_with(x, positions, base ** (-i / Dh)),
         "Your frequencies are base^(-i/Dh): the exponent is -2i/Dh for pair i (i = 0 .. Dh/2-1), which is "
         "torch.arange(0, Dh, 2) / Dh. Using i instead of 2i makes the slow pairs turn too fast."),
        (_rope_with(x, positions, base ** (-2 * (i + 1) / Dh)),
         "Your frequencies are off by one: the paper counts pairs from 1 (theta_i = base^(-2(i-1)/d)); counted "
         "from 0 it is base^(-2i/Dh), so the first pair has theta = 1."),
        (_rope_with(x, positions, right ** 2),
         "Your frequencies are squared (base^(-4i/Dh)): the exponent is -2i/Dh for pair i."),
    ]  # fmt: skip


@checker(_EX1)
def check_apply_rope(fn):
    """``fn(x, positions, base)`` for x (T, Dh) float64, positions (T,) int64 and a float base must
    return x with each feature pair (2i, 2i+1) of the row at position m turned by ``m * base^(-2i/Dh)``
    radians (the interleaved layout), shape (T, Dh)."""
    if is_empty_stub(fn):
        return not_attempted(_EX1)
    for case, x, positions, base in _rope_cases():
        got = call_learner(_EX1, fn, x.clone(), positions.clone(), base)
        expected = _pos.apply_rope(x, positions, base=base, layout="interleaved").numpy()
        arr = to_numpy(got)
        if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all() and _close(arr, expected):
            continue
        if arr is not None and arr.shape == expected.shape:
            for wrong, message in _rope_mistakes(x, positions, base):
                if not np.allclose(wrong, expected, atol=_TOL, rtol=_TOL) and _close(arr, wrong):
                    return failed(_EX1, f"{message} (case: {case}, Dh = {x.shape[-1]}.)")
            if np.isfinite(arr).all():
                pairs = np.abs(arr - expected).reshape(x.shape[0], -1, 2).max(axis=(0, 2))  # (Dh/2,) per pair
                bad = [int(p) for p in np.flatnonzero(pairs > _TOL)]
                if bad and bad[0] > 0:
                    return failed(_EX1, f"Pair 0 is right but pairs {bad} are not (case: {case}): check the "
                                        "frequencies, theta_i = base^(-2i/Dh) for pair i.")  # fmt: skip
        wrong = compare_arrays(_EX1, got, expected, what=f"Your rotated x ({case})", atol=_TOL, rtol=_TOL)
        if wrong is not None:
            return wrong
    return passed(_EX1, "Pairs (x[..., 0::2], x[..., 1::2]) turned by positions[:, None] * theta[None, :] with "
                        "theta = base ** (-torch.arange(0, Dh, 2) / Dh): the same as "
                        "selfattn.positions.apply_rope(x, positions, layout='interleaved').")  # fmt: skip


# --------------------------------------------------------------------------------------------------
# 8.2 ALiBi slopes
# --------------------------------------------------------------------------------------------------


def _geometric(H: int, shift: int = 1) -> np.ndarray:
    return np.array([2.0 ** (-8.0 * (h + shift) / H) for h in range(H)])


def _slope_mistakes(H: int) -> list[tuple[np.ndarray, str]]:
    n = 2 ** int(math.floor(math.log2(H)))
    above = 2 ** int(math.ceil(math.log2(H)))
    mistakes = [
        (_geometric(H), f"For H = {H}, which is not a power of two, you used the geometric sequence "
                        f"2^(-8/H), 2^(-16/H), ... for all {H} heads. The rule of the paper's released code: the {n} slopes of the "
                        f"closest power of two below ({n} heads), then every other slope of {2 * n} heads "
                        f"(2^(-8/{2 * n}), 2^(-24/{2 * n}), ...) until there are {H}."),
        (_geometric(H, 0), "Your first slope is 2^0 = 1: the exponents are -8(h+1)/H for h = 0 .. H-1, so the "
                           "first head's slope is 2^(-8/H) and the last one's 2^(-8)."),
        (_geometric(H)[::-1].copy(), "Your slopes are in reverse order: head 0 gets the largest slope 2^(-8/H), "
                                     "the last head the smallest, 2^(-8)."),
        (_geometric(above)[:H], f"You took the first {H} slopes of {above} heads (the power of two above): the "
                                f"paper starts from the power of two below, {n}, then adds every other slope of "
                                f"{2 * n} heads."),
    ]  # fmt: skip
    if n < H:
        base = _geometric(n)
        extra = _geometric(2 * n)
        mistakes += [
            (np.concatenate([_geometric(n, 0), _geometric(2 * n, 0)[0::2][: H - n]]),
             "Your exponents are off by one: 2^(-8(h+1)/n) for h = 0 .. n-1, so no slope is 2^0 = 1."),
            (np.concatenate([base, extra[1::2][: H - n]]),
             f"Your extra {H - n} slopes repeat the first ones: of the {2 * n}-head slopes take the odd-numbered "
             f"ones, 2^(-8·1/{2 * n}), 2^(-8·3/{2 * n}), ... ([0::2] counted from 0), which fall between the "
             f"{n} you have."),
            (np.concatenate([base, extra[: H - n]]),
             f"Your extra {H - n} slopes are the first ones of {2 * n} heads, not every other one: take "
             f"2^(-8·1/{2 * n}), 2^(-8·3/{2 * n}), ... ([0::2] counted from 0)."),
        ]  # fmt: skip
    return mistakes


@checker(_EX2)
def check_alibi_slopes(fn):
    """``fn(n_heads)`` must return ALiBi's H slopes (H,): for H a power of two ``2^(-8(h+1)/H)``,
    otherwise those of the power of two n below, then every other slope of 2n heads, H in all."""
    if is_empty_stub(fn):
        return not_attempted(_EX2)
    for H in (8, 4, 1, 12, 6, 5):
        got = call_learner(_EX2, fn, H)
        expected = _pos.alibi_slopes(H).numpy()
        arr = to_numpy(got)
        if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all() and np.allclose(
                arr, expected, rtol=1e-6, atol=1e-9):
            continue
        if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all():
            for wrong, message in _slope_mistakes(H):
                if not np.allclose(wrong, expected, rtol=1e-6) and np.allclose(arr, wrong, rtol=1e-6, atol=1e-9):
                    return failed(_EX2, message)
        if arr is not None and arr.shape != expected.shape:
            return failed(_EX2, f"For n_heads = {H} return {H} slopes, shape ({H},); got shape {arr.shape}.")
        wrong = compare_arrays(_EX2, got, expected, what=f"Your slopes for n_heads = {H}", atol=1e-9, rtol=1e-6)
        if wrong is not None:
            return wrong
    return passed(_EX2, "The geometric sequence for the power of two n <= H, then every other slope of 2n "
                        "heads: the same as selfattn.positions.alibi_slopes(H), also for 12, 6 and 5 heads.")  # fmt: skip


# --------------------------------------------------------------------------------------------------
# 8.3 causal attention with RoPE
# --------------------------------------------------------------------------------------------------


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> np.ndarray:
    T = q.shape[0]
    return ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), ref.causal_mask(T))


def _attention_cases():
    gen = torch.Generator().manual_seed(83)
    return [tuple(torch.randn(T, 8, generator=gen, dtype=torch.float64) * 2 for _ in range(3)) for T in (6, 9)]


@checker(_EX3)
def check_rope_attention(fn):
    """``fn(q, k, v)`` for q, k, v (T, Dh) float64 at positions 0 .. T-1 must return causal attention
    ``softmax(mask(rope(q) rope(k)^T / sqrt(Dh))) v`` (T, Dh), RoPE in the interleaved layout, base 10000,
    on queries and keys only."""
    if is_empty_stub(fn):
        return not_attempted(_EX3)
    for q, k, v in _attention_cases():
        T = q.shape[0]
        p = torch.arange(T)

        def rope(x, layout="interleaved", p=p):
            return _pos.apply_rope(x, p, layout=layout)

        got = call_learner(_EX3, fn, q.clone(), k.clone(), v.clone())
        expected = _attention(rope(q), rope(k), v)
        arr = to_numpy(got)
        if _close(arr, expected):
            continue
        if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all():
            mistakes = [
                (_attention(rope(q), rope(k), rope(v)),
                 "You rotated the values too. RoPE turns queries and keys only, so that their dot product sees "
                 "the offset; the values are what is read and must stay as they are."),
                (_attention(rope(q), k, v), "You rotated the queries but not the keys: rotate both, so that the "
                                            "score q_m . k_n depends on m - n."),
                (_attention(q, rope(k), v), "You rotated the keys but not the queries: rotate both, so that the "
                                            "score q_m . k_n depends on m - n."),
                (_attention(q, k, v), "Your output is plain causal attention: RoPE was not applied to q and k."),
                (_attention(rope(q, "half"), rope(k, "half"), v),
                 "You used the half layout (pairs (i, i + Dh/2)); this exercise asks for the interleaved layout, "
                 "pairs (2i, 2i+1), as in exercise 8.1."),
                (ref.scaled_dot_product_attention(rope(q).numpy(), rope(k).numpy(), v.numpy()),
                 "Every query reads every key, including later ones: apply the causal mask (key j <= query i)."),
                (ref.scaled_dot_product_attention(rope(q).numpy(), rope(k).numpy(), v.numpy(), ref.causal_mask(T),
                                                  scale=1.0),
                 "The scores are not scaled: divide them by sqrt(Dh) before the softmax."),
            ]  # fmt: skip
            for wrong, message in mistakes:
                if not np.allclose(wrong, expected, atol=_TOL, rtol=_TOL) and _close(arr, wrong):
                    return failed(_EX3, message)
        wrong = compare_arrays(_EX3, got, expected, what=f"Your output (T = {T})", atol=_TOL, rtol=_TOL)
        if wrong is not None:
            return wrong
    return passed(_EX3, "Rotate q and k (never v) by their positions, then causal scaled dot-product attention: "
                        "RotaryPositions.rotate does the first step for a whole (B, H, T, Dh) batch.")  # fmt: skip


# --------------------------------------------------------------------------------------------------
# 8.4 the score depends on m - n only
# --------------------------------------------------------------------------------------------------


@checker(_EX4)
def check_relative_score(fn):
    """``fn(q, k, m, n)`` for q, k (Dh,) float64 and int positions must return the RoPE score
    ``rope(q, m) . rope(k, n)`` (a number; interleaved layout, base 10000). The check then moves both
    positions by the same amount and asks the function again: the score must not change."""
    if is_empty_stub(fn):
        return not_attempted(_EX4)
    gen = torch.Generator().manual_seed(84)
    q, k = torch.randn(8, generator=gen, dtype=torch.float64), torch.randn(8, generator=gen, dtype=torch.float64)
    for m, n in ((5, 2), (2, 5), (9, 9), (30, 1)):
        exact = float(_pos.apply_rope(q[None], [m], layout="interleaved")[0] @ _pos.apply_rope(k[None], [n],
                                                                                              layout="interleaved")[0])
        values = []
        for shift in (0, 7, 100):
            got = call_learner(_EX4, fn, q.clone(), k.clone(), m + shift, n + shift)
            arr = to_numpy(got)
            if arr is None or arr.size != 1:
                shape = None if arr is None else arr.shape
                return failed(_EX4, f"Return one number (a 0-d tensor or a float); got {type(got).__name__} "
                                    f"of shape {shape}.")  # fmt: skip
            value = float(arr.reshape(()))
            if not math.isfinite(value):
                return failed(_EX4, f"Your score for m = {m + shift}, n = {n + shift} is {value}.")
            values.append(value)
        plain = float(q @ k)
        if not math.isclose(values[0], exact, rel_tol=_TOL, abs_tol=_TOL):
            if m != n and math.isclose(values[0], plain, rel_tol=_TOL, abs_tol=_TOL):
                return failed(_EX4, f"For m = {m}, n = {n} your score is q . k, as if both sat at position 0: "
                                    "rotate q by m and k by n first.")  # fmt: skip
            swapped = float(_pos.apply_rope(q[None], [n], layout="interleaved")[0]
                            @ _pos.apply_rope(k[None], [m], layout="interleaved")[0])  # fmt: skip
            if m != n and math.isclose(values[0], swapped, rel_tol=_TOL, abs_tol=_TOL):
                return failed(_EX4, f"For m = {m}, n = {n} you rotated q by n and k by m: q goes with the "
                                    "query position m, k with the key position n.")  # fmt: skip
            return failed(_EX4, f"For m = {m}, n = {n} the score should be {exact:.6f}; yours is {values[0]:.6f}.")
        moved = [v for v in values[1:] if not math.isclose(v, values[0], rel_tol=_TOL, abs_tol=_TOL)]
        if moved:
            return failed(_EX4, f"Shifting both positions changed your score ({values[0]:.6f} -> {moved[0]:.6f}): "
                                "with RoPE it depends on m - n only. Are both rotated with the same frequencies?")  # fmt: skip
    return passed(_EX4, "The score rope(q, m) . rope(k, n) = q . R((n - m) theta) k depends on m - n only: "
                        "shifting both positions by 7 or 100 left it unchanged (claim 23).")  # fmt: skip
