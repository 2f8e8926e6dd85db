"""Checks for the exercises of chapter 07 (the Transformer block).

Expected values come from NumPy (``selfattn.ref.layer_norm``, ``selfattn.ref.pre_norm_block``,
``selfattn.ref.rms_norm``, ``selfattn.ref.softmax``); typical mistakes are recognised by computing them
too and naming the one the answer matches.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy
from ._judge import judge

__all__ = ["check_layer_norm", "check_pre_norm_block", "check_rms_norm", "check_qk_norm_weights"]

_EPS = 0.1  # large enough that where eps goes changes the result visibly
# A right answer computed in float32 is off by ~3e-7 here and passes; every typical mistake is off by
# far more than this.
_ATOL = 1e-5


def _layer_norm_inputs():
    rng = np.random.default_rng(7)
    B, T, D = 2, 4, 6
    scales = np.array([0.05, 0.3, 1.0, 3.0])[None, :, None]  # some rows with variance far below eps
    x = rng.normal(size=(B, T, D)) * scales + rng.normal(size=(B, T, 1))
    gamma, beta = rng.uniform(0.5, 1.5, size=D), rng.normal(size=D) * 0.5
    return x, gamma, beta


def _layer_norm_variant(
    x, gamma, beta, *, axis=-1, ddof=0, eps_inside=True, affine=True, use_gamma=True, use_beta=True
):
    mean = x.mean(axis=axis, keepdims=True)
    std = x.std(axis=axis, ddof=ddof, keepdims=True)
    normed = (x - mean) / (np.sqrt(std**2 + _EPS) if eps_inside else std + _EPS)
    if not affine:
        return normed
    return (gamma if use_gamma else 1.0) * normed + (beta if use_beta else 0.0)


@checker("7.1 layer normalization")
def check_layer_norm(fn):
    """``fn(x, gamma, beta, eps)`` for a float64 tensor x (B, T, D) and gamma, beta (D,): each
    position's vector normalised over its D features, ``gamma * (x - mean) / sqrt(var + eps) + beta``
    with the biased variance (divide by D)."""
    ex = "7.1 layer normalization"
    x, gamma, beta = _layer_norm_inputs()
    args = (
        torch.from_numpy(x.copy()),
        torch.from_numpy(gamma.copy()),
        torch.from_numpy(beta.copy()),
    )
    got = to_numpy(call_learner(ex, fn, *args, _EPS))
    expected = ref.layer_norm(x, gamma, beta, eps=_EPS)
    if got is not None and got.shape == expected.shape and np.isfinite(got).all():
        mistakes = [
            ({"axis": -2}, "You normalised over the positions (axis -2); layer norm normalises each position's "
                           "vector over its D features (the last axis)."),
            ({"axis": (-2, -1)}, "You normalised over positions and features together; layer norm uses each "
                                 "position's D features only (the last axis)."),
            ({"ddof": 1}, "You used the unbiased variance (divide by D - 1); layer norm divides by D "
                          "(torch.var(..., unbiased=False), or correction=0)."),
            ({"eps_inside": False}, "eps is in the wrong place: divide by sqrt(var + eps), not by std + eps."),
            ({"affine": False}, "The result is normalised but not scaled and shifted: multiply by gamma and add beta."),
            ({"use_beta": False}, "You scaled by gamma but did not add the shift beta."),
            ({"use_gamma": False}, "You added beta but did not multiply by the scale gamma."),
        ]  # fmt: skip
        for kwargs, words in mistakes:
            if np.allclose(got, _layer_norm_variant(x, gamma, beta, **kwargs), atol=_ATOL):
                return failed(ex, words)
    bad = compare_arrays(
        ex, got, expected, what="layer_norm(x, gamma, beta, eps)", atol=_ATOL, rtol=_ATOL
    )
    if bad is not None:
        return bad
    return passed(
        ex,
        "Mean and biased variance over the last axis, eps inside the square root, then gamma and beta.",
    )


def _block_parts(seed: int = 7):
    """A small block's parameters (NumPy) and its four sublayers as callables on torch tensors."""
    rng = np.random.default_rng(seed)
    D, F, H = 8, 16, 2
    p = {name: rng.normal(size=(D, D)) / np.sqrt(D) for name in ("W_Q", "W_K", "W_V", "W_O")}
    p.update(
        {
            name: rng.normal(size=D) * 0.1
            for name in ("b_Q", "b_K", "b_V", "b_O", "ln1_beta", "ln2_beta", "b_2")
        }
    )
    p.update(ln1_gamma=rng.uniform(0.5, 1.5, D), ln2_gamma=rng.uniform(0.5, 1.5, D))
    p.update(
        W_1=rng.normal(size=(D, F)) / np.sqrt(D),
        b_1=rng.normal(size=F) * 0.1,
        W_2=rng.normal(size=(F, D)) / np.sqrt(F),
    )
    eps = 1e-5

    def torch_fn(numpy_fn):
        return lambda x: torch.from_numpy(numpy_fn(to_numpy(x)))

    attn = torch_fn(
        lambda x: ref.multi_head_attention(
            x,
            x,
            p["W_Q"],
            p["W_K"],
            p["W_V"],
            p["W_O"],
            H,
            b_Q=p["b_Q"],
            b_K=p["b_K"],
            b_V=p["b_V"],
            b_O=p["b_O"],
        )
    )
    ffn = torch_fn(lambda x: ref.feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"]))
    ln1 = torch_fn(lambda x: ref.layer_norm(x, p["ln1_gamma"], p["ln1_beta"], eps))
    ln2 = torch_fn(lambda x: ref.layer_norm(x, p["ln2_gamma"], p["ln2_beta"], eps))
    x = rng.normal(size=(2, 5, D))
    return x, p, H, eps, (attn, ffn, ln1, ln2)  # fmt: skip


_EX3 = "7.2 pre-norm block from its parts"
_PRE_PARAMS = ("ln1_gamma", "ln1_beta", "ln2_gamma", "ln2_beta", "W_1", "b_1", "W_2", "b_2")


def _pre_norm_variant(x, p, attn, eps, *, order="pre", res1=True, res2=True, act="gelu", ln2_reads="h",
                      swap_norms=False, ddof=0, res_from_norm=False):
    """The pre-norm block and its usual slips, in NumPy: ``attn`` maps (B, T, D) arrays to (B, T, D)."""
    def ln(v, which):
        g, b = (p["ln2_gamma"], p["ln2_beta"]) if (which == 1) == swap_norms else (p["ln1_gamma"], p["ln1_beta"])
        mean = v.mean(-1, keepdims=True)
        return g * (v - mean) / np.sqrt(v.var(-1, ddof=ddof, keepdims=True) + eps) + b

    def ffn(v):
        z = v @ p["W_1"] + p["b_1"]
        hidden = {"gelu": ref.gelu, "relu": lambda t: np.maximum(t, 0.0), "none": lambda t: t}[act](z)
        return hidden @ p["W_2"] + p["b_2"]

    if order == "post":
        h = ln(x + attn(x), 1)
        return ln(h + ffn(h), 2)
    a = attn(ln(x, 1))
    h = (ln(x, 1) if res_from_norm else x) + a if res1 else a
    f = ffn(ln(h if ln2_reads == "h" else x, 2))
    return h + f if res2 else f  # fmt: skip


@checker(_EX3)
def check_pre_norm_block(fn):
    """``fn(x, attn, p, eps)`` for x (B, T, D) float64, the attention sublayer ``attn`` (a callable
    (B, T, D) -> (B, T, D) on torch tensors) and ``p`` a dict of float64 tensors ``ln1_gamma, ln1_beta,
    ln2_gamma, ln2_beta`` (D,), ``W_1`` (D, F), ``b_1`` (F,), ``W_2`` (F, D), ``b_2`` (D,) must return the
    pre-norm block (GPT-2's order): ``h = x + attn(LN1(x))``, ``out = h + FFN(LN2(h))`` with
    ``FFN(v) = gelu(v W_1 + b_1) W_2 + b_2`` (exact GELU) and layer norms with eps inside the root."""
    x, params, H, eps, parts = _block_parts(seed=11)
    attn_torch = parts[0]
    p = {name: params[name] for name in _PRE_PARAMS}
    p_torch = {name: torch.from_numpy(value.copy()) for name, value in p.items()}
    got = call_learner(_EX3, fn, torch.from_numpy(x.copy()), attn_torch, p_torch, eps)
    expected = ref.pre_norm_block(x, params, H, eps=eps)
    arr = to_numpy(got)
    if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all() and not np.allclose(arr, expected, atol=_ATOL):
        def attn(v):
            return to_numpy(attn_torch(torch.from_numpy(np.ascontiguousarray(v))))

        mistakes = [
            ({"order": "post"}, "This is the post-norm block (add, then normalise: ln(x + attn(x))); the pre-norm "
                                "block normalises the sublayer's input and adds the raw x back: h = x + attn(LN1(x))."),
            ({"res1": False, "res2": False}, "Both residual connections are missing: add each sublayer's output to its "
                                             "input, h = x + attn(LN1(x)) and out = h + FFN(LN2(h))."),
            ({"res1": False}, "The first residual connection is missing: h = x + attn(LN1(x)), not attn(LN1(x))."),
            ({"res2": False}, "The second residual connection is missing: out = h + FFN(LN2(h)), not FFN(LN2(h))."),
            ({"res_from_norm": True}, "The residual adds the normalised input LN1(x); it must add the raw x: "
                                      "h = x + attn(LN1(x)), so that the residual stream is never normalised."),
            ({"ln2_reads": "x"}, "The feed-forward sublayer read LN2(x); it must read LN2(h), the stream after the "
                                 "attention sublayer."),
            ({"act": "none"}, "The feed-forward has no nonlinearity: apply GELU between the two linear maps, "
                              "gelu(v W_1 + b_1) W_2 + b_2."),
            ({"act": "relu"}, "You used ReLU in the feed-forward; this block uses the exact GELU "
                              "(torch.nn.functional.gelu)."),
            ({"swap_norms": True}, "ln1 and ln2 are swapped: ln1's gamma and beta belong to the attention sublayer, "
                                   "ln2's to the feed-forward one."),
            ({"ddof": 1}, "Your layer norms use the unbiased variance (divide by D - 1); layer norm divides by D "
                          "(correction=0), as in exercise 7.1."),
        ]  # fmt: skip
        for kwargs, words in mistakes:
            if np.allclose(arr, _pre_norm_variant(x, p, attn, eps, **kwargs), atol=_ATOL):
                return failed(_EX3, words)
    bad = compare_arrays(_EX3, got, expected, what="The block's output", atol=_ATOL, rtol=_ATOL)
    if bad is not None:
        return bad
    return passed(_EX3, "h = x + attn(LN1(x)); out = h + FFN(LN2(h)): normalise each sublayer's input, "
                        "add its output to the raw stream. This is selfattn.TransformerBlock's forward.")  # fmt: skip


_EX4 = "7.3 RMSNorm"


@checker(_EX4)
def check_rms_norm(fn):
    """``fn(x, g, eps)`` for x (B, T, D) float64 and the gain g (D,) must return RMSNorm,
    ``g * x / sqrt(mean(x**2) + eps)`` over the last axis (no mean subtracted, no shift)."""
    x, g, _ = _layer_norm_inputs()
    eps = _EPS
    got = call_learner(_EX4, fn, torch.from_numpy(x.copy()), torch.from_numpy(g.copy()), eps)
    expected = ref.rms_norm(x, g, eps=eps)
    ms = (x**2).mean(-1, keepdims=True)
    mistakes = [
        (lambda: _layer_norm_variant(x, g, np.zeros_like(g)), "You subtracted the mean: that is layer norm. RMSNorm "
                                                              "only rescales, x / sqrt(mean(x**2) + eps), no centring."),
        (lambda: g * x / (np.sqrt(ms) + eps), "eps is in the wrong place: divide by sqrt(mean(x**2) + eps), not by "
                                              "sqrt(mean(x**2)) + eps."),
        (lambda: g * x / np.sqrt((x**2).sum(-1, keepdims=True) + eps), "You used the sum of squares; RMSNorm uses their "
                                                                       "mean (the root-mean-square): divide by D."),
        (lambda: g * x / np.sqrt((x**2).mean(-2, keepdims=True) + eps), "You took the mean over the positions (axis -2); "
                                                                        "RMSNorm uses each position's D features (the last axis)."),
        (lambda: x / np.sqrt(ms + eps), "The gain g is missing: multiply the normalised x by g."),
        (lambda: g * x / (ms + eps), "You divided by the mean square, not its square root."),
    ]  # fmt: skip
    return judge(_EX4, got, expected, mistakes, what="rms_norm(x, g, eps)", atol=_ATOL,
                 right="g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps): what selfattn.modern.RMSNorm computes.")


_EX5 = "7.4 QK-norm attention weights"


def _qk_inputs():
    """q (B, H, T, Dh), k (B, H, S, Dh) float64 with heads and positions of very different sizes (some
    far below eps, so that where eps goes shows), and two different gains g_q, g_k (Dh,)."""
    rng = np.random.default_rng(17)
    B, H, T, S, Dh = 2, 3, 4, 5, 8
    head_scale = np.array([0.5, 1.0, 2.5])[None, :, None, None]  # the heads differ in size
    q = rng.normal(size=(B, H, T, Dh)) * head_scale * np.array([0.05, 0.3, 1.0, 3.0])[None, None, :, None]
    k = rng.normal(size=(B, H, S, Dh)) * head_scale * np.array([0.1, 0.5, 1.0, 2.0, 4.0])[None, None, :, None]
    g_q, g_k = rng.uniform(0.5, 2.0, size=Dh), rng.uniform(0.5, 2.0, size=Dh)
    return q, k, g_q, g_k


def _qk_variant(q, k, g_q, g_k, eps, *, axis=-1, norm_q=True, norm_k=True, gains=True, centre=False,
                eps_inside=True, scale="d_head", softmax_axis=-1):
    """QK-norm attention weights and their usual slips, in NumPy."""
    def norm(x, g):
        if centre:
            x = x - x.mean(axis=axis, keepdims=True)
        ms = (x**2).mean(axis=axis, keepdims=True)
        x = x / (np.sqrt(ms + eps) if eps_inside else np.sqrt(ms) + eps)
        return g * x if gains else x

    qn = norm(q, g_q) if norm_q else q
    kn = norm(k, g_k) if norm_k else k
    H, Dh = q.shape[1], q.shape[-1]
    divide = {"d_head": np.sqrt(Dh), "d_model": np.sqrt(H * Dh), "none": 1.0}[scale]
    scores = qn @ np.swapaxes(kn, -1, -2) / divide  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
    return ref.softmax(scores, axis=softmax_axis)


@checker(_EX5)
def check_qk_norm_weights(fn):
    """``fn(q, k, g_q, g_k, eps)`` for float64 tensors q (B, H, T, Dh), k (B, H, S, Dh) and gains g_q, g_k
    (Dh,) must return the attention weights (B, H, T, S) of QK-norm: an RMSNorm over each head's d_head
    features, with gain g_q on every query vector and g_k on every key vector (eps inside the root), then
    ``softmax(q_hat k_hat^T / sqrt(Dh))`` over the keys (no mask). Expected: ``selfattn.ref.rms_norm``
    and ``selfattn.ref.softmax``, as in ``selfattn.modern.QKNormAttention`` (chapter 07)."""
    q, k, g_q, g_k = _qk_inputs()
    eps = _EPS
    args = [torch.from_numpy(a.copy()) for a in (q, k, g_q, g_k)]
    got = call_learner(_EX5, fn, *args, eps)
    Dh = q.shape[-1]
    q_hat, k_hat = ref.rms_norm(q, g_q, eps=eps), ref.rms_norm(k, g_k, eps=eps)  # (B, H, T, Dh), (B, H, S, Dh)
    expected = ref.softmax(q_hat @ np.swapaxes(k_hat, -1, -2) / np.sqrt(Dh), axis=-1)  # (B, H, T, S)

    def variant(**kwargs):
        return lambda: _qk_variant(q, k, g_q, g_k, eps, **kwargs)

    mistakes = [
        (variant(softmax_axis=-2), "Each column sums to one: you took the softmax over the queries (axis -2). "
                                   "Every query spreads its weight over the keys: softmax over the last axis."),
        (variant(axis=-2), "You normalised over the positions (axis -2); QK-norm normalises each query and each "
                           "key vector over its d_head features (the last axis)."),
        (variant(axis=(1, 3)), "You normalised over all heads' features together (one RMS per token, across "
                               "heads); this QK-norm is per head: each head's d_head features on their own."),
        (variant(norm_k=False), "Only the queries are normalised: QK-norm applies an RMSNorm, with the gain g_k, "
                                "to the keys too."),
        (variant(norm_q=False), "Only the keys are normalised: QK-norm applies an RMSNorm, with the gain g_q, "
                                "to the queries too."),
        (variant(gains=False), "The gains are missing: multiply the normalised queries by g_q and the "
                               "normalised keys by g_k."),
        (variant(centre=True), "You subtracted the mean: that is layer norm. QK-norm here is an RMSNorm, "
                               "x / sqrt(mean(x**2) + eps) times the gain, with no centring."),
        (variant(eps_inside=False), "eps is in the wrong place: divide by sqrt(mean(x**2) + eps), not by "
                                    "sqrt(mean(x**2)) + eps."),
        (variant(scale="none"), "The scores are not scaled: divide q_hat k_hat^T by sqrt(d_head) before the "
                                "softmax, as in every scaled dot product (chapter 03)."),
        (variant(scale="d_model"), "You divided the scores by sqrt(H * d_head), the model's width; scale by "
                                   "sqrt(d_head), the width of one head."),
    ]  # fmt: skip
    return judge(_EX5, got, expected, mistakes, what="qk_norm_weights(q, k, g_q, g_k, eps)", atol=_ATOL,
                 right="An RMSNorm with its own gain on each head's queries and keys, then the scaled dot "
                       "product and a softmax over the keys: the weights of selfattn.modern.QKNormAttention. "
                       "Every score is now at most sqrt(d_head) max|g_q g_k| in size.")  # fmt: skip
