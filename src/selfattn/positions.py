"""Where is each token? Position information for attention: sinusoidal, learned, RoPE, ALiBi, none.

Attention by itself is blind to order: permuting the positions of X permutes the output the same way
(claim 21, chapter 08). A model learns order only from something that differs by position. There are
three places to put it:

- **added to the input** (absolute): a vector per position added to the token embedding, either
  fixed sinusoids (:func:`sinusoidal_encoding`, Vaswani et al. 2017, section 3.5) or a learned table
  (:class:`LearnedPositions`, as in BERT, MiniLM and chapter 14's first GPT);
- **rotating queries and keys** (relative by construction): RoPE (:func:`apply_rope`, Su et al. 2021)
  turns each (q, k) pair of features by an angle proportional to the position, so that
  ``q_m . k_n`` depends only on ``m - n`` (claim 23);
- **biasing the scores** (relative): ALiBi (:func:`alibi_bias`, Press et al. 2022) subtracts
  ``slope_h * (m - n)`` from every score of head h;

or nowhere (:class:`NoPositions`, "NoPE"): a causal mask alone already breaks the symmetry.

The scheme classes (:class:`LearnedPositions`, :class:`SinusoidalPositions`,
:class:`RotaryPositions`, :class:`ALiBiPositions`, :class:`NoPositions`) share one interface, so a
model holds one of them and never branches on its kind:

- ``add_absolute(x, start)``: x (B, T, D) of positions ``start .. start+T-1`` -> x plus whatever the
  scheme adds to the residual stream (nothing for the relative schemes);
- ``rotate(x, start)``: queries or keys (B, H, T, Dh) of positions ``start ..`` -> rotated (RoPE) or
  unchanged;
- ``score_bias(T, S, start)``: the additive (H, T, S) score bias for T queries at positions
  ``start ..`` over S keys at positions ``0 .. S-1`` (ALiBi), or None;
- ``max_positions``: the number of positions the scheme can represent (an int for a learned table,
  None when it is unbounded).

Introduced in chapter 08. The NumPy reference (``selfattn.ref.positions``) has the same functions,
written independently.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import nn

from ._validate import require_positive_int, require_rank, require_tensor, shape_of

__all__ = [
    "sinusoidal_encoding",
    "sinusoidal_shift_matrix",
    "rope_frequencies",
    "rope_cos_sin",
    "apply_rope",
    "rope_interleaved_to_half",
    "ntk_scaled_base",
    "alibi_slopes",
    "alibi_bias",
    "ROPE_LAYOUTS",
    "PositionScheme",
    "LearnedPositions",
    "SinusoidalPositions",
    "RotaryPositions",
    "ALiBiPositions",
    "NoPositions",
    "make_positions",
    "POSITION_SCHEMES",
]

#: The two ways a rotary implementation pairs the features of a head. ``"interleaved"``: pair i is
#: features (2i, 2i+1), as in Su et al. 2021, RoFormer, GPT-J, Mesh-TensorFlow and Meta's and
#: Mistral's reference code for Llama and Mistral. ``"half"``: pair i is features (i, i + Dh/2), as in
#: GPT-NeoX and Hugging Face's ``rotate_half`` (how Llama, Mistral and Qwen run in ``transformers``,
#: whose conversion script permutes each head's W_Q and W_K columns accordingly).
ROPE_LAYOUTS = ("interleaved", "half")


def _require_even(name: str, value) -> int:
    value = require_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (features come in pairs); got {value}")
    return value


def _is_real(value) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


#: Positions beyond 2^53 are not exact in float64, the dtype the angles are computed in.
_MAX_POSITION = 2**53


def _require_base(base) -> float:
    if not _is_real(base):
        raise TypeError(f"base must be a real number > 1; got {base!r} ({type(base).__name__})")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(f"base must be a finite number > 1; got {base!r}")
    return float(base)


def _require_float_dtype(name: str, dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch.dtype (e.g. torch.float32); got {dtype!r}")
    return dtype


def _require_start(start) -> int:
    if not _is_int(start):
        raise TypeError(f"start must be an int >= 0 (the first position); got {start!r} ({type(start).__name__})")
    if not 0 <= start < _MAX_POSITION:
        raise ValueError(f"start must be an int in [0, 2^53) (the first position); got {start!r}")
    return int(start)


def _positions_tensor(positions) -> torch.Tensor:
    """``positions`` (T,) as a float64 tensor on the CPU (ints or floats; interpolated positions are
    fractional). Angles and biases are computed there in float64 and only their results are moved to
    the data's device: Apple's MPS has no float64."""
    if not isinstance(positions, torch.Tensor):
        positions_in = positions
        try:
            positions = torch.as_tensor(positions)
            if positions.is_floating_point():  # Python floats default to float32: convert them exactly
                positions = torch.as_tensor(positions_in, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as error:
            raise TypeError(f"positions must be a (T,) sequence or tensor of real numbers; got {positions!r:.80}"
                            f" ({type(positions).__name__}: {error})") from None
    if positions.ndim != 1:
        raise ValueError(f"positions must have shape (T,) (1 dims); got shape {shape_of(positions)}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must hold real numbers; got dtype {positions.dtype}")
    positions = positions.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(positions).all()):  # a NaN position would turn whole rows of scores to NaN
        bad = positions[~torch.isfinite(positions)]
        raise ValueError(f"positions must be finite; got {bad.numel()} NaN or inf of {positions.numel()} "
                         f"(first: {bad[:3].tolist()})")
    if positions.numel() and float(positions.abs().max()) >= _MAX_POSITION:
        raise ValueError(f"positions must lie in (-2^53, 2^53), where float64 is exact; got max |p| = "
                         f"{float(positions.abs().max()):.3g}")
    return positions


def _require_features(name: str, x, width: int, what: str, layout: str) -> None:
    """``x`` is a floating tensor of shape ``layout`` whose last axis is ``width`` (the scheme's size)."""
    require_tensor(name, x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {x.dtype}")
    if x.ndim < 2 or x.shape[-1] != width:
        raise ValueError(f"{name} must have shape {layout} with {what}={width}; got shape {shape_of(x)}")


# --------------------------------------------------------------------------------------------------
# Sinusoidal encodings (Vaswani et al. 2017, section 3.5)
# --------------------------------------------------------------------------------------------------


def sinusoidal_encoding(
    n_positions: int, d_model: int, *, base: float = 10000.0, start: int = 0, dtype=torch.float32, device=None
) -> torch.Tensor:
    """The fixed encodings ``PE[p, 2i] = sin(p w_i)``, ``PE[p, 2i+1] = cos(p w_i)``, ``w_i = base^(-2i/D)``.

    Args:
        n_positions: T (> 0), the number of positions ``start .. start+T-1``.
        d_model: D (> 0, even). base: 10000 in the paper; the wavelengths run from ``2 pi`` to
            ``2 pi base^((D-2)/D)`` positions (the paper rounds the longest to ``2 pi base``).
        start: the first position (>= 0). dtype, device: of the result (computed in float64 on the
            CPU, then converted).

    Returns:
        (T, D) tensor; row p holds D/2 (sin, cos) pairs, one per frequency ``w_i``.

    Raises:
        ValueError: ``n_positions`` not a positive int, ``d_model`` not a positive even int,
        ``base`` <= 1, ``start`` < 0.

    Source: Vaswani et al. 2017, section 3.5; chapter 08.
    """
    T = require_positive_int("n_positions", n_positions)
    D = _require_even("d_model", d_model)
    base = _require_base(base)
    start = _require_start(start)
    dtype = _require_float_dtype("dtype", dtype)
    p = torch.arange(start, start + T, dtype=torch.float64)  # (T,), on the CPU: float64 exists there
    w = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angles = p[:, None] * w[None, :]  # (T, 1) * (1, D/2) -> (T, D/2)
    pe = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1)  # (T, D/2, 2)
    return pe.reshape(T, D).to(device=device, dtype=dtype)  # (T, D): sin and cos of one frequency side by side


def sinusoidal_shift_matrix(offset: int, d_model: int, *, base: float = 10000.0, dtype=torch.float64) -> torch.Tensor:
    """The (D, D) matrix M with ``PE[p + offset] = PE[p] @ M`` for every position p.

    Each (sin, cos) pair is a point on a circle turned by ``p w_i``; moving ``offset`` positions turns
    it by ``offset w_i`` more, whatever p is: M is block-diagonal with the 2x2 rotations
    ``[[cos a, -sin a], [sin a, cos a]]``, ``a = offset w_i`` (row-vector convention). Claim 22.

    Raises:
        ValueError: ``offset`` not an int, ``d_model`` not a positive even int, ``base`` <= 1.

    Source: Vaswani et al. 2017, section 3.5 ("PE_{pos+k} can be represented as a linear function of
    PE_pos"); chapter 08.
    """
    if not _is_int(offset):
        raise TypeError(f"offset must be an int (a number of positions); got {offset!r} ({type(offset).__name__})")
    offset = int(offset)
    D = _require_even("d_model", d_model)
    base = _require_base(base)
    w = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    a = offset * w
    c, s = torch.cos(a), torch.sin(a)
    M = torch.zeros(D, D, dtype=torch.float64)
    i = torch.arange(0, D, 2)
    # [sin(x+a), cos(x+a)] = [sin x, cos x] @ [[cos a, -sin a], [sin a, cos a]]
    M[i, i], M[i, i + 1] = c, -s
    M[i + 1, i], M[i + 1, i + 1] = s, c
    return M.to(dtype)


# --------------------------------------------------------------------------------------------------
# RoPE (Su et al. 2021)
# --------------------------------------------------------------------------------------------------


def rope_frequencies(d_head: int, *, base: float = 10000.0) -> torch.Tensor:
    """The Dh/2 angular frequencies ``theta_i = base^(-2i/Dh)``, i = 0 .. Dh/2-1, float64 (radians per position).

    Raises:
        ValueError: ``d_head`` not a positive even int, ``base`` <= 1.

    Source: Su et al. 2021, eq. 15; chapter 08.
    """
    Dh = _require_even("d_head", d_head)
    base = _require_base(base)
    return base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)


