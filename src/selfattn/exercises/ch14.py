"""Checks for the exercises of chapter 14 (the capstone: a small GPT, its KV cache and its training).

14.1 the induction score of a head; 14.2 one KV-cache decode step of an attention layer; 14.3 one AdamW
step with gradient clipping, written by hand and checked against ``torch.optim.AdamW`` after
``torch.nn.utils.clip_grad_norm_``; 14.4 the learning-rate schedule of the training loop (warm-up, cosine). Expected values come from NumPy
(written here from the definitions) or from torch's own optimiser; the typical mistakes are computed too,
and the check names the one the learner's answer matches.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_induction_score", "check_decode_step", "check_adamw_step", "check_lr_schedule"]

_EX1 = "14.1 the induction score of a head"
_EX2 = "14.2 one decode step with a KV cache"
_EX3 = "14.3 one AdamW step by hand"
_EX4 = "14.4 the learning-rate schedule"


def _as_number(ex, raw, what):
    """The learner's scalar as a float, or raise the feedback that says what came back instead."""
    if isinstance(raw, torch.Tensor) and raw.numel() == 1:
        raw = raw.item()
    if isinstance(raw, np.ndarray) and raw.size == 1:
        raw = raw.item()
    if isinstance(raw, bool) or not isinstance(raw, (int, float, np.integer, np.floating)):
        return None, failed(ex, f"Return the {what}, one number (use .item() on a 0-d tensor); got "
                                f"{type(raw).__name__}{tuple(getattr(raw, 'shape', ())) or ''}.")
    if not np.isfinite(float(raw)):
        return None, failed(ex, f"Your {what} is {float(raw)}; it should be a finite number.")
    return float(raw), None


def _score(weights, L, key_offset):
    """mean over b and i = 0 .. L - 2 of weights[b, h, L + i, i + key_offset], per head."""
    i = np.arange(L - 1)
    return weights[:, :, L + i, i + key_offset].mean(axis=(0, 2))


@checker(_EX1)
def check_induction_score(fn):
    """``fn(weights (B, H, 2L, 2L), L)`` -> (H,): each head's induction score on sequences made of L random tokens
    repeated once: the mean, over the batch and over i = 0 .. L - 2, of the weight from the query at L + i (the
    second copy of token i) to the key at i + 1 (the token that followed its first copy). Torch in and out.
    Olsson et al. 2022; chapter 14 (``selfattn.experiments.induction.induction_scores``)."""
    rng = np.random.default_rng(14)
    B, H, L = 2, 4, 6
    T = 2 * L
    scores = rng.normal(size=(B, H, T, T)) * 1.5
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    scores[:, 0] += np.where((q >= L) & (k == q - L + 1), 4.0, 0.0)  # head 0: an induction head
    scores[:, 1] += np.where(k == q - 1, 4.0, 0.0)  # head 1: a previous-token head
    scores[:, 2] += np.where((q >= L) & (k == q - L), 4.0, 0.0)  # head 2: a duplicate-token head
    scores = np.where(k <= q, scores, -np.inf)
    weights = ref.softmax(scores, axis=-1)
    got_raw = call_learner(_EX1, fn, torch.from_numpy(weights.copy()), L)
    got = to_numpy(got_raw)
    expected = _score(weights, L, 1)
    if got is not None and got.shape == ():
        return failed(_EX1, "You returned one number: keep one score per head, averaging over the batch and the "
                            "positions only, shape (H,).")
    if got is not None and got.shape == expected.shape and np.isfinite(got).all() and not np.allclose(got, expected):
        i = np.arange(L - 1)
        mistakes = (
            (_score(weights, L, 0), "You read the key at i, the earlier copy of the same token: that is a "
                                    "duplicate-token score. An induction head attends to the token after it, i + 1."),
            (weights[:, :, L + i, L + i - 1].mean(axis=(0, 2)), "You read the key just before the query: that is a "
             "previous-token score. The induction key is i + 1, in the first copy."),
            (_score(weights, L, 2), "Off by one: the query at L + i holds token i; the key to read is i + 1, not i + 2."),
            (np.swapaxes(weights, -1, -2)[:, :, L + i, i + 1].mean(axis=(0, 2)), "You read weights[key, query]: the "
             "weights are indexed [query, key], so the score reads weights[:, :, L + i, i + 1] (the transposed entries "
             "are all masked, 0)."),
            (weights[:, :, L + i, i + 1].sum(axis=(0, 2)), "You summed the weights: the score is their mean over the "
             "batch and the L - 1 positions, .mean(dim=(0, 2)), a number between 0 and 1."),
            (np.diagonal(weights, offset=-(L - 1), axis1=-2, axis2=-1).mean(axis=(0, 2)), "You averaged the whole "
             "diagonal L - 1 below the main one (L + 1 entries): its first entry is query L - 1 in the first copy, its "
             "last the query 2L - 1 (i = L - 1), which the score leaves out to match induction_scores. Keep its entries "
             "1 .. L - 1, the queries L + i for i = 0 .. L - 2."),
            (np.diagonal(weights, offset=-(L - 1), axis1=-2, axis2=-1)[..., 1:].mean(axis=(0, 2)), "One query too many: "
             "you included i = L - 1, the query 2L - 1. Its key L exists here, because the two copies are adjacent (it "
             "is the second copy's first token), but the score takes i = 0 .. L - 2 to match "
             "selfattn.experiments.induction.induction_scores, whose spans are separated: there the key after a "
             "span's last token is not part of the span. Take L - 1 queries, torch.arange(L - 1)."),
        )
        for value, message in mistakes:
            if np.allclose(got, value):
                return failed(_EX1, message)
    bad = compare_arrays(_EX1, got_raw, expected, what="The induction scores", atol=1e-10)
    if bad is not None:
        return bad
    return passed(_EX1, f"Head 0 scores {expected[0]:.2f}, the others at most {expected[1:].max():.2f}: one weight per "
                        "repeated token, read on the diagonal L - 1 below the main one.")


