"""Checks for the exercises of chapter 13 (what attention weights do and do not tell).

13.1 the norms of the moved vectors; 13.2 block one edge; 13.3 a mean ablation of one head and its effect
on the loss; 13.4 the entropy of a head's weights. Expected values are computed here with NumPy (float64)
from the definitions in the chapter; the typical mistakes are computed too, and the check names the one the learner's answer matches.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_moved_norms", "check_block_edge", "check_mean_ablation", "check_attention_entropy"]


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    H, T, Dh, D = 3, 5, 4, 12  # distinct sizes: a swapped axis shows in the shape
    weights = ref.softmax(rng.normal(size=(H, T, T)) * 2.0, axis=-1)
    V = rng.normal(size=(H, T, Dh))
    W_O = rng.normal(size=(H, Dh, D))
    return weights, V, W_O


# Float32 rounding (a right answer computed in float32 is off by ~1e-6 here) passes, as in chapter 06;
# every typical mistake is off by far more than this.
_ATOL, _RTOL = 1e-5, 1e-5


@checker("13.1 norms of the moved vectors")
def check_moved_norms(fn):
    """``fn(weights (H, T, T), V (H, T, Dh), W_O (H, Dh, D))`` -> (H, T, T) with entry [h, i, j]
    = ``weights[h, i, j] * ||V[h, j] @ W_O[h]||`` (Kobayashi et al. 2020). Torch tensors in and out."""
    ex = "13.1 norms of the moved vectors"
    weights, V, W_O = _inputs()
    as_t = torch.from_numpy
    got = to_numpy(call_learner(ex, fn, as_t(weights.copy()), as_t(V.copy()), as_t(W_O.copy())))
    moved = np.linalg.norm(V @ W_O, axis=-1)  # (H, T, Dh) @ (H, Dh, D) -> (H, T, D) -> (H, T)
    expected = weights * moved[:, None, :]  # (H, T, T) * (H, 1, T)
    if got is not None and got.shape == expected.shape:
        mistakes = {
            "You took the norm of the value vector alone: the vector a head adds to the output is "
            "v_j W_O^h, so multiply by the head's rows of W_O before the norm.": weights
            * np.linalg.norm(V, axis=-1)[:, None, :],
            "You squared the norm: use the length ||v_j W_O^h||, not its square.": weights
            * (moved**2)[:, None, :],
            "You left out the attention weight: each edge moves alpha_ij * v_j W_O^h, so multiply "
            "the norm by the weight.": np.broadcast_to(moved[:, None, :], expected.shape),
            "You indexed the norms by the query (rows) instead of the key (columns): the vector "
            "moved along edge (i, j) is key j's.": weights * moved[:, :, None],
        }
        for message, wrong in mistakes.items():
            if np.allclose(got, wrong, atol=_ATOL, rtol=_RTOL) and not np.allclose(
                got, expected, atol=_ATOL, rtol=_RTOL
            ):
                return failed(ex, message)
    bad = compare_arrays(ex, got, expected, what="the norms", atol=_ATOL, rtol=_RTOL)
    if bad is not None and got is not None and got.shape == expected.shape and np.isfinite(got).all():
        worst = float(np.max(np.abs(got - expected)))
        if worst < 1e-2:
            return failed(ex, f"Close (largest error {worst:.3g}) but not within {_ATOL:g}: check for a small "
                              "leftover, such as an epsilon added inside the norm or float16 arithmetic "
                              "(float32 and float64 both pass).")  # fmt: skip
    if bad is not None:
        return bad
    return passed(ex, "alpha_ij * ||v_j W_O^h||: the length of what the edge actually adds.")


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
                        "the head's effect, measured without pushing the layer off distribution as zeros would.")


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