def rope_cos_sin(positions, d_head: int, *, base: float = 10000.0, interpolation: float = 1.0):
    """``cos`` and ``sin`` of the angles ``(positions / interpolation) * theta_i``, each (T, Dh/2), float64 on the CPU.

    Args:
        positions: (T,) positions (ints, or any reals).
        d_head: Dh (even). base: the frequency base (10000 in the paper and Llama 2; 500000 in Llama 3).
        interpolation: position interpolation factor s >= 1 (Chen et al. 2023): positions are divided
            by s, so that s times the training length falls inside the trained range of angles.

    Raises:
        ValueError: bad ``positions``, ``d_head``, ``base``, or ``interpolation`` < 1.

    Source: Su et al. 2021, eq. 34; Chen et al. 2023 (position interpolation); chapter 08.
    """
    if not _is_real(interpolation):
        raise TypeError(f"interpolation must be a real number >= 1; got {interpolation!r} ({type(interpolation).__name__})")
    if not (math.isfinite(interpolation) and interpolation >= 1):
        raise ValueError(f"interpolation must be a finite number >= 1; got {interpolation!r}")
    theta = rope_frequencies(d_head, base=base)  # (Dh/2,)
    p = _positions_tensor(positions) / float(interpolation)  # (T,)
    angles = p[:, None] * theta[None, :]  # (T, 1) * (1, Dh/2) -> (T, Dh/2), float64 on the CPU
    return torch.cos(angles), torch.sin(angles)


