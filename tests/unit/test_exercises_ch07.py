"""Chapter 07's checks accept the reference solutions and explain the typical mistakes."""

from __future__ import annotations

import torch

from selfattn.exercises import ch07


def _layer_norm(x, gamma, beta, eps, *, dim=-1, correction=0, eps_inside=True, affine=True):
    mean = x.mean(dim=dim, keepdim=True)
    var = x.var(dim=dim, correction=correction, keepdim=True)
    normed = (x - mean) / (torch.sqrt(var + eps) if eps_inside else var.sqrt() + eps)
    return gamma * normed + beta if affine else normed


def test_layer_norm_accepts_the_solution_and_torch():
    fb = ch07.check_layer_norm(_layer_norm)
    assert fb.ok and fb.attempted
    assert ch07.check_layer_norm(
        lambda x, g, b, eps: torch.nn.functional.layer_norm(x, x.shape[-1:], g, b, eps)
    )


def test_layer_norm_catches_the_wrong_axis():
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, g, b, eps, dim=-2))
    assert not fb.ok and "over the positions" in fb.message
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, g, b, eps, dim=(-2, -1)))
    assert not fb.ok and "positions and features together" in fb.message


def test_layer_norm_catches_unbiased_variance():
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, g, b, eps, correction=1))
    assert not fb.ok and "unbiased variance" in fb.message


def test_layer_norm_catches_eps_outside_the_square_root():
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, g, b, eps, eps_inside=False))
    assert not fb.ok and "eps is in the wrong place" in fb.message


def test_layer_norm_catches_missing_gamma_and_beta():
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, g, b, eps, affine=False))
    assert not fb.ok and "gamma" in fb.message


def test_layer_norm_not_attempted():
    def stub(x, g, b, eps):
        raise NotImplementedError

    fb = ch07.check_layer_norm(stub)
    assert not fb.ok and not fb.attempted


def test_post_norm_block_accepts_the_solution():
    def block(x, attn, ffn, ln1, ln2):
        h = ln1(x + attn(x))
        return ln2(h + ffn(h))

    fb = ch07.check_post_norm_block(block)
    assert fb.ok and fb.attempted


def test_post_norm_block_catches_pre_norm_order():
    def pre_norm(x, attn, ffn, ln1, ln2):
        h = x + attn(ln1(x))
        return h + ffn(ln2(h))

    fb = ch07.check_post_norm_block(pre_norm)
    assert not fb.ok and "pre-norm" in fb.message


def test_post_norm_block_catches_missing_residuals():
    fb = ch07.check_post_norm_block(lambda x, attn, ffn, ln1, ln2: ln2(ffn(ln1(attn(x)))))
    assert not fb.ok and "residual connections are missing" in fb.message


def test_post_norm_block_catches_normalising_the_branch_then_adding():
    def norm_then_add(x, attn, ffn, ln1, ln2):
        h = x + ln1(attn(x))
        return h + ln2(ffn(h))

    fb = ch07.check_post_norm_block(norm_then_add)
    assert not fb.ok and "normalised the branch output" in fb.message


def test_post_norm_block_catches_a_missing_ffn():
    fb = ch07.check_post_norm_block(lambda x, attn, ffn, ln1, ln2: ln1(x + attn(x)))
    assert not fb.ok and "feed-forward sublayer" in fb.message
