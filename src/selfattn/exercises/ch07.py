"""Checks for the exercises of chapter 07 (the Transformer block).

Expected values come from NumPy (``selfattn.ref.layer_norm``, ``selfattn.ref.post_norm_block``);
typical mistakes are recognised by computing them too and naming the one the answer matches.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy
from ._judge import judge

__all__ = ["check_layer_norm", "check_post_norm_block", "check_pre_norm_block", "check_rms_norm"]

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


@checker("7.2 post-norm block")
def check_post_norm_block(fn):
    """``fn(x, attn, ffn, ln1, ln2)`` must compose the four sublayers (callables (B, T, D) -> (B, T, D)
    on torch tensors) as BERT's post-norm block: ``h = ln1(x + attn(x))``, ``out = ln2(h + ffn(h))``."""
    ex = "7.2 post-norm block"
    x, p, H, eps, parts = _block_parts()
    attn, ffn, ln1, ln2 = parts
    got = to_numpy(call_learner(ex, fn, torch.from_numpy(x.copy()), *parts))
    expected = ref.post_norm_block(x, p, H, eps=eps)
    if got is not None and got.shape == expected.shape and np.isfinite(got).all():
        X = torch.from_numpy(x)
        no_res = ln2(ffn(ln1(attn(X))))
        h_after = X + ln1(attn(X))
        mistakes = [
            (ref.pre_norm_block(x, p, H, eps=eps), "This is the pre-norm block (normalise, then add); BERT's block is "
                                                   "post-norm: add the branch to x first, then normalise the sum."),
            (to_numpy(no_res), "The residual connections are missing: each sublayer's output must be added to its "
                               "input (x + attn(x), h + ffn(h)) before the layer norm."),
            (to_numpy(h_after + ln2(ffn(h_after))), "You normalised the branch output and then added it; in the "
                                                    "post-norm block the sum x + attn(x) is what gets normalised."),
            (to_numpy(ln1(X + attn(X))), "You stopped after the attention sublayer: the feed-forward sublayer "
                                         "h -> ln2(h + ffn(h)) is missing."),
            (to_numpy(ln2(ffn(ln1(X + attn(X))))), "The second residual connection is missing: add h to ffn(h) "
                                                   "before ln2, out = ln2(h + ffn(h))."),
            (to_numpy(ln2(ln1(X + attn(X)) + ffn(X))), "The feed-forward sublayer read x; it must read h, the "
                                                       "output of the attention sublayer: out = ln2(h + ffn(h))."),
            (to_numpy((lambda h: ln1(h + ffn(h)))(ln2(X + attn(X)))), "ln1 and ln2 are swapped: ln1 belongs to the "
                                                                       "attention sublayer, ln2 to the feed-forward one."),
        ]  # fmt: skip
        for wrong, words in mistakes:
            if np.allclose(got, wrong, atol=_ATOL):
                return failed(ex, words)
    bad = compare_arrays(ex, got, expected, what="The block's output", atol=_ATOL, rtol=_ATOL)
    if bad is not None:
        return bad
    return passed(ex, "h = ln1(x + attn(x)); out = ln2(h + ffn(h)): add, then normalise, twice.")


_EX3 = "7.3 pre-norm block from its parts"
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


_EX4 = "7.4 RMSNorm"


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
