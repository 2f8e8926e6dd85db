"""Chapter 14's exercise checks: the reference solutions pass, typical mistakes get the right words."""

from __future__ import annotations

import torch

from selfattn.exercises import ch14


def induction_score(weights, L, *, offset=1, transposed=False):
    i = torch.arange(L - 1)
    w = weights.transpose(-1, -2) if transposed else weights
    return w[:, :, L + i, i + offset].mean(dim=(0, 2))  # (H,)


def test_induction_solution_passes_and_mistakes_are_named():
    assert ch14.check_induction_score(induction_score)
    cases = (
        (lambda w, L: induction_score(w, L, offset=0), "duplicate-token"),
        (lambda w, L: w[:, :, L + torch.arange(L - 1), L + torch.arange(L - 1) - 1].mean(dim=(0, 2)), "previous-token"),
        (lambda w, L: induction_score(w, L, offset=2), "Off by one"),
        (lambda w, L: induction_score(w, L, transposed=True), "weights[key, query]"),
        (lambda w, L: w[:, :, L + torch.arange(L - 1), torch.arange(1, L)].sum(dim=(0, 2)), "You summed"),
        (lambda w, L: w.diagonal(offset=-(L - 1), dim1=-2, dim2=-1).mean(dim=(0, 2)), "whole diagonal"),
        (lambda w, L: w.diagonal(offset=-(L - 1), dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2)), "One query too many"),
        (lambda w, L: induction_score(w, L).mean(), "one number"),
        (lambda w, L: induction_score(w, L)[:2], "should have shape"),
        (lambda w, L: induction_score(w, L) * torch.nan, "NaN"),
    )
    for fn, words in cases:
        fb = ch14.check_induction_score(fn)
        assert not fb.ok and words in fb.message, (words, fb.message)
    # the extra query's key (L, the second copy's first token) exists: the reason is the match with
    # induction_scores, whose spans are separated, not a missing key
    fb = ch14.check_induction_score(lambda w, L: w.diagonal(offset=-(L - 1), dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2)))
    assert "induction_scores" in fb.message and "separated" in fb.message and "no next token" not in fb.message


def decode_step(x, K_cache, V_cache, W_Q, W_K, W_V, W_O, *, mistake=None):
    B, _, D = x.shape
    H, Dh = K_cache.shape[1], K_cache.shape[-1]

    def heads(W):
        return (x @ W).view(B, 1, H, Dh).transpose(1, 2)  # (B, H, 1, Dh)

    q, k, v = heads(W_Q), heads(W_K), heads(W_V)
    if mistake == "prepend":
        K, V = torch.cat([k, K_cache], dim=2), torch.cat([v, V_cache], dim=2)
    else:
        K, V = torch.cat([K_cache, k], dim=2), torch.cat([V_cache, v], dim=2)  # (B, H, S + 1, Dh)
    K_read, V_read = (K_cache, V_cache) if mistake == "before_append" else (K, V)
    scores = q @ K_read.transpose(-2, -1) / {"no_scale": 1.0, "sqrt_D": D**0.5}.get(mistake, Dh**0.5)  # (B, H, 1, S + 1)
    if mistake == "top_left":
        scores = scores.masked_fill(~torch.tril(torch.ones(1, scores.shape[-1], dtype=torch.bool)), float("-inf"))
    context = (torch.softmax(scores, dim=-2 if mistake == "query_axis" else -1) @ V_read).transpose(1, 2).reshape(B, 1, D)
    out = context if mistake == "no_W_O" else context @ W_O
    if mistake == "old_cache":
        return out, K_cache, V_cache
    return out, K, V


def test_decode_step_solution_passes_and_mistakes_are_named():
    assert ch14.check_decode_step(decode_step)
    cases = (("before_append", "cache only"), ("top_left", "only the first key"), ("no_scale", "sqrt(Dh)"),
             ("no_W_O", "output projection W_O"), ("prepend", "new position first"), ("old_cache", "still has S = 5"),
             ("sqrt_D", "sqrt(D), the model width"), ("query_axis", "over the queries (dim=-2)"))
    for mistake, words in cases:
        fb = ch14.check_decode_step(lambda *a, m=mistake: decode_step(*a, mistake=m))
        assert not fb.ok and words in fb.message, (mistake, fb.message)
    fb = ch14.check_decode_step(lambda *a: decode_step(*a)[0])
    assert not fb.ok and "triple" in fb.message
    fb = ch14.check_decode_step(lambda *a: (decode_step(*a)[0] * torch.nan, *decode_step(*a)[1:]))
    assert not fb.ok and "NaN" in fb.message


