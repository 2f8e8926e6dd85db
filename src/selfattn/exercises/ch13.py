"""Checks for the exercises of chapter 13 (what attention weights do and do not tell).

13.1 attention rollout; 13.2 block one edge; 13.3 a mean ablation of one head and its effect
on the loss; 13.4 the entropy of a head's weights. Expected values are computed here with NumPy (float64)
from the definitions in the chapter; the typical mistakes are computed too, and the check names the one the learner's answer matches.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_rollout", "check_block_edge", "check_mean_ablation", "check_attention_entropy"]


def _rollout(weights, *, order="last_first", residual=0.5, heads="mean", renormalise=True, product="matrix",
             layers=None):
    """Attention rollout (Abnar and Zuidema 2020) from its definition, or with one typical mistake."""
    L, H, T, _ = weights.shape
    mixed = weights.mean(1) if heads == "mean" else weights.sum(1)  # (L, T, T)
    if residual:
        mixed = residual * np.eye(T) + (1 - residual) * mixed if residual != 1 else np.eye(T) + mixed
    if renormalise:
        mixed = mixed / mixed.sum(-1, keepdims=True)
    out = np.eye(T)
    for layer in (range(L) if layers is None else layers):
        if product == "elementwise":
            out = out * mixed[layer] if layer else mixed[layer]
        elif order == "last_first":
            out = mixed[layer] @ out  # rollout = A_L ... A_2 A_1
        else:
            out = out @ mixed[layer]
    return out


# Float32 rounding passes; every typical mistake is off by far more than this.
_ATOL, _RTOL = 1e-5, 1e-5


@checker("13.1 attention rollout")
def check_rollout(fn):
    """``fn(weights (L, H, T, T))`` -> (T, T): attention rollout (Abnar and Zuidema 2020), as the chapter defines
    it: per layer, the mean over heads, mixed half and half with the identity (the residual stream), rows
    renormalised; then the product of the layers, last layer on the left, rollout = A_L ... A_2 A_1. Torch
    tensors in and out."""
    ex = "13.1 attention rollout"
    rng = np.random.default_rng(0)
    L, H, T = 3, 2, 5
    weights = ref.softmax(rng.normal(size=(L, H, T, T)) * 2.0, axis=-1)
    got_raw = call_learner(ex, fn, torch.from_numpy(weights.copy()))
    got = to_numpy(got_raw)
    expected = _rollout(weights)
    if got is not None and got.shape == (L, T, T):
        return failed(ex, "You returned one matrix per layer: multiply the layers' matrices together into one (T, T).")
    if got is not None and got.shape == expected.shape and np.isfinite(got).all() and not np.allclose(
            got, expected, atol=_ATOL, rtol=_RTOL):
        mistakes = (
            (dict(order="first_first"), "You multiplied in the wrong order: the input passes layer 1 first, so "
                                        "rollout = A_L ... A_2 A_1, each new layer on the left."),
            (dict(residual=0.0), "You left out the residual stream: mix each layer's mean attention half and half with "
                                 "the identity, 0.5 I + 0.5 A, before multiplying."),
            (dict(heads="sum"), "You summed the heads: average them, so that each layer's matrix is a mixing of rows "
                                "that sum to one."),
            (dict(residual=1, renormalise=False), "Your rows do not sum to one: with I + A each row sums to 2; use "
                                                  "0.5 I + 0.5 A (or renormalise the rows)."),
            (dict(product="elementwise"), "You multiplied the layers entry by entry: rollout is the matrix product, "
                                          "following the mixing from layer to layer."),
            (dict(layers=[L - 1]), "That is the last layer alone: multiply all the layers."),
        )
        for kwargs, message in mistakes:
            if np.allclose(got, _rollout(weights, **kwargs), atol=_ATOL, rtol=_RTOL):
                return failed(ex, message)
    bad = compare_arrays(ex, got_raw, expected, what="The rollout", atol=_ATOL, rtol=_RTOL)
    if bad is not None:
        return bad
    return passed(ex, "Heads averaged, half residual, rows renormalised, layers multiplied last on the left: row i "
                      "divides output position i over the input tokens, and every row sums to one.")


@checker("13.2 block one edge")
def check_block_edge(fn):
    """``fn(weights (T, S), i, j)`` -> (T, S): the weights after key j is hidden from query i, as
    the keep-mask does it (weight 0, row i renormalised over the remaining keys, other rows
    unchanged). NumPy arrays in and out; the input must not be modified."""
    ex = "13.2 block one edge"
    weights = ref.softmax(np.random.default_rng(1).normal(size=(4, 6)) * 2.0, axis=-1)
    for i, j in ((1, 2), (3, 0)):
        given = weights.copy()
        got = to_numpy(call_learner(ex, fn, given, i, j))
        if not np.array_equal(given, weights):
            return failed(ex, "Your function changed its input array; work on a copy.")
        expected = weights.copy()
        expected[i, j] = 0.0
        expected[i] /= expected[i].sum()
        if got is not None and got.shape == expected.shape:
            not_renormalised = weights.copy()
            not_renormalised[i, j] = 0.0
            column = weights.copy()
            column[:, j] = 0.0
            column /= column.sum(-1, keepdims=True)
            if np.allclose(got, not_renormalised, atol=1e-10):
                return failed(
                    ex,
                    f"Row {i} sums to {got[i].sum():.3f}, not 1: you zeroed the weight but did not "
                    "renormalise. A blocked key is absent from the softmax, so the other weights grow.",
                )
            if np.allclose(got, column, atol=1e-10):
                return failed(
                    ex,
                    f"You hid key {j} from every query; only query {i} must lose it (one edge).",
                )
        bad = compare_arrays(
            ex, got, expected, what=f"the weights after blocking ({i}, {j})", atol=1e-10
        )
        if bad is not None:
            return bad
    return passed(ex, "Zero the entry, divide the row by its new sum: softmax without that key.")


_EX3 = "13.3 mean-ablate one head"
_EX4 = "13.4 the entropy of a head's weights"


def _ablation_inputs():
    rng = np.random.default_rng(13)
    B, T, H, Dh, D, V = 3, 5, 4, 2, 6, 7
    contexts = rng.normal(size=(B, T, H, Dh)) + rng.normal(size=(1, 1, H, Dh)) * 2  # heads with non-zero means
    W_O, W_U = rng.normal(size=(H * Dh, D)), rng.normal(size=(D, V))
    targets = rng.integers(0, V, size=(B, T))
    return contexts, W_O, W_U, targets


def _loss(out, W_U, targets):
    logits = out @ W_U  # (B, T, V)
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


def _ablated_loss(contexts, W_O, W_U, targets, h, how):
    B, T, H, Dh = contexts.shape
    c = contexts.copy()
    if how == "mean":
        c[:, :, h] = contexts[:, :, h].mean(axis=(0, 1))
    elif how == "zero":
        c[:, :, h] = 0.0
    elif how == "per_sequence":
        c[:, :, h] = contexts[:, :, h].mean(axis=1, keepdims=True)
    elif how == "per_position":
        c[:, :, h] = contexts[:, :, h].mean(axis=0, keepdims=True)
    elif how == "head_major":  # heads laid out as (Dh, H) in the concatenation: columns h, h + H, ...
        flat = contexts.reshape(B, T, H * Dh).copy()
        flat[..., h::H] = flat[..., h::H].mean(axis=(0, 1))
        return _loss(flat @ W_O, W_U, targets)
    return _loss(c.reshape(B, T, H * Dh) @ W_O, W_U, targets)


@checker(_EX3)
def check_mean_ablation(fn):
    """``fn(contexts (B, T, H, Dh), W_O (H * Dh, D), h, loss_fn)`` -> a float: how much the loss rises when head
    ``h``'s context is replaced by its mean over the batch and the positions (a mean ablation). The layer's
    output is ``contexts.reshape(B, T, H * Dh) @ W_O``; ``loss_fn(out)`` returns the loss (a 0-d tensor) of an
    output. Return ``loss_fn(ablated) - loss_fn(clean)``. Torch float64 tensors. Wang et al. 2022 (mean
    ablation); chapter 13."""
    contexts, W_O, W_U, targets = _ablation_inputs()
    W_U_t, targets_t = torch.from_numpy(W_U), torch.from_numpy(targets)

    def loss_fn(out):
        if not isinstance(out, torch.Tensor) or out.shape[-1] != W_U.shape[0]:
            raise ValueError(f"loss_fn takes the layer's output, a (B, T, {W_U.shape[0]}) tensor; got "
                             f"{getattr(out, 'shape', type(out).__name__)}")
        logits = out.double() @ W_U_t
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets_t.reshape(-1))

    clean = _loss(contexts.reshape(*contexts.shape[:2], -1) @ W_O, W_U, targets)
    for h in (2, 0):
        raw = call_learner(_EX3, fn, torch.from_numpy(contexts.copy()), torch.from_numpy(W_O.copy()), h, loss_fn)
        if isinstance(raw, torch.Tensor) and raw.numel() == 1:
            raw = raw.item()
        if isinstance(raw, bool) or not isinstance(raw, (int, float, np.integer, np.floating)):
            return failed(_EX3, f"Return one number, the change in loss (use .item() on a 0-d tensor); got "
                                f"{type(raw).__name__}{getattr(raw, 'shape', '')}.")
        got = float(raw)
        if not np.isfinite(got):
            return failed(_EX3, f"Your change in loss is {got}; it should be a finite number.")
        expected = _ablated_loss(contexts, W_O, W_U, targets, h, "mean") - clean
        if abs(got - expected) <= 1e-9 + 1e-7 * abs(expected):
            continue
        at = f"For head {h}"
        mistakes = (
            (_ablated_loss(contexts, W_O, W_U, targets, h, "zero") - clean, "you zeroed the head: that is a zero "
             "ablation, which also moves the layer's output off its usual range. Replace the head's context by its "
             "mean over the batch and the positions, contexts[:, :, h].mean(dim=(0, 1))."),
            (_ablated_loss(contexts, W_O, W_U, targets, h, "per_sequence") - clean, "you took the "
             "mean over each sequence's positions: the mean is over the whole data set, batch and positions "
             "together, dim=(0, 1)."),
            (_ablated_loss(contexts, W_O, W_U, targets, h, "per_position") - clean, "you took the mean over the batch at "
             "each position: average over the positions too, dim=(0, 1)."),
            (_ablated_loss(contexts, W_O, W_U, targets, h, "head_major") - clean, "you ablated columns h, h + H, ... of "
             "the concatenated output: head h's context is the slice [h * Dh, (h + 1) * Dh), or contexts[:, :, h] "
             "before the reshape."),
            (clean - _ablated_loss(contexts, W_O, W_U, targets, h, "mean"), "the sign is reversed: return "
             "ablated - clean, positive when the head helps."),
            (_ablated_loss(contexts, W_O, W_U, targets, h, "mean"), "that is the ablated loss itself; return its "
             "difference from the clean loss."),
        )
        for value, message in mistakes:
            if abs(got - value) <= 1e-9 + 1e-7 * abs(value):
                return failed(_EX3, f"{at} {message}")
        return failed(_EX3, f"{at} the loss rises by {expected:.6f} nats; you returned {got:.6f}.")
    return passed(_EX3, "Ablated minus clean loss with the head's mean over the data set in place of its output: "
                        "the head's effect, measured with the layer pushed less far off distribution than zeros would push it.")


@checker(_EX4)
def check_attention_entropy(fn):
    """``fn(weights (H, T, S))`` -> (H, T): the entropy ``-sum_j w_ij log w_ij`` of each query's weights, in nats,
    with 0 log 0 = 0 (a masked key has weight 0). Torch float64 tensors in and out."""
    rng = np.random.default_rng(14)
    H, T, S = 2, 4, 6
    scores = rng.normal(size=(H, T, S)) * 2
    scores[:, np.arange(T)[:, None] + S - T < np.arange(S)[None, :]] = -np.inf  # causal, bottom-right aligned
    scores[1, 0] = -np.inf
    scores[1, 0, 0] = 0.0  # a row with all its weight on one key: entropy 0
    weights = ref.softmax(scores, axis=-1)
    got_raw = call_learner(_EX4, fn, torch.from_numpy(weights.copy()))
    got = to_numpy(got_raw)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(weights > 0, weights * np.log(np.where(weights > 0, weights, 1.0)), 0.0)
    expected = -terms.sum(-1)
    if got is not None and got.shape == (H, S):
        return failed(_EX4, f"Your result has shape {got.shape}, one number per key: sum over the keys (the last axis), "
                            "for one entropy per query, (H, T).")
    if got is not None and got.shape == expected.shape and not np.isfinite(got).all():
        return failed(_EX4, "NaN where a weight is 0: 0 * log 0 is NaN in floating point but 0 in the entropy. Skip the "
                            "zero weights, e.g. torch.special.xlogy(w, w), or torch.where(w > 0, w * w.log(), 0).")
    if got is not None and got.shape == expected.shape:
        mistakes = (
            (expected / np.log(2), "That is in bits (log base 2); use the natural log for nats."),
            (-expected, "The sign is reversed: the entropy is -sum w log w, never negative."),
            (expected / np.log(S), "You divided by log S; return the entropy itself, in nats."),
        )
        for value, message in mistakes:
            if np.allclose(got, value, atol=1e-8) and not np.allclose(got, expected, atol=1e-8):
                return failed(_EX4, message)
    bad = compare_arrays(_EX4, got_raw, expected, what="The entropies", atol=1e-8, rtol=1e-8)
    if bad is not None:
        return bad
    return passed(_EX4, "-sum w log w per query, 0 where all the weight is on one key and log S for an even spread: "
                        "a head's focus in one number per query.")
