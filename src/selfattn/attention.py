"""Scaled dot-product attention in torch, and a single attention head as an ``nn.Module``.

The function keeps the package's contracts (book page "Mask conventions"): boolean keep-masks applied by replacement before
the softmax, zero rows (never NaN) for queries that see nothing, scaling by ``sqrt(d_head)``,
float32 arithmetic for half-precision inputs. Introduced in chapter 03; masks in chapter 04.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ._validate import (
    require_attention_tensors,
    require_bool_mask,
    require_broadcastable,
    require_dtype,
    require_flag,
    require_min_rank,
    require_positive_int,
    require_probability,
    require_rank,
    require_scale,
    require_scores_fit,
    require_tensor,
    shape_of,
)

__all__ = ["scaled_dot_product_attention", "masked_softmax", "AttentionConfig", "SelfAttention"]

_HALF = (torch.float16, torch.bfloat16)


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis where only ``keep`` entries take part.

    A row with no kept entry gives all zeros, and finite zero gradients: the masked scores are
    replaced (not added to) by -inf, the row maximum of an empty row is taken as 0, and the
    division is guarded.

    Args:
        scores: (..., T, S) floating tensor. keep: boolean keep-mask broadcastable to it, or None.

    Returns:
        ``weights`` with the shape and dtype of ``scores``; each row sums to 1 (or is all zeros).
        A row whose kept entries include a NaN (or +inf) is NaN on its kept entries and 0 on the
        others. An empty last axis (S = 0) gives an empty result of that shape, as
        ``selfattn.ref.softmax``.

    Raises:
        TypeError: ``scores`` not a floating tensor, ``keep`` not a boolean tensor.
        ValueError: ``scores`` 0-d (no axis to normalise over; as ``selfattn.ref.softmax``), ``keep``
        does not broadcast to the shape of ``scores``.

    Source: chapter 04.
    """
    require_tensor("scores", scores)
    if not scores.dtype.is_floating_point:
        raise TypeError(f"scores must be a floating-point tensor; got dtype {scores.dtype}")
    if scores.dim() == 0:
        raise ValueError("scores must have at least one axis, (..., T, S) or (S,), the last normalised; "
                         "got a 0-d tensor (shape ())")
    if keep is not None:
        require_tensor("keep", keep)
        require_bool_mask("keep", keep)
        require_broadcastable("keep", keep, scores.shape, "the shape of scores")
    return _masked_softmax(scores, keep)


def _masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """:func:`masked_softmax` without the argument checks (its callers have made them)."""
    if scores.shape[-1] == 0:  # nothing to normalise: an empty result, as torch.softmax and selfattn.ref.softmax
        return torch.softmax(scores, dim=-1)
    hidden = None if keep is None else ~keep
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()  # the max is a constant shift: no gradient needed
    # only an empty row (max -inf) is shifted by 0; a +inf or NaN score must give NaN (as torch.softmax and
    # selfattn.ref.softmax do), not a row that looks like valid weights
    row_max = torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)
    e = torch.exp(scores - row_max)  # exp(-inf) = 0 exactly
    total = e.sum(dim=-1, keepdim=True)
    weights = e / torch.where(total == 0, torch.ones_like(total), total)  # not `total > 0`: a NaN total stays NaN
    # A visible NaN (or +inf) makes its row's total NaN, and 0 / NaN would give the hidden keys NaN
    # weights: they stay 0. Always applied (a no-op on finite rows, where hidden weights are 0 / total = 0):
    # asking whether a total is NaN would be a device-to-host sync and a graph break under torch.compile.
    if hidden is not None:
        weights = weights.masked_fill(hidden, 0.0)
    return weights


def _zero_unseen(q, k, v, keep):
    """Zero the queries that see no key and the keys and values that no query may see.

    0 * NaN = NaN in IEEE arithmetic, so a NaN or inf stored at a padded position would otherwise
    reach the output and the gradients through the matrix products even with weight 0. Only
    positions outside every visible pair are touched, so visible data is read unchanged.
    """
    if keep is None:
        return q, k, v
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    row_seen = keep.any(dim=-1).expand(q.shape[:-1])  # (..., T, S) -> (..., T): does query i see any key?
    col_seen = keep.any(dim=-2).expand(k.shape[:-1])  # (..., T, S) -> (..., S): may any query read key j?
    q = torch.where(row_seen[..., None], q, zero)
    k = torch.where(col_seen[..., None], k, zero)
    v = torch.where(col_seen[..., None], v, zero)
    return q, k, v