def _decode_reference(x, K_cache, V_cache, W_Q, W_K, W_V, W_O, *, append=True, prepend=False, scale=True,
                      top_left=False, project=True, scale_by_D=False, softmax_axis=-1):
    B, _, D = x.shape
    H, Dh = K_cache.shape[1], K_cache.shape[-1]

    def heads(W):
        return (x @ W).reshape(B, 1, H, Dh).transpose(0, 2, 1, 3)  # (B, H, 1, Dh)

    q, k, v = heads(W_Q), heads(W_K), heads(W_V)
    if prepend:
        K, V = np.concatenate([k, K_cache], 2), np.concatenate([v, V_cache], 2)
    else:
        K, V = np.concatenate([K_cache, k], 2), np.concatenate([V_cache, v], 2)
    K_read, V_read = (K, V) if append else (K_cache, V_cache)
    s = q @ np.swapaxes(K_read, -1, -2) / (np.sqrt(D if scale_by_D else Dh) if scale else 1.0)  # (B, H, 1, S + 1)
    if top_left:  # tril(ones(1, S + 1)): the new query sees only the first key
        s[..., 1:] = -np.inf
    context = ref.softmax(s, axis=softmax_axis) @ V_read  # (B, H, 1, Dh)
    out = context.transpose(0, 2, 1, 3).reshape(B, 1, D)
    return (out @ W_O if project else out), K, V


