"""Chapter 13's exercise checks: the reference solutions pass, typical mistakes get the right words."""

from __future__ import annotations

import numpy as np

from selfattn.exercises import ch13


def moved_norms(weights, V, W_O):
    moved = (V @ W_O).norm(dim=-1)  # (H, T, Dh) @ (H, Dh, D) -> (H, T, D) -> (H, T)
    return weights * moved[:, None, :]


def block_edge(weights, i, j):
    out = weights.copy()
    out[i, j] = 0.0
    out[i] /= out[i].sum()
    return out


def test_reference_solutions_pass():
    assert ch13.check_moved_norms(moved_norms)
    assert ch13.check_block_edge(block_edge)


def test_not_attempted_is_not_a_failure():
    def stub(*args):
        raise NotImplementedError

    for check in (ch13.check_moved_norms, ch13.check_block_edge):
        feedback = check(stub)
        assert not feedback and not feedback.attempted


def test_moved_norms_mistakes():
    no_wo = ch13.check_moved_norms(lambda w, V, W_O: w * V.norm(dim=-1)[:, None, :])
    assert not no_wo and "W_O" in no_wo.message
    squared = ch13.check_moved_norms(
        lambda w, V, W_O: w * ((V @ W_O).norm(dim=-1) ** 2)[:, None, :]
    )
    assert not squared and "squared" in squared.message
    no_weight = ch13.check_moved_norms(
        lambda w, V, W_O: (V @ W_O).norm(dim=-1)[:, None, :].expand_as(w)
    )
    assert not no_weight and "weight" in no_weight.message
    rows = ch13.check_moved_norms(lambda w, V, W_O: w * (V @ W_O).norm(dim=-1)[:, :, None])
    assert not rows and "query" in rows.message
    crash = ch13.check_moved_norms(lambda w, V, W_O: w @ W_O)
    assert not crash and "raised" in crash.message


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


def test_moved_norms_accepts_float32_and_says_close():
    def float32(weights, V, W_O):  # right, but in float32: off by ~1e-6
        return moved_norms(weights.float(), V.float(), W_O.float())

    def with_eps(weights, V, W_O):  # a small leftover factor: off by ~1e-4 relative
        return moved_norms(weights, V, W_O) * (1 - 1e-4)

    assert ch13.check_moved_norms(float32)
    feedback = ch13.check_moved_norms(with_eps)
    assert not feedback and "Close" in feedback.message and "1e-05" in feedback.message, feedback.message


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
