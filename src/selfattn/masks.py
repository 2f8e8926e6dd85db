"""Boolean keep-masks (True = may attend) and converters from the other conventions.

One convention everywhere in this package, the one of
``torch.nn.functional.scaled_dot_product_attention``: a boolean mask broadcastable to
(B, H, T, S) whose True entries may be attended to. The book's page "Mask conventions" compares
the libraries. Introduced in chapter 04 (causal) and chapter 05 (padding).
"""

from __future__ import annotations

import torch

from ._validate import require_positive_int, require_rank, require_tensor, shape_of

__all__ = [
    "ALIGNMENTS",
    "causal_mask",
    "padding_mask",
    "from_blocked_mask",
    "from_hf_attention_mask",
]

ALIGNMENTS = ("top_left", "bottom_right")


def causal_mask(T: int, S: int | None = None, *, alignment: str | None = None, device=None) -> torch.Tensor:
    """Boolean keep-mask of shape (T, S): True where query i may attend to key j.

    With ``T == S`` (or ``S`` omitted) it is lower triangular, diagonal included (every token sees
    itself). With ``T != S`` there are two sensible answers and no silent default:

    - ``"top_left"``: query i sees keys ``j <= i`` (``torch.tril(ones(T, S))``; what
      ``F.scaled_dot_product_attention(is_causal=True)`` does);
    - ``"bottom_right"``: query i sees keys ``j <= i + S - T``: the T queries are the newest of S
      positions, as when decoding with a KV cache.

    Args:
        T: number of query positions (> 0).
        S: number of key positions (> 0); default ``T``.
        alignment: ``"top_left"`` or ``"bottom_right"``; required when ``T != S``.
        device: where to build the mask.

    Returns:
        ``torch.bool`` tensor of shape (T, S).

    Raises:
        TypeError / ValueError: ``T`` or ``S`` not a positive int; ``alignment`` missing when
        ``T != S`` or not one of :data:`ALIGNMENTS`.

    Source: chapter 04.
    """
    T = require_positive_int("T", T)
    S = T if S is None else require_positive_int("S", S)
    if alignment is not None and alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS} or None; got {alignment!r}")
    if T != S and alignment is None:
        raise ValueError(
            f"a causal mask with T={T} queries and S={S} keys needs an explicit alignment: "
            "'top_left' (query i sees keys <= i) or 'bottom_right' (query i sees keys <= i + S - T)"
        )
    offset = S - T if alignment == "bottom_right" else 0
    i = torch.arange(T, device=device)[:, None]  # (T, 1)
    j = torch.arange(S, device=device)[None, :]  # (1, S)
    return j <= i + offset  # (T, S)


def padding_mask(lengths, S: int | None = None, *, device=None) -> torch.Tensor:
    """Key-padding keep-mask of shape (B, 1, 1, S) from the true length of each sequence.

    Key j of sequence b may be attended to iff ``j < lengths[b]``. The two singleton axes broadcast
    over heads and queries.

    Args:
        lengths: 1-D integer tensor or sequence of B lengths, each in [0, S].
        S: padded length; default ``max(lengths)``.

    Raises:
        TypeError: lengths not integers (or not a sequence). ValueError: empty, not 1-D, negative, or
        longer than S.

    Source: chapter 05.
    """
    expected = "a 1-D integer tensor or sequence of B lengths"
    if lengths is None or isinstance(lengths, (str, bytes)):
        raise TypeError(f"lengths must be {expected}; got {lengths!r} ({type(lengths).__name__})")
    try:
        lengths = torch.as_tensor(lengths, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"lengths must be {expected}; got {lengths!r} ({type(lengths).__name__})") from err
    if lengths.numel() == 0:
        raise ValueError(f"lengths must not be empty: give one length per sequence; got shape {shape_of(lengths)}")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers; got dtype {lengths.dtype}")
    require_rank("lengths", lengths, 1, "(B,)")
    if int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0; got {lengths.tolist()}")
    max_len = int(lengths.max())
    if S is None and max_len == 0:
        raise ValueError(f"lengths are all 0, so the padded length S would be 0 and the mask could not be "
                         f"applied to any key: pass S, or at least one length > 0; got {lengths.tolist()}")
    S = max_len if S is None else require_positive_int("S", S)
    if max_len > S:
        raise ValueError(f"every length must be <= S={S}; got lengths {lengths.tolist()}")
    keep = torch.arange(S, device=lengths.device)[None, :] < lengths[:, None]  # (B, S)
    return keep[:, None, None, :]  # (B, 1, 1, S)


def from_blocked_mask(blocked: torch.Tensor) -> torch.Tensor:
    """Convert a True-means-blocked boolean mask (``nn.MultiheadAttention``'s ``attn_mask`` and
    ``key_padding_mask``) into this package's True-means-may-attend convention.

    A float mask is refused: ``nn.MultiheadAttention`` adds float masks to the scores, so pass one
    as ``bias=`` instead.

    Raises:
        TypeError: ``blocked`` is not a boolean tensor.

    Source: chapter 05; the book's page "Mask conventions".
    """
    require_tensor("blocked", blocked)
    if blocked.dtype != torch.bool:
        raise TypeError(
            f"blocked must be a boolean tensor (True = blocked); got dtype {blocked.dtype}. "
            "A float attn_mask is additive: pass it as bias=... instead."
        )
    return ~blocked


def from_hf_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Convert a Hugging Face ``attention_mask`` of shape (B, S) (1 = real token, 0 = padding,
    integer dtype) into a keep-mask of shape (B, 1, 1, S).

    Raises:
        TypeError: not a tensor, or a floating dtype.
        ValueError: not 2-D, or holds values other than 0 and 1.

    Source: chapter 05; chapter 07 uses it to run the real model.
    """
    require_tensor("attention_mask", attention_mask)
    require_rank("attention_mask", attention_mask, 2, "(B, S)")
    if attention_mask.dtype.is_floating_point:
        raise TypeError(
            f"attention_mask must be an integer or boolean (B, S) tensor of 0/1; got dtype {attention_mask.dtype}"
        )
    values = attention_mask.to(torch.int64)
    if bool(((values != 0) & (values != 1)).any()):
        raise ValueError(
            f"attention_mask must hold only 0 and 1; got values {torch.unique(values).tolist()} "
            f"in a tensor of shape {shape_of(attention_mask)}"
        )
    return (values == 1)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