def apply_rope(
    x: torch.Tensor, positions, *, base: float = 10000.0, layout: str = "half", interpolation: float = 1.0
) -> torch.Tensor:
    """Rotate each feature pair of ``x`` by its position's angle: RoPE.

    Pair i, ``(a, b)``, of the row at position m becomes ``(a cos(m theta_i) - b sin(m theta_i),
    a sin(m theta_i) + b cos(m theta_i))``. Applied to queries and keys (never values), it makes every
    score ``q_m . k_n`` a function of ``m - n`` alone (claim 23).

    Args:
        x: (..., T, Dh) queries or keys, floating point; Dh even.
        positions: (T,) the positions of the T rows.
        base: frequency base. layout: ``"half"`` (pairs (i, i+Dh/2): GPT-NeoX, Llama, Hugging Face)
            or ``"interleaved"`` (pairs (2i, 2i+1): the paper, GPT-J). interpolation: as
            :func:`rope_cos_sin`.

    Returns:
        Tensor of the shape and dtype of ``x`` (the angles are computed in float64; half-precision
        inputs are rotated in float32).

    Raises:
        TypeError: ``x`` not a floating tensor. ValueError: Dh odd or 0, ``positions`` not of length T,
        an unknown ``layout``, a bad ``base`` or ``interpolation``.

    Source: Su et al. 2021, section 3.4.2 (eq. 34); Black et al. 2022 (GPT-NeoX's half layout); chapter 08.
    """
    require_tensor("x", x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point tensor; got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., T, Dh) (at least 2 dims); got shape {shape_of(x)}")
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}; got {layout!r}")
    T, Dh = x.shape[-2], x.shape[-1]
    if Dh % 2 or Dh == 0:  # 0: not left to rope_cos_sin, whose error would name its own d_head
        raise ValueError(f"x's last axis Dh must be even and > 0 (features are rotated in pairs); got shape {shape_of(x)}")
    p = _positions_tensor(positions)  # (T,) float64 on the CPU
    if p.shape[0] != T:
        raise ValueError(f"positions must have length T={T} (x has shape {shape_of(x)}); got shape {shape_of(p)}")
    cos, sin = rope_cos_sin(p, Dh, base=base, interpolation=interpolation)  # (T, Dh/2) each
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    cos, sin = cos.to(device=x.device, dtype=work), sin.to(device=x.device, dtype=work)  # (T, Dh/2)
    return _rotate_pairs(x, cos, sin, layout, work)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, work) -> torch.Tensor:
    """The rotation of :func:`apply_rope` (the same operations) with ``cos``, ``sin`` (T, Dh/2) already
    in the ``work`` dtype on x's device; no checks."""
    Dh = x.shape[-1]
    xw = x.to(work)
    if layout == "half":
        a, b = xw[..., : Dh // 2], xw[..., Dh // 2 :]  # (..., T, Dh/2) each: pair i = (i, i + Dh/2)
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    else:
        a, b = xw[..., 0::2], xw[..., 1::2]  # pair i = (2i, 2i + 1)
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)


