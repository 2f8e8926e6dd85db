"""A quantized KV cache: int8 per token, and KIVI's keys per channel and values per token (chapter 11c).

The cache is read in full at every decode step (chapter 11, claim 25), so storing it in fewer bits
shrinks the bytes each step moves. A quantizer maps each group of numbers to integers ``0 .. 2^b - 1``
through the group's own scale and offset (asymmetric, "min/max" quantization) or to ``-127 .. 127``
through its largest magnitude (symmetric int8); the cache stores the integers and, per group, the
scale (and offset) in 16 bits. Which numbers share a group decides the error: a group that holds one
large-magnitude entry spends its whole range on it and rounds the others coarsely.

Keys have *outlier channels*: a few of the Dh features are large in every token (Liu et al. 2024,
KIVI, section 3.1 and figure 2, on Llama-2). Grouping a key's numbers per token
puts each outlier channel in every group; grouping them *per channel* (one channel over G tokens)
keeps the outlier in its own group. Values show no such channels, and the attention output is a
weighted sum of value rows, so an error per token matters there; KIVI quantizes values per token.
KIVI's cache (section 3.3, algorithm 1) therefore quantizes keys per channel in groups of G
tokens and values per token in groups of G channels, and keeps the most recent tokens (a residual of
R, and the keys of the group that is still filling) in full precision. Their experiments use 2 and
4 bits, G = 32 and R = 128 (section 4.1).

:func:`quantize_groups` is the quantizer (quantize and dequantize: the error is what a model reads),
:func:`int8_per_token` and :func:`kivi` the two schemes, :func:`cache_bytes_per_token` their
cost, :class:`QuantizedCache` a cache for :class:`~selfattn.models.gpt.GPT` that stores exact keys
and values but hands the model their quantized versions, and :func:`channel_outlier_ratio` the
statistic behind the choice of axis.

Introduced in chapter 11c (claim 39); the KV cache and its bytes are chapter 11's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import require_positive_int, require_tensor, shape_of
from .streaming import SlidingWindowCache

__all__ = ["quantize_groups", "int8_per_token", "KiviSettings", "kivi", "cache_bytes_per_token",
           "QuantizedCache", "channel_outlier_ratio", "SCHEMES", "standard_schemes", "quantized_kv",
           "attention_error", "quantized_losses", "first_quantized_position", "mean_cache_bytes"]

#: the schemes :class:`QuantizedCache` and :func:`cache_bytes_per_token` know
SCHEMES = ("fp16", "int8 per token", "kivi")


def quantize_groups(x: torch.Tensor, bits: int, dim: int, group_size: int) -> torch.Tensor:
    """Asymmetric min/max quantization of ``x`` in groups of ``group_size`` entries along ``dim``; dequantized.

    Each group maps ``[min, max]`` onto the integers ``0 .. 2^bits - 1`` (scale ``(max - min) /
    (2^bits - 1)``, offset ``min``), rounds to nearest and maps back. A group whose entries are all
    equal is returned exactly. The length along ``dim`` must be a multiple of ``group_size``.

    Args:
        x: a floating tensor. bits: 1 .. 8. dim: the axis the groups run along (-2: tokens of a
            (..., S, Dh) key, one group per channel; -1: channels, one group per token).
        group_size: G (> 0), dividing ``x.shape[dim]``.

    Returns:
        A tensor of ``x``'s shape and dtype: what a model reads back from the cache.

    Raises:
        TypeError / ValueError: ``x`` not a floating tensor; ``bits`` not in 1 .. 8; G not a positive
        int or not dividing the axis.

    Source: Liu et al. 2024 (KIVI), section 2 (eq. 1); Jacob et al. 2018 (asymmetric quantization).
    """
    require_tensor("x", x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating tensor; got dtype {x.dtype}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1 .. 8; got {bits!r}")
    G = require_positive_int("group_size", group_size)
    n = x.shape[dim]
    if n % G:
        raise ValueError(f"group_size {G} must divide x.shape[{dim}] = {n} (x {shape_of(x)})")
    moved = x.movedim(dim, -1)  # (..., n): the grouped axis last
    groups = moved.reshape(*moved.shape[:-1], n // G, G)  # (..., n / G, G)
    lo = groups.amin(-1, keepdim=True)
    hi = groups.amax(-1, keepdim=True)
    levels = 2**bits - 1
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: stored exactly
    q = torch.round((groups - lo) / safe).clamp(0, levels)  # the integers the cache stores
    back = torch.where(scale > 0, q * scale + lo, groups)
    return back.reshape(moved.shape).movedim(-1, dim)


def int8_per_token(x: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per token: each row of (..., S, Dh) scaled by its largest magnitude onto -127 .. 127.

    Returns the dequantized tensor (the shape and dtype of ``x``); an all-zero row stays zero.

    Raises:
        TypeError: ``x`` not a floating tensor.
    """
    require_tensor("x", x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating tensor; got dtype {x.dtype}")
    scale = x.abs().amax(-1, keepdim=True) / 127  # (..., S, 1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / safe).clamp(-127, 127) * safe


@dataclass(frozen=True)
class KiviSettings:
    """KIVI's settings: ``bits`` (1 .. 8), ``group_size`` G (> 0), ``residual`` R (>= 0), and the axes.

    ``key_axis`` / ``value_axis``: ``"channel"`` (groups of G tokens of one channel) or ``"token"``
    (groups of G channels of one token). KIVI: keys per channel, values per token (the defaults);
    the other axes exist to measure why.

    Raises:
        ValueError: a bad size or an unknown axis.
    """

    bits: int = 2
    group_size: int = 32
    residual: int = 128
    key_axis: str = "channel"
    value_axis: str = "token"

    def __post_init__(self):
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be an int in 1 .. 8; got {self.bits!r}")
        require_positive_int("group_size", self.group_size)
        if isinstance(self.residual, bool) or not isinstance(self.residual, int) or self.residual < 0:
            raise ValueError(f"residual must be an int >= 0; got {self.residual!r}")
        for name in ("key_axis", "value_axis"):
            if getattr(self, name) not in ("channel", "token"):
                raise ValueError(f"{name} must be 'channel' or 'token'; got {getattr(self, name)!r}")


def _quantize_axis(x: torch.Tensor, s: KiviSettings, axis: str) -> torch.Tensor:
    """Quantize the (..., S_q, Dh) tokens of ``x`` per channel (S_q a multiple of G) or per token."""
    if axis == "channel":
        return quantize_groups(x, s.bits, -2, s.group_size)
    Dh = x.shape[-1]
    return quantize_groups(x, s.bits, -1, s.group_size if Dh % s.group_size == 0 else Dh)


def kivi(k: torch.Tensor, v: torch.Tensor, settings: KiviSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """What a KIVI cache holding the S tokens of ``k`` and ``v`` (..., S, Dh) hands the model.

    The oldest ``n_q = ((S - R) // G) * G`` tokens (whole groups of G, none of the last R) are
    quantized, keys along ``settings.key_axis`` and values along ``settings.value_axis``; the rest
    are kept exact (KIVI's residual, algorithm 1). A per-token group of G channels falls back to the
    whole row when G does not divide Dh.

    Raises:
        TypeError / ValueError: k, v not floating (..., S, Dh) tensors of one shape prefix.

    Source: Liu et al. 2024 (KIVI), section 3.3 and algorithm 1.
    """
    for name, x in (("k", k), ("v", v)):
        require_tensor(name, x)
        if not x.dtype.is_floating_point or x.dim() < 2:
            raise TypeError(f"{name} must be a floating tensor (..., S, Dh); got {x.dtype} {shape_of(x)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k {shape_of(k)} and v {shape_of(v)} must agree except in the last axis")
    S, G = k.shape[-2], settings.group_size
    n_q = max(0, (S - settings.residual) // G * G)
    if n_q == 0:
        return k, v
    k_q = _quantize_axis(k[..., :n_q, :], settings, settings.key_axis)
    v_q = _quantize_axis(v[..., :n_q, :], settings, settings.value_axis)
    return torch.cat([k_q, k[..., n_q:, :]], -2), torch.cat([v_q, v[..., n_q:, :]], -2)


def cache_bytes_per_token(scheme: str, d_head: int, *, settings: KiviSettings | None = None,
                          n_tokens: int | None = None) -> float:
    """Bytes one token's key and value rows of one head take, scales and offsets counted (16 bits each).

    - ``"fp16"``: ``2 * Dh * 2``;
    - ``"int8 per token"``: ``2 * (Dh + 2)`` (one fp16 scale per row);
    - ``"kivi"``: keys ``Dh * b / 8 + Dh * 4 / G`` (a scale and an offset per channel per G tokens),
      values ``Dh * b / 8 + 4 * (Dh / G)`` (per G channels of a token; one group when G does not
      divide Dh). With ``n_tokens`` = T, the tokens :func:`kivi` keeps exact (the last ``T - n_q``)
      are counted at fp16 and the total is divided by T.

    Raises:
        ValueError: an unknown scheme; ``"kivi"`` without settings; sizes not positive ints.
    """
    Dh = require_positive_int("d_head", d_head)
    if scheme == "fp16":
        return 2.0 * Dh * 2
    if scheme == "int8 per token":
        return 2.0 * (Dh + 2)
    if scheme != "kivi":
        raise ValueError(f"scheme must be one of {SCHEMES}; got {scheme!r}")
    if settings is None:
        raise ValueError("scheme 'kivi' needs settings (a KiviSettings)")
    G, b = settings.group_size, settings.bits
    v_groups = Dh // G if Dh % G == 0 else 1
    quant = Dh * b / 8 + Dh * 4 / G + Dh * b / 8 + 4 * v_groups
    if n_tokens is None:
        return quant
    T = require_positive_int("n_tokens", n_tokens)
    n_q = max(0, (T - settings.residual) // G * G)
    return (n_q * quant + (T - n_q) * 2.0 * Dh * 2) / T


class QuantizedCache(SlidingWindowCache):
    """A KV cache for :class:`~selfattn.models.gpt.GPT` that hands the model quantized keys and values.

    It stores every token exactly (a :class:`~selfattn.inference.streaming.SlidingWindowCache` with a
    window of ``max_tokens`` and keys rotated at their text positions, as a plain cache stores them)
    and at every step returns ``int8_per_token`` of both or :func:`kivi` of the held keys and values:
    what a cache storing the integers would return, since every group is quantized from the same
    numbers each time (a group, once complete, never changes). Keys are quantized after RoPE, as
    stored in the cache (KIVI, section 3.3).

    Args:
        scheme: one of :data:`SCHEMES`. settings: KIVI's (for ``"kivi"``). max_tokens: the longest text.

    Raises:
        ValueError: an unknown scheme; ``"kivi"`` without settings.
    """

    def __init__(self, scheme: str, settings: KiviSettings | None = None, *, max_tokens: int = 4096):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}; got {scheme!r}")
        if scheme == "kivi" and settings is None:
            raise ValueError("scheme 'kivi' needs settings (a KiviSettings)")
        super().__init__(max_tokens, 0, positions="text")
        self.scheme, self.settings = scheme, settings

    def update(self, k_new, v_new, rotate=None):
        K, V = super().update(k_new, v_new, rotate)  # (B, H, S, Dh) exact, oldest first
        if self.scheme == "int8 per token":
            return int8_per_token(K), int8_per_token(V)
        if self.scheme == "kivi":
            return kivi(K, V, self.settings)
        return K.half().to(K.dtype), V.half().to(V.dtype)  # fp16: the baseline rounding


def channel_outlier_ratio(x: torch.Tensor) -> torch.Tensor:
    """Per head: the largest channel's mean magnitude over the median channel's. x (B, H, S, Dh) -> (H,).

    A channel's magnitude is its mean |x| over the batch and the tokens. Near 1-3 for features of
    one scale; large when a few channels carry much larger numbers in every token (KIVI, figure 2).

    Raises:
        TypeError / ValueError: ``x`` not a floating 4-D tensor.
    """
    require_tensor("x", x)
    if x.dim() != 4 or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating (B, H, S, Dh) tensor; got {x.dtype} {shape_of(x)}")
    magnitude = x.abs().mean(dim=(0, 2))  # (H, Dh)
    return magnitude.amax(-1) / magnitude.median(-1).values


def standard_schemes(group_size: int = 32, residual: int = 128) -> dict:
    """The chapter's settings, ``{label: (scheme, settings)}``: fp16, int8 per token, KIVI at 4 and 2
    bits, and KIVI at 2 bits with the other axis for the keys (per token) or for the values (per channel)."""
    G, R = group_size, residual
    return {
        "fp16": ("fp16", None),
        "int8 per token": ("int8 per token", None),
        "KIVI 4-bit": ("kivi", KiviSettings(4, G, R)),
        "KIVI 2-bit": ("kivi", KiviSettings(2, G, R)),
        "2-bit, keys per token": ("kivi", KiviSettings(2, G, R, key_axis="token")),
        "2-bit, values per channel": ("kivi", KiviSettings(2, G, R, value_axis="channel")),
    }


def quantized_kv(k: torch.Tensor, v: torch.Tensor, scheme: str, settings: KiviSettings | None = None):
    """``(k, v)`` (..., S, Dh) as a cache of ``scheme`` hands them back. Raises ValueError: unknown scheme."""
    if scheme == "fp16":
        return k.half().to(k.dtype), v.half().to(v.dtype)
    if scheme == "int8 per token":
        return int8_per_token(k), int8_per_token(v)
    if scheme == "kivi":
        if settings is None:
            raise ValueError("scheme 'kivi' needs settings (a KiviSettings)")
        return kivi(k, v, settings)
    raise ValueError(f"scheme must be one of {SCHEMES}; got {scheme!r}")


def attention_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scheme: str,
                    settings: KiviSettings | None = None, mask: torch.Tensor | None = None) -> float:
    """Relative error ``||context' - context|| / ||context||`` (Frobenius) of attention read from a quantized cache.

    q (B, H, T, Dh), k and v (B, H, S, Dh); ``mask`` as :func:`~selfattn.attention.scaled_dot_product_attention`.
    """
    from ..attention import scaled_dot_product_attention

    exact = scaled_dot_product_attention(q, k, v, mask)
    k_q, v_q = quantized_kv(k, v, scheme, settings)
    approx = scaled_dot_product_attention(q, k_q, v_q, mask)
    return float((approx - exact).norm() / exact.norm())


def first_quantized_position(settings: KiviSettings) -> int:
    """The first query position whose KIVI cache holds a quantized group: ``R + G - 1`` (the cache then
    holds ``R + G`` tokens, and :func:`kivi` quantizes ``n_q = G`` of them; before, it is exact)."""
    return settings.residual + settings.group_size - 1


def mean_cache_bytes(scheme: str, d_head: int, *, settings: KiviSettings | None = None, first: int = 0,
                     end: int) -> float:
    """The mean over decode steps ``p = first .. end - 1`` of the bytes per token (one head, keys and
    values) of the cache the step reads, ``p + 1`` tokens long: :func:`cache_bytes_per_token` with
    ``n_tokens = p + 1`` (KIVI's exact residual counted at fp16). These are the bytes a loss averaged
    over the same positions was measured at.

    Raises:
        ValueError: not ``0 <= first < end``; as :func:`cache_bytes_per_token`.
    """
    if isinstance(first, bool) or not isinstance(first, int) or isinstance(end, bool) or not isinstance(end, int) \
            or not 0 <= first < end:
        raise ValueError(f"need ints 0 <= first < end; got first={first!r}, end={end!r}")
    if scheme != "kivi":
        return cache_bytes_per_token(scheme, d_head, settings=settings)
    return sum(cache_bytes_per_token(scheme, d_head, settings=settings, n_tokens=p + 1)
               for p in range(first, end)) / (end - first)


@torch.no_grad()
def quantized_losses(model, inputs: torch.Tensor, targets: torch.Tensor, schemes: dict, *, first: int = 0) -> dict:
    """Teacher-forced next-token loss (nats per token), token by token through a :class:`QuantizedCache` per layer.

    Args:
        model: a :class:`~selfattn.models.gpt.GPT`. inputs, targets: (B, N) ids.
        schemes: ``{label: (scheme, settings)}`` (:func:`standard_schemes`).
        first: average over positions ``first .. N - 1`` only (default all). A KIVI cache is exact
            before :func:`first_quantized_position`: averaging over those positions dilutes its
            error; report the bytes of the same steps with :func:`mean_cache_bytes`.

    Returns:
        ``{label: mean loss}``, plus ``"exact"``: the cache unquantized (float32), over the same positions.

    Raises:
        ValueError: ``first`` not an int in [0, N).
    """
    from .streaming import _streamed_losses, make_caches

    N = inputs.shape[1]
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < N:
        raise ValueError(f"first must be an int in [0, {N}) (N = inputs.shape[1]); got {first!r}")
    out = {"exact": float(_streamed_losses(model, inputs, targets, make_caches(model, None))[:, first:].mean())}
    for label, (scheme, settings) in schemes.items():
        caches = [QuantizedCache(scheme, settings, max_tokens=N) for _ in model.blocks]
        out[label] = float(_streamed_losses(model, inputs, targets, caches)[:, first:].mean())
    return out