def _seen_matmul(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in which a non-finite entry of ``b`` reaches only the rows that may see it.

    ``a`` (..., T, S), ``b`` (..., S, D), ``keep`` bool broadcastable to (..., T, S): may row i read
    row j of ``b``? In IEEE arithmetic 0 * NaN = NaN, so a NaN in ``b[j]`` would reach every row i,
    even one with ``a[i, j] = 0`` because the mask hides j from i. The rows that may not see a
    non-finite entry get the product of the finite entries instead, which is what they would get
    if it had never been stored.
    """
    bad = ~torch.isfinite(b)  # (..., S, D)
    clean = a @ torch.where(bad, torch.zeros((), dtype=b.dtype, device=b.device), b)  # (..., T, D)
    reach = (keep.to(a.dtype) @ bad.to(a.dtype)) > 0  # (..., T, S) @ (..., S, D): does row i see a bad b[j, d]?
    return torch.where(reach, a @ b, clean)


class _MaskedScores(torch.autograd.Function):
    """``q @ k^T`` whose backward lets a NaN or inf stored in q or k reach only the gradients of
    the pairs that ``keep`` allows.

    The forward is the plain product (the caller replaces the hidden scores). Autograd's own
    backward, ``dq = dS k`` and ``dk = dS^T q``, computes 0 * NaN = NaN for a hidden pair (dS = 0)
    and so spreads a NaN key to the gradients of queries that never saw it. Differentiable again
    (its backward is made of torch operations).
    """

    @staticmethod
    def forward(ctx, q, k, keep):
        ctx.save_for_backward(q, k, keep)
        return q @ k.transpose(-2, -1)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)

    @staticmethod
    def backward(ctx, d_scores):
        q, k, keep = ctx.saved_tensors
        keep = keep.expand(d_scores.shape)  # a broadcast mask (e.g. (B, 1, 1, S)) as full (..., T, S): a view
        d_scores = torch.where(keep, d_scores, torch.zeros((), dtype=d_scores.dtype, device=d_scores.device))
        dq = _seen_matmul(d_scores, k, keep)  # (..., T, S) @ (..., S, Dh) -> (..., T, Dh)
        dk = _seen_matmul(d_scores.transpose(-2, -1), q, keep.transpose(-2, -1))  # (..., S, T) @ (..., T, Dh)
        return dq, dk, None


def _scores(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``q @ k^T`` (..., T, S); through :class:`_MaskedScores` whenever a mask hides pairs. Its forward
    is the same product, so the forward costs nothing more; only its backward guards the gradients
    (no data-dependent branch: that would be a device-to-host sync and a graph break)."""
    if keep is None or not torch.is_grad_enabled() or not (q.requires_grad or k.requires_grad):
        return q @ k.transpose(-2, -1)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    # Eager on the CPU there is no host to sync with: finite q and k (the common case) take the plain
    # product, whose backward is one product per gradient instead of _MaskedScores' guarded three.
    if (q.device.type == "cpu" and not torch.compiler.is_compiling()
            and bool(torch.isfinite(q).all() & torch.isfinite(k).all())):
        return q @ k.transpose(-2, -1)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    return _MaskedScores.apply(q, k, keep)


def _read_values(weights: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``weights @ v``, except that a non-finite value reaches only the rows that may see it.

    In IEEE arithmetic 0 * NaN = NaN, so a NaN stored at position j would spread to every row,
    even to queries that must not see j (e.g. a future position under a causal mask). When v
    holds a non-finite entry, the product is taken with those entries zeroed, and only the
    (row, column) outputs whose visible keys include a non-finite value read the raw product.
    """
    if keep is None:
        return weights @ v  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    # On an accelerator, or while torch.compile traces, the guarded product is always taken (on finite
    # values it equals ``weights @ v``): asking whether v is finite would be a device-to-host sync and a
    # graph break. In eager mode on the CPU there is no host to sync with, and the question costs one
    # pass over v, against two more matrix products (measured ~1.9x slower for a causal T = 256 call).
    if v.device.type == "cpu" and not torch.compiler.is_compiling() and bool(torch.isfinite(v).all()):
        return weights @ v  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    keep = keep.expand(weights.shape)  # a broadcast mask as full (..., T, S), so that it can be a matmul operand
    bad = ~torch.isfinite(v)  # (..., S, Dv)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    clean = weights @ torch.where(bad, zero, v)  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv), finite
    reach = (keep.to(v.dtype) @ bad.to(v.dtype)) > 0  # (..., T, S) @ (..., S, Dv): may row i see a bad value?
    # The non-finite part meets only the weights of rows that may see it, so that in the backward
    # pass (0 * NaN = NaN again) it cannot reach the gradients of the other rows either.
    rows = reach.any(dim=-1, keepdim=True)  # (..., T, 1)
    raw = clean + torch.where(rows, weights, zero) @ torch.where(bad, v, zero)  # (..., T, S) @ (..., S, Dv)
    return torch.where(reach, raw, clean)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
):
    """``softmax(q k^T * scale + bias, masked) v`` (Vaswani et al. 2017, eq. 1).

    Same argument order as ``torch.nn.functional.scaled_dot_product_attention`` and the same mask
    convention (True = may attend), but written out so that every step can be read, and
    returning the weights on request.

    Args:
        q: queries, shape (..., T, Dh), typically (B, H, T, Dh).
        k: keys, shape (..., S, Dh).
        v: values, shape (..., S, Dv). q, k and v must have the same leading axes: unlike torch's
            function, a k or v of batch size 1 is not broadcast against q (expand it first).
        mask: optional ``torch.bool`` keep-mask broadcastable to (..., T, S). A float mask is
            refused (pass an additive one as ``bias``).
        bias: optional additive float tensor broadcastable to (..., T, S).
        scale: score multiplier; default ``1 / sqrt(Dh)``, the per-head key width, never d_model.
            A scale <= 1 multiplies q before the product, a larger one the product, so that no
            intermediate exceeds the logits' own terms: finite logits stay finite in float32 (e.g.
            q, k ~ 1e19 with scale ~ 1e-34, logits ~ 1e5).
        dropout_p: dropout probability on the weights. Applied whenever > 0, as in torch; modules
            pass 0 in eval mode.
        return_weights: also return the (..., T, S) weights.

    Returns:
        ``context`` (..., T, Dv) in the dtype of ``q``; with ``return_weights``, also ``weights``
        (..., T, S) (float32 for half-precision inputs). Queries with no visible key get zero rows.
        A NaN or inf stored at a query, key or value reaches neither the outputs nor the gradients
        of the rows that ``mask`` hides it from, nor a key or value gradient through a pair that
        ``mask`` hides (a pair hidden only by a -inf ``bias`` is not protected this way).

    Raises:
        TypeError: inputs not tensors or of different dtypes, a mask that is not boolean,
        ``return_weights`` not a bool.
        ValueError: wrong ranks, mismatched shapes, a mask or bias that does not broadcast to
        (..., T, S), a non-positive scale, dropout_p outside [0, 1).
        MemoryError: one (..., T, S) scores tensor (float32 for half inputs) would need more bytes
        than the device's total memory (the GPU's, or the machine's RAM); raised before anything is
        allocated, naming the shapes and the bytes (``selfattn.efficient.tiled_attention`` never
        holds the scores).

    Source: chapter 03; masking chapter 04.
    """
    return_weights = require_flag("return_weights", return_weights)
    require_attention_tensors(q, k, v)
    for name, x in (("mask", mask), ("bias", bias)):
        if x is not None and isinstance(x, torch.Tensor) and x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}); got {x.device}")
    require_scale(scale)
    require_probability("dropout_p", dropout_p)
    T, S = q.shape[-2], k.shape[-2]
    target = tuple(q.shape[:-2]) + (T, S)
    if mask is not None:
        require_tensor("mask", mask)
        require_bool_mask("mask", mask)
        require_min_rank("mask", mask, 2, "(..., T, S)")
        require_broadcastable("mask", mask, target, "(..., T, S) =")
    if bias is not None:
        require_tensor("bias", bias)
        if not bias.dtype.is_floating_point:
            raise TypeError(f"bias must be a floating tensor added to the scores; got dtype {bias.dtype}")
        require_broadcastable("bias", bias, target, "(..., T, S) =")
    require_scores_fit(f"q {shape_of(q)} and k {shape_of(k)}", q.shape[:-2], T, S,
                       torch.float32 if q.dtype in _HALF else q.dtype, q.device)  # before any allocation
    context, weights = _attend(q, k, v, mask, bias, scale, dropout_p)
    return (context, weights) if return_weights else context


def _attend(q, k, v, mask, bias, scale, dropout_p):
    """:func:`scaled_dot_product_attention` without the argument checks (its callers have made
    them, e.g. once per ``generate`` call): ``(context, weights)``. No data-dependent branch, so no
    device-to-host sync and no graph break under ``torch.compile``."""
    T = q.shape[-2]
    out_dtype = q.dtype
    if out_dtype in _HALF:  # scores, softmax and accumulation in float32
        q, k, v = q.float(), k.float(), v.float()
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    q, k, v = _zero_unseen(q, k, v, mask)
    # Where the scale goes decides what can overflow. q @ k^T first and then * scale overflowed for
    # finite logits when scale < 1: q, k ~ 1e19 in float32 with scale 1e-34 give q . k = inf (past
    # 3.4e38) where the logits are ~1e5, and inf - inf = NaN in the softmax. So a scale <= 1 (the
    # default 1 / sqrt(Dh) among them) multiplies q first, as the tiled path does ((q * scale) . k,
    # each |q * scale| <= |q|), and a scale > 1 multiplies the product (|q . k| < |logit| there):
    # no intermediate is larger than the logit's own terms q_d k_d scale.
    if scale <= 1.0:
        scores = _scores(q * scale, k, mask)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    else:
        scores = _scores(q, k, mask) * scale  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    weights = _masked_softmax(scores, mask)  # (..., T, S), rows sum to 1 (or 0 if nothing visible)
    if dropout_p > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout_p, training=True)
    if mask is None or T == 1:
        # One query row (a decode step): _zero_unseen has zeroed every value it may not see, so every
        # value left is visible to it and the plain product is the guarded one.
        context = weights @ v  # (..., 1, S) @ (..., S, Dv) -> (..., 1, Dv)
    else:
        context = _read_values(weights, v, mask)  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    return context.to(out_dtype), weights


@dataclass(frozen=True)
class AttentionConfig:
    """Sizes of a single attention head, validated at construction.

    Attributes:
        d_model: width D of the input vectors (> 0).
        d_head: width Dh of queries, keys and values (> 0).
        bias: whether the projections W_Q, W_K, W_V have bias vectors.
    """

    d_model: int
    d_head: int
    bias: bool = False

    def __post_init__(self):
        require_positive_int("d_model", self.d_model)
        require_positive_int("d_head", self.d_head)
        require_flag("bias", self.bias)


class SelfAttention(nn.Module):
    """One head of self-attention with its own W_Q, W_K, W_V, each of shape (D, Dh).

    ``Q = X W_Q``, ``K = X W_K``, ``V = X W_V``; ``context = softmax(Q K^T / sqrt(Dh)) V``. The
    weights are stored as (D, Dh) matrices so the code reads like the maths (``X @ W_Q``), not
    like ``nn.Linear``'s transposed (out, in) layout.

    Args:
        config: an :class:`AttentionConfig`.

    Shapes:
        forward(X: (B, T, D) or (T, D), mask broadcastable to (B, T, T)) -> context (B, T, Dh)
        (and weights (B, T, T) with ``return_weights=True``).

    Source: chapter 03 (claim 3: Q, K and V are three learned projections of the same X).
    """

    def __init__(self, config: AttentionConfig, generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(config, AttentionConfig):
            raise TypeError(f"config must be an AttentionConfig; got {type(config).__name__}")
        self.config = config
        D, Dh = config.d_model, config.d_head
        std = 1.0 / math.sqrt(D)  # keeps the projections' outputs at the scale of X
        self.W_Q = nn.Parameter(torch.randn(D, Dh, generator=generator) * std)
        self.W_K = nn.Parameter(torch.randn(D, Dh, generator=generator) * std)
        self.W_V = nn.Parameter(torch.randn(D, Dh, generator=generator) * std)
        if config.bias:
            self.b_Q = nn.Parameter(torch.zeros(Dh))
            self.b_K = nn.Parameter(torch.zeros(Dh))
            self.b_V = nn.Parameter(torch.zeros(Dh))
        else:
            self.register_parameter("b_Q", None)
            self.register_parameter("b_K", None)
            self.register_parameter("b_V", None)

    def project(self, X: torch.Tensor):
        """Return Q, K, V, each (..., T, Dh), from X (..., T, D)."""
        require_tensor("X", X)
        if X.ndim not in (2, 3):
            require_rank("X", X, 3, "(B, T, D) or (T, D)")
        if X.shape[-1] != self.config.d_model:
            raise ValueError(
                f"X must have last dim d_model={self.config.d_model}; got shape {shape_of(X)}"
            )
        if X.shape[-2] == 0:
            raise ValueError(f"X must hold at least one position (T > 0) in (B, T, D) or (T, D); got shape {shape_of(X)}")
        require_dtype("X", X, self.W_Q.dtype)
        Q = X @ self.W_Q  # (B, T, D) @ (D, Dh) -> (B, T, Dh)
        K = X @ self.W_K
        V = X @ self.W_V
        if self.b_Q is not None:
            Q, K, V = Q + self.b_Q, K + self.b_K, V + self.b_V
        return Q, K, V

    def forward(self, X: torch.Tensor, mask: torch.Tensor | None = None, *, return_weights: bool = False):
        return_weights = require_flag("return_weights", return_weights)
        Q, K, V = self.project(X)
        return scaled_dot_product_attention(Q, K, V, mask, return_weights=return_weights)