def rope_interleaved_to_half(d_head: int) -> torch.Tensor:
    """The permutation ``perm`` (Dh,) int64 with ``x_half = x_interleaved[..., perm]``.

    It gathers the even features, then the odd ones: pair (2i, 2i+1) of the interleaved layout becomes
    pair (i, i+Dh/2) of the half layout. So ``apply_rope(x[..., perm], p, layout="half") ==
    apply_rope(x, p, layout="interleaved")[..., perm]``, and because a permutation of features keeps
    every dot product, scores are unchanged. It acts within one head: in a (D, D) projection, apply it
    to each head's block of Dh columns. Porting interleaved weights (Meta's Llama checkpoints) to
    half-layout code (Hugging Face's) without permuting each head's columns of W_Q and W_K rotates the
    wrong pairs, the classic porting bug (tested); Hugging Face's conversion script applies exactly
    this permutation.

    Raises:
        ValueError: ``d_head`` not a positive even int.

    Source: chapter 08.
    """
    Dh = _require_even("d_head", d_head)
    return torch.cat([torch.arange(0, Dh, 2), torch.arange(1, Dh, 2)])


def ntk_scaled_base(base: float, factor: float, d_head: int) -> float:
    """NTK-aware RoPE scaling: the base ``base * factor^(Dh / (Dh - 2))`` for a ``factor`` times longer context.

    Instead of dividing every angle by ``factor`` (position interpolation), raise the base so that the
    slowest frequency is interpolated by ``factor`` while the fastest ones barely change, keeping the
    fine position resolution that short offsets need.

    Raises:
        ValueError: ``base`` <= 1, ``factor`` < 1, ``d_head`` not an even int > 2.

    Source: bloc97 2023 ("NTK-aware scaled RoPE"); Peng et al. 2023 (YaRN), section 3.1; chapter 08.
    """
    base = _require_base(base)
    if not _is_real(factor):
        raise TypeError(f"factor must be a real number >= 1; got {factor!r} ({type(factor).__name__})")
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor must be a finite number >= 1; got {factor!r}")
    Dh = _require_even("d_head", d_head)
    if Dh <= 2:
        raise ValueError(f"d_head must be > 2 for NTK scaling; got {Dh}")
    return base * float(factor) ** (Dh / (Dh - 2))