@checker(_EX2)
def check_decode_step(fn):
    """``fn(x (B, 1, D), K_cache (B, H, S, Dh), V_cache, W_Q, W_K, W_V, W_O (D, D))`` -> ``(out (B, 1, D), K, V)``:
    one decode step of a causal attention layer. Project the new token (``x @ W_Q`` split into H heads of
    Dh = D / H, head h = columns h Dh .. (h + 1) Dh), append its key and value to the cache (K and V become
    (B, H, S + 1, Dh)), attend from the new query to all S + 1 positions, concatenate the heads and apply
    W_O. Torch float64 tensors in and out."""
    rng = np.random.default_rng(15)
    B, H, S, Dh = 2, 3, 5, 4
    D = H * Dh
    x = rng.normal(size=(B, 1, D))
    K_cache, V_cache = rng.normal(size=(B, H, S, Dh)), rng.normal(size=(B, H, S, Dh))
    Ws = [rng.normal(size=(D, D)) / np.sqrt(D) for _ in range(4)]
    t = torch.from_numpy
    result = call_learner(_EX2, fn, t(x.copy()), t(K_cache.copy()), t(V_cache.copy()), *(t(W.copy()) for W in Ws))
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        return failed(_EX2, "Return the triple (out, K, V): the layer's output for the new token and the updated cache.")
    got = [to_numpy(r) for r in result]
    out_e, K_e, V_e = _decode_reference(x, K_cache, V_cache, *Ws)
    for a, e, name in zip(got[1:], (K_e, V_e), "KV", strict=True):
        if a is not None and a.shape == K_cache.shape:
            return failed(_EX2, f"Your {name} still has S = {S} positions: append the new token's {name.lower()}, "
                                f"torch.cat([{name}_cache, {name.lower()}_new], dim=2), giving (B, H, S + 1, Dh).")
        if a is not None and a.shape == e.shape and np.allclose(a, _decode_reference(x, K_cache, V_cache, *Ws,
                                                                                     prepend=True)[1 if name == "K" else 2]):
            return failed(_EX2, f"You put the new position first in {name}: append it after the cached ones, so that "
                                "position order stays right.")
        bad = compare_arrays(_EX2, result[1 if name == "K" else 2], e, what=f"The updated {name}", atol=1e-10)
        if bad is not None:
            return bad
    out = got[0]
    if out is not None and out.shape == out_e.shape and np.isfinite(out).all() and not np.allclose(out, out_e, atol=1e-10):
        mistakes = (
            (dict(append=False), "The new query attended to the cache only: append its own key and value first, then "
                                 "attend over all S + 1 positions (a token sees itself)."),
            (dict(top_left=True), "Your mask let the new query see only the first key: a causal mask for one new query "
                                  "at the end is bottom-right aligned, and the newest token sees every cached one (no "
                                  "mask is needed at all)."),
            (dict(scale=False), "You forgot to divide the scores by sqrt(Dh)."),
            (dict(project=False), "You returned the concatenated heads: apply the output projection W_O."),
            (dict(scale_by_D=True), "You divided the scores by sqrt(D), the model width: each head's scores are "
                                    "divided by sqrt(Dh), the width of its queries and keys (D / H)."),
            (dict(softmax_axis=-2), "Your softmax ran over the queries (dim=-2): with one new query every weight is "
                                    "then 1 and the output sums the values. Take it over the keys, dim=-1."),
        )
        for kwargs, message in mistakes:
            if np.allclose(out, _decode_reference(x, K_cache, V_cache, *Ws, **kwargs)[0], atol=1e-10):
                return failed(_EX2, message)
    bad = compare_arrays(_EX2, result[0], out_e, what="The output", atol=1e-10)
    if bad is not None:
        return bad
    return passed(_EX2, "One row of attention per step: the new query against S + 1 cached keys, O(S) work instead of "
                        "recomputing the (S + 1)^2 scores of the whole prefix.")


def _adamw_numpy(params, grads, m, v, step, lr, betas, eps, wd, max_norm, *, l2=False, bias_correction=True,
                 clip="global", eps_inside=False, decay_with_lr=True):
    """One AdamW step in NumPy, as torch.optim.AdamW after clip_grad_norm_, or with one typical mistake."""
    b1, b2 = betas
    grads = [g.copy() for g in grads]
    if clip == "global":
        total = np.sqrt(sum((g**2).sum() for g in grads))
        grads = [g * min(1.0, max_norm / (total + 1e-6)) for g in grads]
    elif clip == "per_tensor":
        grads = [g * min(1.0, max_norm / (np.sqrt((g**2).sum()) + 1e-6)) for g in grads]
    new_p, new_m, new_v = [], [], []
    for p, g, m_i, v_i in zip(params, grads, m, v, strict=True):
        if l2:
            g = g + wd * p
        else:
            p = p * (1 - (lr * wd if decay_with_lr else wd))
        m_i = b1 * m_i + (1 - b1) * g
        v_i = b2 * v_i + (1 - b2) * g * g
        m_hat = m_i / (1 - b1**step) if bias_correction else m_i
        v_hat = v_i / (1 - b2**step) if bias_correction else v_i
        denominator = np.sqrt(v_hat + eps) if eps_inside else np.sqrt(v_hat) + eps
        new_p.append(p - lr * m_hat / denominator)
        new_m.append(m_i)
        new_v.append(v_i)
    return new_p, new_m, new_v


_ADAM = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.1, max_norm=1.0)


def _torch_adamw(params0, grad_list, steps):
    """Parameters and state of torch.optim.AdamW after ``steps`` steps, each after clip_grad_norm_."""
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params0]
    opt = torch.optim.AdamW(params, lr=_ADAM["lr"], betas=_ADAM["betas"], eps=_ADAM["eps"],
                            weight_decay=_ADAM["weight_decay"])
    for s in range(steps):
        for p, g in zip(params, grad_list[s], strict=True):
            p.grad = torch.from_numpy(g.copy())
        torch.nn.utils.clip_grad_norm_(params, _ADAM["max_norm"])
        opt.step()
    if steps == 0:
        return [p.detach().numpy().copy() for p in params], [np.zeros_like(p) for p in params0], [
            np.zeros_like(p) for p in params0]
    return ([p.detach().numpy().copy() for p in params], [opt.state[p]["exp_avg"].numpy().copy() for p in params],
            [opt.state[p]["exp_avg_sq"].numpy().copy() for p in params])


