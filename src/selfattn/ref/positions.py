"""NumPy float64 reference for position information: sinusoids, RoPE, ALiBi (chapter 08).

Written from the papers, not from the torch module (``selfattn.positions``), and in other words
where the maths allows it:

- RoPE twice over: as complex multiplication of feature pairs, ``z_i * exp(i m theta_i)`` (Su et al.
  2021, section 3.2.1, eq. 12, the 2-D case applied to every pair), in :func:`apply_rope`; and as
  the explicit block-diagonal (Dh, Dh) rotation matrix R(m) of Su et al. section 3.2.2, eq. 14-15, in
  :func:`rope_rotation_matrix`, for the chapter's derivation (eq. 16)
  ``q_m . k_n = q^T R(m)^T R(n) k = q^T R(n - m) k``;
- the sinusoidal shift matrix as a block-diagonal stack of 2x2 rotations from the angle-addition
  formulas;
- the NTK-aware base from the condition that defines it (the slowest frequency is divided by the
  scale factor), not from its closed form;
- ALiBi's slopes as a geometric sequence whose first term and ratio are both ``2^(-8/n)``
  (Press et al. 2022, section 3).

Introduced in chapter 08. Every function has the name and meaning of the torch function it checks.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import require_array, require_positive_int

__all__ = [
    "sinusoidal_encoding",
    "sinusoidal_shift_matrix",
    "rope_frequencies",
    "rope_rotation_matrix",
    "apply_rope",
    "rope_interleaved_to_half",
    "ntk_scaled_base",
    "alibi_slopes",
    "alibi_bias",
]

LAYOUTS = ("interleaved", "half")


def _even(name: str, value) -> int:
    value = require_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (features come in pairs); got {value}")
    return value


def _number(name: str, value, *, minimum: float, strict: bool) -> float:
    """A finite real > minimum (strict) or >= minimum; TypeError for a non-number."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{name} must be a real number; got {value!r} ({type(value).__name__})")
    value = float(value)
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        raise ValueError(
            f"{name} must be a finite number {'>' if strict else '>='} {minimum:g}; got {value!r}"
        )
    return value


def _integer(name: str, value, *, minimum: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value}")
    return int(value)


