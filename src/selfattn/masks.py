"""Boolean keep-masks (True = may attend) and converters from the other conventions.

One convention everywhere in this package, the one of
``torch.nn.functional.scaled_dot_product_attention``: a boolean mask broadcastable to
(B, H, T, S) whose True entries may be attended to. The book's page "Mask conventions" compares
the libraries. Introduced in chapter 04 (causal, packed documents, prefix-LM) and chapter 05 (padding).

Each mask also comes as a *mask_mod*, a function ``mask_mod(b, h, q_idx, kv_idx) -> bool`` of the
batch, head, query and key indices, FlexAttention's way of describing a mask (Dong et al. 2024):
True = keep, like the boolean masks here. :func:`materialize_mask_mod` turns one into the tensor;
``selfattn.efficient.tiled_attention(..., mask_mod=...)`` skips the tiles it hides.
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
    "document_causal_mask",
    "document_positions",
    "prefix_lm_mask",
    "causal_mask_mod",
    "document_mask_mod",
    "prefix_lm_mask_mod",
    "sliding_window_mask_mod",
    "materialize_mask_mod",
    "evaluate_mask_mod",
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


def _require_doc_ids(doc_ids) -> torch.Tensor:
    """``doc_ids`` as an integer tensor of shape (T,) or (B, T), T > 0 (the checks of the packing masks)."""
    require_tensor("doc_ids", doc_ids)
    if doc_ids.dtype.is_floating_point or doc_ids.dtype.is_complex or doc_ids.dtype == torch.bool:
        raise TypeError(f"doc_ids must be an integer tensor (one document id per token); got dtype {doc_ids.dtype}")
    if doc_ids.ndim not in (1, 2) or doc_ids.shape[-1] == 0:
        raise ValueError(f"doc_ids must have shape (T,) or (B, T) with T > 0; got shape {shape_of(doc_ids)}")
    return doc_ids


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal keep-mask for packed sequences: query i may attend to key j iff
    ``j <= i`` and both tokens belong to the same document.

    Several documents packed into one row (to fill a fixed length without padding) must not read
    each other: a plain causal mask lets every token of document 2 read all of document 1.

    Args:
        doc_ids: integer tensor (T,) or (B, T): the document id of each token, e.g.
            ``[0, 0, 0, 1, 1, 2]``; tokens with equal ids are one document (usually contiguous).

    Returns:
        ``torch.bool`` tensor (T, T) for 1-D ``doc_ids``, (B, 1, T, T) for 2-D (broadcasts over heads).

    Raises:
        TypeError: not a tensor, or not an integer dtype. ValueError: not 1-D or 2-D, or T = 0.

    Source: Krell et al. 2021 (packing without cross-contamination); chapter 04.
    """
    doc_ids = _require_doc_ids(doc_ids)
    T = doc_ids.shape[-1]
    same = doc_ids[..., :, None] == doc_ids[..., None, :]  # (..., T, 1) == (..., 1, T) -> (..., T, T)
    keep = same & causal_mask(T, device=doc_ids.device)
    return keep if doc_ids.ndim == 1 else keep[:, None]  # (B, T, T) -> (B, 1, T, T)


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 at the start of every document of a packed row.

    A document starts wherever the id differs from the previous token's (and at token 0), so
    ``[0, 0, 0, 1, 1, 2]`` gives ``[0, 1, 2, 0, 1, 0]``: each document sees the positions it
    would have alone.

    Args:
        doc_ids: integer tensor (T,) or (B, T).

    Returns:
        int64 tensor of the shape of ``doc_ids``.

    Raises:
        TypeError / ValueError: as :func:`document_causal_mask`.

    Source: Krell et al. 2021; chapter 04.
    """
    doc_ids = _require_doc_ids(doc_ids)
    T = doc_ids.shape[-1]
    t = torch.arange(T, device=doc_ids.device).expand(doc_ids.shape)  # (..., T)
    starts = torch.ones(doc_ids.shape, dtype=torch.bool, device=doc_ids.device)
    starts[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]  # a new document begins here
    # the index of the latest document start at or before t: a running maximum of the start indices
    first = torch.cummax(torch.where(starts, t, 0), dim=-1).values
    return t - first


def prefix_lm_mask(T: int, prefix_len: int, *, device=None) -> torch.Tensor:
    """Prefix-LM keep-mask (T, T): bidirectional over the first ``prefix_len`` positions, causal after.

    Query i may attend to key j iff ``j <= i`` or ``j < prefix_len``: every token reads the whole
    prefix (the input, seen at once), and the tokens after it are generated left to right.
    ``prefix_len = 0`` is the causal mask; ``prefix_len = T`` is full (encoder) attention.

    Args:
        T: sequence length (> 0). prefix_len: int in [0, T].

    Returns:
        ``torch.bool`` tensor (T, T).

    Raises:
        TypeError: ``prefix_len`` not an int. ValueError: ``T`` not positive, ``prefix_len`` outside [0, T].

    Source: Raffel et al. 2020 (T5), section 3.2.1, "prefix LM"; Wang et al. 2022; chapter 04.
    """
    T = require_positive_int("T", T)
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int):
        raise TypeError(f"prefix_len must be an int in [0, T={T}]; got {prefix_len!r} ({type(prefix_len).__name__})")
    if not 0 <= prefix_len <= T:
        raise ValueError(f"prefix_len must be in [0, T={T}]; got {prefix_len}")
    j = torch.arange(T, device=device)[None, :]  # (1, T)
    return causal_mask(T, device=device) | (j < prefix_len)  # (T, T)


# mask_mods: functions of (b, h, q_idx, kv_idx). They are called with broadcastable int64 index
# tensors (tiled_attention, materialize_mask_mod) or with scalars under torch.vmap (FlexAttention),
# so they use only elementwise operations and indexing, no Python branching on values.

def causal_mask_mod(b, h, q_idx, kv_idx):
    """The causal mask as a mask_mod: key ``kv_idx`` is visible iff ``kv_idx <= q_idx``. Source: chapter 04."""
    return kv_idx <= q_idx


def document_mask_mod(doc_ids: torch.Tensor):
    """The mask_mod of :func:`document_causal_mask`: ``doc_ids`` (B, T) or (T,) (one row for every b).

    Returns ``mask_mod(b, h, q_idx, kv_idx) = (kv_idx <= q_idx) & (doc[b, q_idx] == doc[b, kv_idx])``.
    Raises as :func:`document_causal_mask`. Source: Krell et al. 2021; Dong et al. 2024; chapter 04.
    """
    doc_ids = _require_doc_ids(doc_ids)
    if doc_ids.ndim == 1:
        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (doc_ids[q_idx] == doc_ids[kv_idx])
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])
    return mask_mod


def prefix_lm_mask_mod(prefix_len: int):
    """The mask_mod of :func:`prefix_lm_mask`: ``(kv_idx <= q_idx) | (kv_idx < prefix_len)``.

    Raises:
        TypeError / ValueError: ``prefix_len`` not an int >= 0.

    Source: Raffel et al. 2020; chapter 04.
    """
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int):
        raise TypeError(f"prefix_len must be an int >= 0; got {prefix_len!r} ({type(prefix_len).__name__})")
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be an int >= 0; got {prefix_len}")

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < prefix_len)
    return mask_mod


def sliding_window_mask_mod(window: int):
    """Causal sliding window as a mask_mod: ``q_idx - window < kv_idx <= q_idx`` (each query sees
    itself and the ``window - 1`` keys before it).

    Raises:
        TypeError / ValueError: ``window`` not a positive int.

    Source: Beltagy et al. 2020 (Longformer); Child et al. 2019; chapter 04.
    """
    window = require_positive_int("window", window)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return mask_mod


def materialize_mask_mod(mask_mod, B: int, H: int, T: int, S: int, *, device=None) -> torch.Tensor:
    """The (B, H, T, S) boolean keep-mask that ``mask_mod`` describes, evaluated on the index grid.

    ``mask_mod`` is called once, with int64 index tensors b (B, 1, 1, 1), h (1, H, 1, 1),
    q_idx (1, 1, T, 1), kv_idx (1, 1, 1, S); its result must be a boolean tensor broadcastable to
    (B, H, T, S). (``torch.nn.attention.flex_attention.create_mask`` gives the same tensor by
    ``vmap``; the tests compare the two.)

    Raises:
        TypeError: ``mask_mod`` not callable, or its result not a boolean tensor. ValueError: a
        result that does not broadcast to (B, H, T, S); sizes not positive ints.

    Source: Dong et al. 2024 (FlexAttention's mask_mod); chapter 04.
    """
    sizes = [require_positive_int(n, v) for n, v in (("B", B), ("H", H), ("T", T), ("S", S))]
    keep = evaluate_mask_mod(mask_mod, *(torch.arange(n, device=device) for n in sizes))
    return keep.expand(*sizes)


def evaluate_mask_mod(mask_mod, b_idx, h_idx, q_idx, kv_idx) -> torch.Tensor:
    """``mask_mod`` on the grid of the 1-D int64 index tensors ``b_idx`` (B,), ``h_idx`` (H,),
    ``q_idx`` (bq,), ``kv_idx`` (bk,), checked: a boolean tensor broadcastable to (B, H, bq, bk).

    Raises:
        TypeError: ``mask_mod`` not callable or its result not a boolean tensor. ValueError: a
        result that does not broadcast to (B, H, bq, bk).

    Source: chapter 04 (used by :func:`materialize_mask_mod` and ``tiled_attention``).
    """
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be a callable mask_mod(b, h, q_idx, kv_idx) -> bool tensor; "
                        f"got {type(mask_mod).__name__}")
    target = (len(b_idx), len(h_idx), len(q_idx), len(kv_idx))
    keep = mask_mod(b_idx[:, None, None, None], h_idx[None, :, None, None],
                    q_idx[None, None, :, None], kv_idx[None, None, None, :])
    what = (f"mask_mod(b, h, q_idx, kv_idx) on the grid b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, bq, 1), "
            f"kv_idx (1, 1, 1, bk) with (B, H, bq, bk) = {target}")
    if not isinstance(keep, torch.Tensor):
        raise TypeError(f"{what} must return a boolean torch.Tensor (True = keep); got {type(keep).__name__}")
    if keep.dtype != torch.bool:
        raise TypeError(f"{what} must return a boolean tensor (True = keep); got dtype {keep.dtype}")
    shape = tuple(keep.shape)
    if len(shape) > 4 or any(n not in (1, t) for n, t in zip(shape[::-1], target[::-1], strict=False)):
        raise ValueError(f"{what} must return a tensor broadcastable to {target}; got shape {shape}")
    return keep