def _close_lists(a, b, rtol=1e-6, atol=1e-9):
    return all(x.shape == y.shape and np.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True))


@checker(_EX3)
def check_adamw_step(fn):
    """``fn(params, grads, m, v, step, lr, betas, eps, weight_decay, max_norm)`` -> ``(params, m, v)``, three lists of
    tensors: one step of AdamW (Loshchilov and Hutter 2019) after clipping the gradients to a global norm of at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` then ``torch.optim.AdamW.step()`` do it. ``params``,
    ``grads``, ``m`` (first moments) and ``v`` (second moments) are lists of float64 tensors; ``step`` counts from 1
    (the step being taken). The decay is decoupled: p <- p (1 - lr weight_decay), then the Adam update with the
    bias-corrected moments, p <- p - lr m_hat / (sqrt(v_hat) + eps). Checked against torch's own optimiser."""
    rng = np.random.default_rng(16)
    params0 = [rng.normal(size=(3, 4)), rng.normal(size=(5,))]
    grad_list = [[rng.normal(size=(3, 4)) * 2.0, rng.normal(size=(5,)) * 0.3] for _ in range(3)]  # norms about 7 and 0.7
    kw = dict(lr=_ADAM["lr"], betas=_ADAM["betas"], eps=_ADAM["eps"], wd=_ADAM["weight_decay"], max_norm=_ADAM["max_norm"])
    for step in (1, 3):
        p_before, m_before, v_before = _torch_adamw(params0, grad_list, step - 1)
        p_e, m_e, v_e = _torch_adamw(params0, grad_list, step)
        g = grad_list[step - 1]
        t = torch.from_numpy
        result = call_learner(_EX3, fn, [t(x.copy()) for x in p_before], [t(x.copy()) for x in g],
                              [t(x.copy()) for x in m_before], [t(x.copy()) for x in v_before], step,
                              _ADAM["lr"], _ADAM["betas"], _ADAM["eps"], _ADAM["weight_decay"], _ADAM["max_norm"])
        if not isinstance(result, (tuple, list)) or len(result) != 3 or not all(
                isinstance(r, (tuple, list)) and len(r) == 2 for r in result):
            return failed(_EX3, "Return the triple (params, m, v), each a list with one tensor per parameter (2 here).")
        got = [[to_numpy(x) for x in r] for r in result]
        for lst, name in zip(got, ("params", "m", "v"), strict=True):
            for x, e in zip(lst, p_e, strict=True):
                if x is None or x.shape != e.shape:
                    return failed(_EX3, f"Each tensor of {name} should have its parameter's shape {e.shape}; got "
                                        f"{None if x is None else x.shape}.")
                if not np.isfinite(x).all():
                    return failed(_EX3, f"Your {name} holds NaN or inf at step {step}: divide by sqrt(v_hat) + eps, "
                                        "with v_hat = v / (1 - beta2^step) and step counted from 1.")
        if _close_lists(got[0], p_e) and _close_lists(got[1], m_e) and _close_lists(got[2], v_e):
            continue
        at = f"At step {step}"
        mistakes = (
            (dict(l2=True), "you added weight_decay * p to the gradient: that is Adam with L2 regularisation, whose decay "
                            "is rescaled by the moments. AdamW decouples it: p <- p (1 - lr weight_decay), and the "
                            "moments see the gradient alone."),
            (dict(bias_correction=False), "the bias correction is missing: divide m by (1 - beta1^step) and v by "
                                          "(1 - beta2^step) before the update (both start at 0)."),
            (dict(clip="none"), "your moments use the unclipped gradients (clipping after the step, or not at all): "
                                "clip first, scaling every gradient by min(1, max_norm / total_norm), then update the "
                                "moments."),
            (dict(clip="per_tensor"), "you clipped each tensor on its own: clip_grad_norm_ takes one norm over all the "
                                      "gradients together, sqrt(sum of every squared entry), and scales them all alike."),
            (dict(eps_inside=True), "eps is inside the square root: AdamW divides by sqrt(v_hat) + eps."),
            (dict(decay_with_lr=False), "the decay is p (1 - weight_decay): torch.optim.AdamW multiplies it by the "
                                        "learning rate, p (1 - lr weight_decay)."),
        )
        for kwargs, message in mistakes:
            cand = _adamw_numpy(p_before, g, m_before, v_before, step, **kw, **kwargs)
            if all(_close_lists(a, c) for a, c in zip(got, cand, strict=True)):
                return failed(_EX3, f"{at} {message}")
        wrong = [name for lst, e, name in zip(got, (p_e, m_e, v_e), ("params", "m", "v"), strict=True)
                 if not _close_lists(lst, e)]
        return failed(_EX3, f"{at} your {', '.join(wrong)} differ from torch.optim.AdamW's after clip_grad_norm_.")
    return passed(_EX3, "The same numbers as clip_grad_norm_ then torch.optim.AdamW: one global clip, moments of the "
                        "clipped gradient, bias correction, and a decay that shrinks the weights apart from the moments.")


