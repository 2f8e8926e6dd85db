"""Chapter 13's exercise checks: the reference solutions pass, typical mistakes get the right words."""

from __future__ import annotations

import numpy as np

from selfattn.exercises import ch13


def rollout(weights, *, reverse=False, residual=True, sum_heads=False, plus_identity=False, elementwise=False,
            last_only=False):
    import torch

    L, H, T, _ = weights.shape
    A = weights.sum(1) if sum_heads else weights.mean(1)  # (L, T, T)
    eye = torch.eye(T, dtype=weights.dtype)
    if plus_identity:
        A = eye + A
    elif residual:
        A = 0.5 * eye + 0.5 * A
    if not plus_identity:
        A = A / A.sum(-1, keepdim=True)
    if last_only:
        return A[-1]
    out = A[0]
    for layer in range(1, L):
        out = out * A[layer] if elementwise else (out @ A[layer] if reverse else A[layer] @ out)
    return out


def block_edge(weights, i, j):
    out = weights.copy()
    out[i, j] = 0.0
    out[i] /= out[i].sum()
    return out


def test_reference_solutions_pass():
    assert ch13.check_rollout(rollout)
    assert ch13.check_rollout(lambda w: rollout(w.float()))  # float32 passes
    assert ch13.check_block_edge(block_edge)


def test_not_attempted_is_not_a_failure():
    def stub(*args):
        raise NotImplementedError

    for check in (ch13.check_rollout, ch13.check_block_edge, ch13.check_mean_ablation, ch13.check_attention_entropy):
        feedback = check(stub)
        assert not feedback and not feedback.attempted


def test_rollout_mistakes_are_named():
    cases = (
        (dict(reverse=True), "wrong order"),
        (dict(residual=False), "residual stream"),
        (dict(sum_heads=True), "summed the heads"),
        (dict(plus_identity=True), "do not sum to one"),
        (dict(elementwise=True), "entry by entry"),
        (dict(last_only=True), "last layer alone"),
    )
    for kwargs, words in cases:
        feedback = ch13.check_rollout(lambda w, kw=kwargs: rollout(w, **kw))
        assert not feedback and words in feedback.message, (kwargs, feedback.message)
    feedback = ch13.check_rollout(lambda w: w.mean(1))
    assert not feedback and "one matrix per layer" in feedback.message
    feedback = ch13.check_rollout(lambda w: rollout(w) * float("nan"))
    assert not feedback and "NaN" in feedback.message
    feedback = ch13.check_rollout(lambda w: rollout(w)[:2])
    assert not feedback and "shape" in feedback.message


def test_block_edge_mistakes():
    def no_renorm(w, i, j):
        out = w.copy()
        out[i, j] = 0.0
        return out

    def column(w, i, j):
        out = w.copy()
        out[:, j] = 0.0
        return out / out.sum(-1, keepdims=True)

    def in_place(w, i, j):
        w[i, j] = 0.0
        w[i] /= w[i].sum()
        return w

    feedback = ch13.check_block_edge(no_renorm)
    assert not feedback and "renormalise" in feedback.message
    feedback = ch13.check_block_edge(column)
    assert not feedback and "every query" in feedback.message
    feedback = ch13.check_block_edge(in_place)
    assert not feedback and "copy" in feedback.message
    feedback = ch13.check_block_edge(lambda w, i, j: np.zeros_like(w))
    assert not feedback and "wrong values" in feedback.message


def mean_ablation(contexts, W_O, h, loss_fn, *, how="mean", sign=1, difference=True):
    import torch

    B, T, H, Dh = contexts.shape
    clean = loss_fn(contexts.reshape(B, T, H * Dh) @ W_O)
    ablated = contexts.clone()
    if how == "mean":
        ablated[:, :, h] = contexts[:, :, h].mean(dim=(0, 1))
    elif how == "zero":
        ablated[:, :, h] = 0.0
    elif how == "per_sequence":
        ablated[:, :, h] = contexts[:, :, h].mean(dim=1, keepdim=True)
    elif how == "per_position":
        ablated[:, :, h] = contexts[:, :, h].mean(dim=0, keepdim=True)
    flat = ablated.reshape(B, T, H * Dh)
    if how == "head_major":
        flat = contexts.reshape(B, T, H * Dh).clone()
        flat[..., h::H] = flat[..., h::H].mean(dim=(0, 1))
    new = loss_fn(flat @ W_O)
    assert isinstance(new, torch.Tensor)
    return (sign * (new - clean)).item() if difference else new.item()


def test_mean_ablation_solution_passes_and_mistakes_are_named():
    assert ch13.check_mean_ablation(mean_ablation)
    assert ch13.check_mean_ablation(lambda *a: mean_ablation(*a) * 1.0)
    cases = (
        (dict(how="zero"), "zero ablation"),
        (dict(how="per_sequence"), "each sequence's positions"),
        (dict(how="per_position"), "over the batch at each position"),
        (dict(how="head_major"), "columns h, h + H"),
        (dict(sign=-1), "sign is reversed"),
        (dict(difference=False), "ablated loss itself"),
    )
    for kwargs, words in cases:
        fb = ch13.check_mean_ablation(lambda *a, kw=kwargs: mean_ablation(*a, **kw))
        assert not fb.ok and words in fb.message, (kwargs, fb.message)
    for fn, words in ((lambda *a: [1.0], "one number"), (lambda *a: float("nan"), "finite"), (lambda *a: 0.5, "rises by"),
                      (lambda c, W_O, h, loss_fn: loss_fn(c).item(), "raised ValueError")):
        fb = ch13.check_mean_ablation(fn)
        assert not fb.ok and words in fb.message, fb.message


def entropy(weights):
    import torch

    return -torch.special.xlogy(weights, weights).sum(-1)


def test_attention_entropy_solution_passes_and_mistakes_are_named():
    import math

    import torch

    assert ch13.check_attention_entropy(entropy)
    cases = (
        (lambda w: entropy(w) / math.log(2), "bits"),
        (lambda w: -entropy(w), "sign is reversed"),
        (lambda w: entropy(w) / math.log(w.shape[-1]), "divided by log S"),
        (lambda w: -(w * w.log()).sum(-1), "0 * log 0"),
        (lambda w: -torch.special.xlogy(w, w).sum(-2), "one number per key"),
        (lambda w: entropy(w)[0], "should have shape"),
    )
    for fn, words in cases:
        fb = ch13.check_attention_entropy(fn)
        assert not fb.ok and words in fb.message, fb.message