def adamw_step(params, grads, m, v, step, lr, betas, eps, weight_decay, max_norm, *, mistake=None):
    b1, b2 = betas
    total = torch.sqrt(sum((g**2).sum() for g in grads))
    if mistake == "per_tensor":
        grads = [g * min(1.0, max_norm / (g.norm().item() + 1e-6)) for g in grads]
    elif mistake != "no_clip":
        grads = [g * min(1.0, max_norm / (total.item() + 1e-6)) for g in grads]
    new = ([], [], [])
    for p, g, m_i, v_i in zip(params, grads, m, v, strict=True):
        if mistake == "l2":
            g = g + weight_decay * p
        else:
            p = p * (1 - (weight_decay if mistake == "decay_no_lr" else lr * weight_decay))
        m_i = b1 * m_i + (1 - b1) * g
        v_i = b2 * v_i + (1 - b2) * g * g
        m_hat, v_hat = (m_i, v_i) if mistake == "no_bias" else (m_i / (1 - b1**step), v_i / (1 - b2**step))
        denominator = torch.sqrt(v_hat + eps) if mistake == "eps_inside" else v_hat.sqrt() + eps
        for lst, x in zip(new, (p - lr * m_hat / denominator, m_i, v_i), strict=True):
            lst.append(x)
    return new


def test_adamw_solution_passes_and_matches_torch():
    fb = ch14.check_adamw_step(adamw_step)
    assert fb, fb.message

    def clip_without_the_epsilon(params, grads, *rest):  # max_norm / total_norm exactly: within the tolerance
        return adamw_step(params, [g * (1 - 1e-7) for g in grads], *rest)

    assert ch14.check_adamw_step(clip_without_the_epsilon)


def test_adamw_mistakes_are_named():
    cases = (("l2", "L2 regularisation"), ("no_bias", "bias correction is missing"), ("no_clip", "unclipped"),
             ("per_tensor", "each tensor on its own"), ("eps_inside", "inside the square root"),
             ("decay_no_lr", "multiplies it by the learning rate"))
    for mistake, words in cases:
        fb = ch14.check_adamw_step(lambda *a, m=mistake: adamw_step(*a, mistake=m))
        assert not fb.ok and words in fb.message, (mistake, fb.message)
    for fn, words in ((lambda *a: adamw_step(*a)[0], "triple"),
                      (lambda *a: (adamw_step(*a)[0], adamw_step(*a)[1], [x.reshape(-1, 1) for x in adamw_step(*a)[2]]), "shape"),
                      (lambda *a: ([x * torch.inf for x in adamw_step(*a)[0]], *adamw_step(*a)[1:]), "NaN or inf"),
                      (lambda *a: ([x + 1 for x in adamw_step(*a)[0]], *adamw_step(*a)[1:]), "differ from")):
        fb = ch14.check_adamw_step(fn)
        assert not fb.ok and words in fb.message, fb.message


def lr_at(step, lr, warmup, total, min_lr, *, mistake=None):
    import math

    if step < warmup:
        return lr * (step if mistake == "from_zero" else step + 1) / warmup
    low = 0.0 if mistake == "to_zero" else min_lr
    progress = {"whole_run": step / total, "over_total": (step - warmup) / total}.get(mistake, (step - warmup) / (total - warmup))
    if mistake == "linear":
        return low + (lr - low) * (1 - progress)
    if mistake == "bare_cos":
        return low + (lr - low) * math.cos(math.pi * progress)
    return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * progress))


def test_lr_schedule_solution_passes_matches_train_lm_and_mistakes_are_named():
    assert ch14.check_lr_schedule(lr_at)
    assert ch14.check_lr_schedule(lambda *a: torch.tensor(lr_at(*a)))
    # the schedule of selfattn.models.gpt.train_lm: warmup = steps // 20, min_lr = lr / 10
    import math

    steps = 200
    for step in (0, 9, 10, 100, 199):
        factor = (step + 1) / 10 if step < 10 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 10) / (steps - 10)))
        assert abs(lr_at(step, 1.0, 10, steps, 0.1) - factor) < 1e-12
    cases = (("from_zero", "starts at 0"), ("to_zero", "ends at 0"), ("whole_run", "whole run"), ("linear", "linear decay"),
             ("bare_cos", "goes from 1 to -1"), ("over_total", "you divided (step - warmup) by total"))
    for mistake, words in cases:
        fb = ch14.check_lr_schedule(lambda *a, m=mistake: lr_at(*a, mistake=m))
        assert not fb.ok and words in fb.message, (mistake, fb.message)
    for fn, words in ((lambda *a: [1.0], "one number"), (lambda *a: float("inf"), "finite"), (lambda *a: 1e-3, "you returned")):
        fb = ch14.check_lr_schedule(fn)
        assert not fb.ok and words in fb.message, fb.message