# --------------------------------------------------------------------------------------------------
# ALiBi (Press et al. 2022)
# --------------------------------------------------------------------------------------------------


# The most heads alibi_slopes accepts: far above any real model (BLOOM-176B has 112), small enough that
# the slopes (a Python list, then a tensor) take milliseconds and half a MiB.
ALIBI_MAX_HEADS = 1 << 16


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The head slopes s_h of ALiBi (the paper's ``m``), (H,) float64.

    For H a power of two, the paper's geometric sequence ``2^(-8/H), 2^(-16/H), ..., 2^(-8)``. The
    paper trains only such models; for other H, the rule of its released code (also BLOOM's
    ``_get_alibi_slopes``): the slopes of the closest power of two below, ``n = 2^floor(log2 H)``,
    followed by every other slope of ``2n`` heads (the odd-numbered ones), up to H in all.

    ``n_heads`` is at most ``ALIBI_MAX_HEADS`` = 2**16 (the slopes are a Python list first: 2**26 heads
    took 40 s and 3.4 GB before this bound; real models have at most a few hundred heads).

    Raises:
        ValueError: ``n_heads`` not a positive int, or above ``ALIBI_MAX_HEADS`` (checked before
        anything is allocated).

    Source: Press et al. 2022, section 3, and the non-power-of-two rule of its released code; chapter 08.
    """
    H = require_positive_int("n_heads", n_heads)
    if H > ALIBI_MAX_HEADS:
        raise ValueError(f"n_heads must be at most ALIBI_MAX_HEADS = {ALIBI_MAX_HEADS} (2**16, far above any "
                         f"real model's head count); got {H}")

    def powers_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    n = 2 ** int(math.floor(math.log2(H)))
    slopes = powers_of_two(n)
    if n < H:
        slopes += powers_of_two(2 * n)[0::2][: H - n]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, q_positions, k_positions) -> torch.Tensor:
    """ALiBi's additive score bias ``bias[h, i, j] = -s_h * (q_i - k_j)``, (H, T, S).

    A key ``d`` positions back costs ``s_h * d`` in head h's score (the paper writes the slope
    ``m``): every head prefers nearby keys, at its own rate. Meant for causal attention (keys after the
    query are masked anyway; there the bias is positive). Adding a constant per query row does not
    change the softmax, so ``-s_h * (q_i - k_j)`` and BLOOM's ``s_h * k_j`` give the same weights
    (tested). Computed in float64 on the CPU; returned on ``slopes``' device, in float64 (float32 on
    Apple's MPS, which has no float64). Differentiable in ``slopes`` (learned slopes get their gradient).

    Args:
        slopes: (H,) head slopes (:func:`alibi_slopes`). q_positions: (T,). k_positions: (S,); Python
            floats are read in float64, exactly.

    Raises:
        TypeError / ValueError: ``slopes`` not a 1-D tensor; positions not 1-D or not finite.

    Source: Press et al. 2022, section 3 (figure 3); chapter 08.
    """
    require_tensor("slopes", slopes)
    require_rank("slopes", slopes, 1, "(H,)")
    if not slopes.dtype.is_floating_point:
        raise TypeError(f"slopes must be a floating tensor of head slopes; got dtype {slopes.dtype}")
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError(f"slopes must be finite; got {slopes.tolist()}")
    q = _positions_tensor(q_positions)  # (T,) float64 on the CPU
    k = _positions_tensor(k_positions)  # (S,)
    offset = q[:, None] - k[None, :]  # (T, 1) - (1, S) -> (T, S): how far back key j is
    s = slopes.to(device="cpu", dtype=torch.float64)  # not detached: learned slopes get their gradient
    bias = -s[:, None, None] * offset[None]  # (H, 1, 1) * (1, T, S) -> (H, T, S)
    return bias.to(device=slopes.device, dtype=torch.float32 if slopes.device.type == "mps" else torch.float64)


# --------------------------------------------------------------------------------------------------
# Schemes: one interface, so that a model holds one and never branches on its kind
# --------------------------------------------------------------------------------------------------


class PositionScheme(nn.Module):
    """Base class: adds nothing, rotates nothing, biases nothing (the behaviour of :class:`NoPositions`).

    Subclasses override what their scheme changes. See the module docstring for the interface.
    """

    #: The scheme's name in :data:`POSITION_SCHEMES`.
    name = "none"

    @property
    def max_positions(self) -> int | None:
        """How many positions the scheme can represent; None when there is no limit."""
        return None

    def check_positions(self, start: int, T: int) -> None:
        """Raise ValueError if positions ``start .. start+T-1`` are beyond :attr:`max_positions`."""
        limit = self.max_positions
        if limit is not None and start + T > limit:
            raise ValueError(
                f"positions {start}..{start + T - 1} exceed the {self.name} position table of "
                f"{limit} rows (max_positions={limit}): a learned table has no row for them"
            )

    def add_absolute(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x (B, T, D) at positions ``start ..`` -> x plus the scheme's absolute encoding (here: x)."""
        return x

    def rotate(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Queries or keys (B, H, T, Dh) at positions ``start ..`` -> rotated (here: unchanged)."""
        return x

    def score_bias(self, T: int, S: int, start: int = 0, *, dtype=torch.float32, device=None):
        """Additive (H, T, S) bias for queries at ``start .. start+T-1`` over keys ``0 .. S-1``, or None."""
        return None


class NoPositions(PositionScheme):
    """No position information at all ("NoPE"): order is visible only through the causal mask.

    Source: Haviv et al. 2022 (transformer language models without positional encodings still learn
    positional information); Kazemnejad et al. 2023; chapter 08.
    """

    name = "none"


class LearnedPositions(PositionScheme):
    """A learned (max_positions, D) table ``weight``; row p is added to the embedding at position p.

    As in BERT, MiniLM (512 rows) and chapter 14's first GPT. It has no row for a position past its
    table, so it cannot run there (:meth:`check_positions` raises): claim 24.

    Args:
        max_positions: rows of the table (> 0). d_model: D (> 0).
        generator: optional torch.Generator for the N(0, 0.02^2) initialisation, so that a model's
            initial weights do not depend on what else drew from the global generator before.

    Source: Gehring et al. 2017; Devlin et al. 2019; chapter 07 and chapter 08.
    """

    name = "learned"

    def __init__(self, max_positions: int, d_model: int, *, generator: torch.Generator | None = None):
        super().__init__()
        self._max = require_positive_int("max_positions", max_positions)
        require_positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.randn(max_positions, d_model, generator=generator) * 0.02)

    @property
    def max_positions(self) -> int:
        return self._max

    def add_absolute(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        _require_features("x", x, self.weight.shape[1], "D", "(B, T, D)")
        start = _require_start(start)
        T = x.shape[-2]
        self.check_positions(start, T)
        return x + self.weight[start : start + T].to(x.dtype)  # (B, T, D) + (T, D), in x's dtype


class SinusoidalPositions(PositionScheme):
    """Fixed sinusoidal encodings (:func:`sinusoidal_encoding`) added to the embedding; any position.

    ``add_absolute(x) = embedding_scale * x + PE``. The encodings have entries of size about 1 (RMS
    ``1/sqrt(2)``), so added to token embeddings initialised small (std 0.02 here, as in BERT and
    GPT-2) they would drown the token's signal; the original Transformer multiplies the embeddings by
    ``sqrt(d_model)`` before adding them (Vaswani et al. 2017, section 3.4), and :func:`make_positions`
    does the same. The default ``embedding_scale=1`` adds the encodings alone.

    Args:
        d_model: D (> 0, even). base: as :func:`sinusoidal_encoding`.
        embedding_scale: finite number > 0 that multiplies ``x`` first.

    Raises:
        ValueError: a bad ``d_model``, ``base`` or ``embedding_scale``.

    Source: Vaswani et al. 2017, sections 3.4 and 3.5; chapter 08.
    """

    name = "sinusoidal"

    def __init__(self, d_model: int, *, base: float = 10000.0, embedding_scale: float = 1.0):
        super().__init__()
        self.d_model = _require_even("d_model", d_model)
        self.base = _require_base(base)
        if isinstance(embedding_scale, bool) or not isinstance(embedding_scale, (int, float)) or not (
            math.isfinite(embedding_scale) and embedding_scale > 0
        ):
            raise ValueError(f"embedding_scale must be a finite number > 0; got {embedding_scale!r}")
        self.embedding_scale = float(embedding_scale)

    def add_absolute(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        _require_features("x", x, self.d_model, "D", "(B, T, D)")
        if x.shape[-2] == 0:
            return self.embedding_scale * x  # no positions: nothing to add
        pe = sinusoidal_encoding(x.shape[-2], self.d_model, base=self.base, start=start, dtype=x.dtype, device=x.device)
        return self.embedding_scale * x + pe  # (B, T, D) + (T, D)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base}, embedding_scale={self.embedding_scale}"


class RotaryPositions(PositionScheme):
    """RoPE on every head's queries and keys (:func:`apply_rope`); any position.

    Args:
        d_head: Dh (even). base: frequency base. layout: ``"half"`` or ``"interleaved"``.
        interpolation: position interpolation factor (1: none).

    Source: Su et al. 2021; chapter 08.
    """

    name = "rope"

    def __init__(self, d_head: int, *, base: float = 10000.0, layout: str = "half", interpolation: float = 1.0):
        super().__init__()
        self.d_head = _require_even("d_head", d_head)
        self.base = _require_base(base)
        if layout not in ROPE_LAYOUTS:
            raise ValueError(f"layout must be one of {ROPE_LAYOUTS}; got {layout!r}")
        self.layout = layout
        rope_cos_sin([0], self.d_head, base=self.base, interpolation=interpolation)  # validates it
        self.interpolation = float(interpolation)
        self._tables: dict = {}  # (device, dtype) -> (cos, sin); not buffers: no state_dict entry, no .to()

    def rotate(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``apply_rope(x, start .. start+T-1)`` with the same numbers, from a cos/sin table kept per
        device and dtype (grown by doubling; computed as :func:`rope_cos_sin`, in float64 on the CPU,
        then converted once): a decode step neither recomputes the angles nor copies them to the device."""
        # Dh is checked here: apply_rope alone would happily rotate a head of another width.
        _require_features("x", x, self.d_head, "Dh", "(B, H, T, Dh)")
        start = _require_start(start)
        T = x.shape[-2]
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        cos, sin = self._table(start + T, x.device, work)  # (N, Dh/2) each, N >= start + T
        return _rotate_pairs(x, cos[start : start + T], sin[start : start + T], self.layout, work)

    def _table(self, n: int, device, dtype):
        """cos and sin of positions 0 .. N-1 (N >= n), (N, Dh/2) each, in ``dtype`` on ``device``."""
        tables = self._tables
        key = (torch.device(device), dtype)
        table = tables.get(key)
        if table is None or table[0].shape[0] < n:
            size = max(n, 2 * (0 if table is None else table[0].shape[0]), 64)
            theta = self.base ** (-torch.arange(0, self.d_head, 2, dtype=torch.float64) / self.d_head)  # (Dh/2,)
            p = torch.arange(size, dtype=torch.float64) / self.interpolation  # (N,), as rope_cos_sin
            angles = p[:, None] * theta[None, :]  # (N, Dh/2), float64 on the CPU
            table = (torch.cos(angles).to(device=device, dtype=dtype), torch.sin(angles).to(device=device, dtype=dtype))
            tables[key] = table
        return table

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, base={self.base}, layout={self.layout!r}, interpolation={self.interpolation}"


class ALiBiPositions(PositionScheme):
    """ALiBi's per-head linear bias on the scores (:func:`alibi_bias`); any position.

    Source: Press et al. 2022; chapter 08.
    """

    name = "alibi"

    def __init__(self, n_heads: int):
        super().__init__()
        # A plain CPU tensor, not a buffer: .to(device) leaves it (and its float64) where it is, and
        # score_bias moves only the finished bias (Apple's MPS has no float64).
        self.slopes = alibi_slopes(n_heads)  # (H,) float64, on the CPU

    def score_bias(self, T: int, S: int, start: int = 0, *, dtype=torch.float32, device=None):
        """The (H, T, S) bias in ``dtype`` on ``device`` (default: the CPU), computed in float64."""
        T, S = require_positive_int("T", T), require_positive_int("S", S)
        start = _require_start(start)
        dtype = _require_float_dtype("dtype", dtype)
        bias = alibi_bias(self.slopes, torch.arange(start, start + T), torch.arange(S))  # (H, T, S), CPU
        return bias.to(dtype=dtype, device=device if device is not None else "cpu")


#: The names :func:`make_positions` accepts.
POSITION_SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")


def make_positions(
    name: str, *, max_positions: int, d_model: int, n_heads: int, rope_base: float = 10000.0
) -> PositionScheme:
    """The scheme called ``name`` (one of :data:`POSITION_SCHEMES`) for a model of these sizes.

    Learned: a (max_positions, d_model) table. Sinusoidal: the encodings, with the embeddings scaled
    by ``sqrt(d_model)`` as in the original Transformer. RoPE: half layout, base ``rope_base``.
    ALiBi: the paper's slopes for ``n_heads``. None: nothing.

    Raises:
        ValueError: an unknown ``name``; ``d_model`` not divisible by ``n_heads``; sizes as the scheme
        classes. TypeError: ``d_model`` or ``n_heads`` not an int.

    Source: chapter 08.
    """
    if name not in POSITION_SCHEMES:
        raise ValueError(f"positions must be one of {POSITION_SCHEMES}; got {name!r}")
    d_model, n_heads = require_positive_int("d_model", d_model), require_positive_int("n_heads", n_heads)
    max_positions = require_positive_int("max_positions", max_positions)
    if d_model % n_heads:
        raise ValueError(f"d_model must be divisible by n_heads; got d_model={d_model}, n_heads={n_heads}")
    d_head = d_model // n_heads
    builders = {
        "learned": lambda: LearnedPositions(max_positions, d_model),
        "sinusoidal": lambda: SinusoidalPositions(d_model, embedding_scale=math.sqrt(d_model)),  # section 3.4
        "rope": lambda: RotaryPositions(d_head, base=rope_base),
        "alibi": lambda: ALiBiPositions(n_heads),
        "none": lambda: NoPositions(),
    }
    return builders[name]()