def _positions(name: str, positions) -> np.ndarray:
    """(T,) float64 array of finite positions."""
    p = require_array(name, positions)
    if p.ndim != 1:
        raise ValueError(f"{name} must have shape (T,) (1 dims); got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError(f"{name} must be finite; got {p}")
    return p


def _layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return layout


# --- sinusoids (Vaswani et al. 2017, section 3.5) --------------------------------------------------


def sinusoidal_encoding(
    n_positions: int, d_model: int, *, base: float = 10000.0, start: int = 0
) -> np.ndarray:
    """``PE[p, 2i] = sin(p / base^(2i/D))``, ``PE[p, 2i+1] = cos(p / base^(2i/D))``, (T, D) float64.

    Rows are positions ``start .. start+T-1``; pair i has wavelength ``2 pi base^(2i/D)``.

    Raises:
        TypeError / ValueError: ``n_positions`` or ``d_model`` not a positive int, ``d_model`` odd,
        ``base`` not a finite number > 1, ``start`` not an int >= 0.

    Source: Vaswani et al. 2017, section 3.5; chapter 08.
    """
    T = require_positive_int("n_positions", n_positions)
    D = _even("d_model", d_model)
    base = _number("base", base, minimum=1.0, strict=True)
    start = _integer("start", start, minimum=0)
    pe = np.empty((T, D))
    pos = np.arange(start, start + T, dtype=np.float64)[:, None]  # (T, 1)
    wavelength_over_2pi = np.power(base, np.arange(0, D, 2) / D)[None, :]  # (1, D/2)
    pe[:, 0::2] = np.sin(pos / wavelength_over_2pi)  # (T, D/2)
    pe[:, 1::2] = np.cos(pos / wavelength_over_2pi)
    return pe


def sinusoidal_shift_matrix(offset: int, d_model: int, *, base: float = 10000.0) -> np.ndarray:
    """(D, D) float64 matrix M with ``PE[p + offset] = PE[p] @ M`` for every p (claim 22).

    From ``sin(x + a) = sin x cos a + cos x sin a`` and ``cos(x + a) = cos x cos a - sin x sin a``:
    the row vector ``[sin x, cos x]`` times ``[[cos a, -sin a], [sin a, cos a]]`` gives
    ``[sin(x+a), cos(x+a)]``, one such block per frequency, ``a = offset / base^(2i/D)``.

    Raises:
        TypeError: ``offset`` not an int. TypeError / ValueError: ``d_model`` not a positive even
        int, ``base`` not a finite number > 1.

    Source: Vaswani et al. 2017, section 3.5; chapter 08.
    """
    offset = _integer("offset", offset)
    D = _even("d_model", d_model)
    base = _number("base", base, minimum=1.0, strict=True)
    M = np.zeros((D, D))
    for i in range(D // 2):
        a = offset / base ** (2 * i / D)
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [
            [math.cos(a), -math.sin(a)],
            [math.sin(a), math.cos(a)],
        ]
    return M


# --- RoPE (Su et al. 2021) -----------------------------------------------------------------------


def rope_frequencies(d_head: int, *, base: float = 10000.0) -> np.ndarray:
    """``theta_i = 1 / base^(2i/Dh)``, i = 0 .. Dh/2-1, (Dh/2,) float64, radians per position.

    Raises:
        TypeError / ValueError: ``d_head`` not a positive even int, ``base`` not a finite number > 1.

    Source: Su et al. 2021, eq. 15; chapter 08.
    """
    Dh = _even("d_head", d_head)
    base = _number("base", base, minimum=1.0, strict=True)
    return 1.0 / np.power(base, 2.0 * np.arange(Dh // 2) / Dh)


def rope_rotation_matrix(
    position: float,
    d_head: int,
    *,
    base: float = 10000.0,
    layout: str = "half",
    interpolation: float = 1.0,
) -> np.ndarray:
    """The (Dh, Dh) orthogonal matrix R(m) with ``rope(x)_m = R(m) @ x`` (column vectors).

    For ``layout="interleaved"`` it is Su et al.'s block-diagonal matrix (eq. 15): block i, on
    features (2i, 2i+1), is ``[[cos m theta_i, -sin m theta_i], [sin m theta_i, cos m theta_i]]``.
    For ``layout="half"`` the same 2x2 rotations act on features (i, i + Dh/2). Position m is divided
    by ``interpolation`` first. ``R(m)^T R(n) = R(n - m)``, so ``(R(m) q) . (R(n) k) = q^T R(n - m) k``
    depends on ``n - m`` alone (claim 23).

    Raises:
        TypeError / ValueError: ``position`` not a finite real number, ``d_head`` not a positive even
        int, ``base`` not > 1, unknown ``layout``, ``interpolation`` < 1.

    Source: Su et al. 2021, section 3.2.2, eq. 14-16; chapter 08.
    """
    m = _number("position", position, minimum=-math.inf, strict=True)
    Dh = _even("d_head", d_head)
    layout = _layout(layout)
    s = _number("interpolation", interpolation, minimum=1.0, strict=False)
    theta = rope_frequencies(Dh, base=base)
    R = np.zeros((Dh, Dh))
    for i, t in enumerate(theta):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + Dh // 2)
        angle = (m / s) * t
        R[a, a], R[a, b] = math.cos(angle), -math.sin(angle)
        R[b, a], R[b, b] = math.sin(angle), math.cos(angle)
    return R


def apply_rope(
    x, positions, *, base: float = 10000.0, layout: str = "half", interpolation: float = 1.0
) -> np.ndarray:
    """RoPE as complex multiplication: pair i of row m, read as ``z = a + i b``, becomes ``z e^{i m theta_i}``.

    Args:
        x: (..., T, Dh) real array, Dh even. positions: (T,) real positions of the rows.
        base: frequency base. layout: ``"interleaved"`` (pair i = features 2i, 2i+1: the paper, GPT-J)
            or ``"half"`` (pair i = features i, i + Dh/2: GPT-NeoX, Llama). interpolation: s >= 1,
            positions are divided by s (position interpolation, Chen et al. 2023).

    Returns:
        (..., T, Dh) float64.

    Raises:
        TypeError: ``x`` or ``positions`` not real numbers (a torch tensor is refused). ValueError:
        ``x`` with fewer than 2 dims or an odd or empty last axis, ``positions`` not of shape (T,), unknown
        ``layout``, ``base`` <= 1, ``interpolation`` < 1.

    Source: Su et al. 2021, section 3.2.1, eq. 12 (the complex form of one pair), with the frequencies
    of eq. 15; chapter 08.
    """
    x = require_array("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., T, Dh) (at least 2 dims); got shape {x.shape}")
    T, Dh = x.shape[-2:]
    if Dh % 2 or Dh == 0:  # checked here: rope_frequencies would name d_head, which the caller did not pass
        raise ValueError(
            f"x's last axis Dh must be even and > 0 (features are rotated in pairs); got shape {x.shape}"
        )
    layout = _layout(layout)
    p = _positions("positions", positions)
    if p.shape != (T,):
        raise ValueError(
            f"positions must have shape (T,) = ({T},) to match x of shape {x.shape}; got shape {p.shape}"
        )
    s = _number("interpolation", interpolation, minimum=1.0, strict=False)
    theta = rope_frequencies(Dh, base=base)  # (Dh/2,)
    h = Dh // 2
    if layout == "interleaved":
        z = x[..., 0::2] + 1j * x[..., 1::2]  # (..., T, Dh/2) complex
    else:
        z = x[..., :h] + 1j * x[..., h:]
    z = z * np.exp(1j * np.outer(p / s, theta))  # (..., T, Dh/2) * (T, Dh/2)
    out = np.empty(x.shape)
    if layout == "interleaved":
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
    else:
        out[..., :h], out[..., h:] = z.real, z.imag
    return out


def rope_interleaved_to_half(d_head: int) -> np.ndarray:
    """(Dh,) int64 ``perm`` with ``x_half = x_interleaved[..., perm]``: even features, then odd ones.

    Read the Dh features as Dh/2 rows of (first, second) of each pair, and transpose: all the firsts,
    then all the seconds.

    Raises:
        TypeError / ValueError: ``d_head`` not a positive even int.

    Source: chapter 08.
    """
    Dh = _even("d_head", d_head)
    return np.arange(Dh, dtype=np.int64).reshape(Dh // 2, 2).T.reshape(Dh)


def ntk_scaled_base(base: float, factor: float, d_head: int) -> float:
    """The base b' whose slowest RoPE frequency is the old one divided by ``factor`` (NTK-aware scaling).

    The slowest frequency is ``b^(-(Dh-2)/Dh)``; asking ``b'^(-(Dh-2)/Dh) = b^(-(Dh-2)/Dh) / factor``
    gives ``b' = (b^((Dh-2)/Dh) * factor)^(Dh/(Dh-2))``, solved here as written.

    Raises:
        TypeError / ValueError: ``base`` not a finite number > 1, ``factor`` < 1, ``d_head`` not an
        even int > 2.

    Source: bloc97 2023 ("NTK-aware scaled RoPE"); Peng et al. 2023 (YaRN), section 3.1; chapter 08.
    """
    base = _number("base", base, minimum=1.0, strict=True)
    factor = _number("factor", factor, minimum=1.0, strict=False)
    Dh = _even("d_head", d_head)
    if Dh <= 2:
        raise ValueError(
            f"d_head must be > 2 for NTK scaling (the slowest frequency is base^-(Dh-2)/Dh); got {Dh}"
        )
    e = (Dh - 2) / Dh
    return (base**e * factor) ** (1.0 / e)


# --- ALiBi (Press et al. 2022) ---------------------------------------------------------------------


# The head-count bound of alibi_slopes, the torch path's (selfattn.positions.ALIBI_MAX_HEADS), kept here
# because the reference shares no code with the torch path.
ALIBI_MAX_HEADS = 1 << 16


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's head slopes, (H,) float64.

    For n heads, n a power of two: the geometric sequence whose first term and ratio are both
    ``2^(-8/n)`` (8 heads: 1/2, 1/4, ..., 1/256). Otherwise: the n slopes of the largest power of two
    n < H, then the first H - n of the slopes at odd places (1st, 3rd, ...) of the 2n-head sequence.
    ``n_heads`` is at most ``ALIBI_MAX_HEADS`` = 2**16, as in the torch path (real models have at most
    a few hundred heads; 2**26 heads took seconds and over a GB without a bound).

    Raises:
        TypeError / ValueError: ``n_heads`` not a positive int, or above ``ALIBI_MAX_HEADS``
        (checked before anything is allocated).

    Source: Press et al. 2022, section 3 (and the non-power-of-two rule of its released code); chapter 08.
    """
    H = require_positive_int("n_heads", n_heads)
    if H > ALIBI_MAX_HEADS:
        raise ValueError(f"n_heads must be at most ALIBI_MAX_HEADS = {ALIBI_MAX_HEADS} (2**16, far above any "
                         f"real model's head count); got {H}")

    def geometric(n: int) -> np.ndarray:
        r = 2.0 ** (-8.0 / n)
        return r * r ** np.arange(n)  # r, r^2, ..., r^n = 2^-8

    n = 1
    while 2 * n <= H:
        n *= 2
    return np.concatenate([geometric(n), geometric(2 * n)[::2][: H - n]])


def alibi_bias(slopes, q_positions, k_positions) -> np.ndarray:
    """``bias[h, i, j] = -slopes[h] * (q_positions[i] - k_positions[j])``, (H, T, S) float64.

    Raises:
        TypeError / ValueError: ``slopes`` not a (H,) array of reals, positions not (T,) / (S,) arrays.

    Source: Press et al. 2022, section 3 (figure 3); chapter 08.
    """
    m = require_array("slopes", slopes)
    if m.ndim != 1:
        raise ValueError(f"slopes must have shape (H,) (1 dims); got shape {m.shape}")
    q = _positions("q_positions", q_positions)
    k = _positions("k_positions", k_positions)
    distance = np.subtract.outer(q, k)  # (T, S): how far back key j is from query i
    return -np.multiply.outer(m, distance)  # (H,) outer (T, S) -> (H, T, S)