def _lr(step, lr, warmup, total, min_lr, *, warm_from_zero=False, floor=True, period="after_warmup",
        shape="cosine"):
    """The learning rate at ``step`` (from 0): linear warm-up, then cosine decay to min_lr; or a typical mistake."""
    if step < warmup:
        return lr * (step if warm_from_zero else step + 1) / warmup
    low = min_lr if floor else 0.0
    progress = {"after_warmup": (step - warmup) / (total - warmup), "whole_run": step / total,
                "over_total": (step - warmup) / total}[period]
    if shape == "linear":
        return low + (lr - low) * (1 - progress)
    if shape == "bare_cos":
        return low + (lr - low) * math.cos(math.pi * progress)
    return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * progress))


@checker(_EX4)
def check_lr_schedule(fn):
    """``fn(step, lr, warmup, total, min_lr)`` -> the learning rate (a float) at ``step``, counted from 0, of the
    schedule this chapter's training uses (``selfattn.models.gpt.train_lm``): a linear warm-up that reaches ``lr``
    at step ``warmup - 1`` (``lr (step + 1) / warmup``), then a cosine decay from ``lr`` at step ``warmup`` to
    ``min_lr`` at step ``total``: ``min_lr + (lr - min_lr) (1 + cos(pi (step - warmup) / (total - warmup))) / 2``."""
    lr, warmup, total, min_lr = 3e-3, 10, 200, 3e-4
    steps = (0, 4, 9, 10, 60, 105, 150, 199)
    for step in steps:
        got, bad = _as_number(_EX4, call_learner(_EX4, fn, step, lr, warmup, total, min_lr), "learning rate")
        if bad is not None:
            return bad
        expected = _lr(step, lr, warmup, total, min_lr)
        if abs(got - expected) <= 1e-12 + 1e-6 * expected:  # float32 passes
            continue
        at = f"At step {step} (warmup={warmup}, total={total})"
        for kwargs, message in (
            (dict(warm_from_zero=True), "your warm-up starts at 0: step 0 would not train at all. Use lr (step + 1) / "
                                        "warmup, which reaches lr at step warmup - 1."),
            (dict(floor=False), "your decay ends at 0: it ends at min_lr, min_lr + (lr - min_lr) (1 + cos(...)) / 2."),
            (dict(period="whole_run"), "your cosine runs over the whole run: it starts after the warm-up, with "
                                       "progress (step - warmup) / (total - warmup)."),
            (dict(period="over_total"), "you divided (step - warmup) by total: the decay lasts total - warmup steps, "
                                        "so progress = (step - warmup) / (total - warmup), which reaches 1 (and the "
                                        "learning rate min_lr) at step total."),
            (dict(shape="linear"), "that is a linear decay: use the cosine, (1 + cos(pi progress)) / 2."),
            (dict(shape="bare_cos"), "cos(pi progress) alone goes from 1 to -1, below min_lr: use "
                                     "(1 + cos(pi progress)) / 2, from 1 to 0."),
        ):
            if abs(got - _lr(step, lr, warmup, total, min_lr, **kwargs)) <= 1e-12 + 1e-6 * abs(expected):
                return failed(_EX4, f"{at} {message}")
        return failed(_EX4, f"{at} the learning rate is {expected:.6g}; you returned {got:.6g}.")
    return passed(_EX4, "Linear warm-up to lr, then half a cosine down to min_lr: the schedule train_lm hands to "
                        "torch.optim.lr_scheduler.LambdaLR, with min_lr = lr / 10 there.")
