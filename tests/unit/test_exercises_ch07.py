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


def test_layer_norm_accepts_a_float32_answer():
    # regression: a tolerance of 1e-9 rejected a right answer computed in float32 ("largest error 3.2e-07")
    fb = ch07.check_layer_norm(
        lambda x, g, b, eps: _layer_norm(x.float(), g.float(), b.float(), eps)
    )
    assert fb.ok, fb.message


def test_layer_norm_catches_a_missing_beta_or_gamma():
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, g, torch.zeros_like(b), eps))
    assert not fb.ok and "did not add the shift beta" in fb.message, fb.message
    fb = ch07.check_layer_norm(lambda x, g, b, eps: _layer_norm(x, torch.ones_like(g), b, eps))
    assert not fb.ok and "did not multiply by the scale gamma" in fb.message, fb.message


def test_post_norm_block_names_three_more_slips():
    cases = [
        (
            lambda x, attn, ffn, ln1, ln2: ln2(ffn(ln1(x + attn(x)))),
            "second residual connection is missing",
        ),
        (
            lambda x, attn, ffn, ln1, ln2: ln2(ln1(x + attn(x)) + ffn(x)),
            "feed-forward sublayer read x",
        ),
        (
            lambda x, attn, ffn, ln1, ln2: (lambda h: ln1(h + ffn(h)))(ln2(x + attn(x))),
            "ln1 and ln2 are swapped",
        ),
    ]
    for wrong, words in cases:
        fb = ch07.check_post_norm_block(wrong)
        assert not fb.ok and words in fb.message, fb.message


def test_post_norm_block_accepts_a_float32_answer():
    def in_float32(x, attn, ffn, ln1, ln2):
        h = ln1(x + attn(x)).float()
        return ln2((h + ffn(h.double()).float()).double())

    fb = ch07.check_post_norm_block(in_float32)
    assert fb.ok, fb.message


# 7.3 pre-norm block from its parts


def _ln(v, g, b, eps, correction=0):
    mean = v.mean(-1, keepdim=True)
    return g * (v - mean) / torch.sqrt(v.var(-1, correction=correction, keepdim=True) + eps) + b


def _pre_norm(x, attn, p, eps, *, order="pre", res1=True, res2=True, act=torch.nn.functional.gelu, ln2_reads="h",
              res_from_norm=False, correction=0, swap=False):
    ln1 = (p["ln2_gamma"], p["ln2_beta"]) if swap else (p["ln1_gamma"], p["ln1_beta"])
    ln2 = (p["ln1_gamma"], p["ln1_beta"]) if swap else (p["ln2_gamma"], p["ln2_beta"])

    def ffn(v):
        return act(v @ p["W_1"] + p["b_1"]) @ p["W_2"] + p["b_2"]

    if order == "post":
        h = _ln(x + attn(x), *ln1, eps)
        return _ln(h + ffn(h), *ln2, eps)
    n1 = _ln(x, *ln1, eps, correction)
    h = (n1 if res_from_norm else x) + attn(n1) if res1 else attn(n1)
    f = ffn(_ln(h if ln2_reads == "h" else x, *ln2, eps, correction))
    return h + f if res2 else f


def test_pre_norm_block_accepts_the_solution_and_torch_layer_norm():
    assert ch07.check_pre_norm_block(_pre_norm)

    def with_torch(x, attn, p, eps):
        F = torch.nn.functional
        D = x.shape[-1]
        h = x + attn(F.layer_norm(x, (D,), p["ln1_gamma"], p["ln1_beta"], eps))
        v = F.layer_norm(h, (D,), p["ln2_gamma"], p["ln2_beta"], eps)
        return h + F.linear(F.gelu(F.linear(v, p["W_1"].T, p["b_1"])), p["W_2"].T, p["b_2"])

    assert ch07.check_pre_norm_block(with_torch)


def test_pre_norm_block_names_each_mistake():
    cases = [
        ({"order": "post"}, "post-norm block"),
        ({"res1": False, "res2": False}, "Both residual connections are missing"),
        ({"res1": False}, "first residual connection is missing"),
        ({"res2": False}, "second residual connection is missing"),
        ({"res_from_norm": True}, "adds the normalised input"),
        ({"ln2_reads": "x"}, "read LN2(x)"),
        ({"act": lambda t: t}, "no nonlinearity"),
        ({"act": torch.relu}, "used ReLU"),
        ({"swap": True}, "ln1 and ln2 are swapped"),
        ({"correction": 1}, "unbiased variance"),
    ]
    for kwargs, words in cases:
        fb = ch07.check_pre_norm_block(lambda x, attn, p, eps, kwargs=kwargs: _pre_norm(x, attn, p, eps, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)


def test_pre_norm_block_shape_nan_stub_and_crash():
    def stub(x, attn, p, eps):
        raise NotImplementedError

    assert not ch07.check_pre_norm_block(stub).attempted
    fb = ch07.check_pre_norm_block(lambda x, attn, p, eps: _pre_norm(x, attn, p, eps)[0])
    assert not fb and "shape" in fb.message
    fb = ch07.check_pre_norm_block(lambda x, attn, p, eps: _pre_norm(x, attn, p, eps) / 0)
    assert not fb and "NaN or inf" in fb.message
    fb = ch07.check_pre_norm_block(lambda x, attn, p, eps: x @ p["W_1"].T)
    assert not fb and "raised RuntimeError" in fb.message
    fb = ch07.check_pre_norm_block(lambda x, attn, p, eps: x + 1.0)
    assert not fb and "wrong values" in fb.message


# 7.4 RMSNorm


def _rms(x, g, eps, *, dim=-1, mean=True, eps_inside=True, centre=False, gain=True, root=True):
    if centre:
        x = x - x.mean(dim=dim, keepdim=True)
    sq = x.pow(2).mean(dim=dim, keepdim=True) if mean else x.pow(2).sum(dim=dim, keepdim=True)
    if centre:
        sq = x.pow(2).mean(dim=-1, keepdim=True)
    denom = (torch.sqrt(sq + eps) if eps_inside else torch.sqrt(sq) + eps) if root else sq + eps
    return (g if gain else 1.0) * x / denom


def test_rms_norm_solution_passes():
    assert ch07.check_rms_norm(_rms)


def test_rms_norm_names_each_mistake():
    cases = [
        ({"centre": True}, "that is layer norm"),
        ({"eps_inside": False}, "eps is in the wrong place"),
        ({"mean": False}, "sum of squares"),
        ({"dim": -2}, "over the positions"),
        ({"gain": False}, "gain g is missing"),
        ({"root": False}, "not its square root"),
    ]
    for kwargs, words in cases:
        fb = ch07.check_rms_norm(lambda x, g, eps, kwargs=kwargs: _rms(x, g, eps, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)


def test_rms_norm_shape_nan_stub():
    def stub(x, g, eps):
        raise NotImplementedError

    assert not ch07.check_rms_norm(stub).attempted
    fb = ch07.check_rms_norm(lambda x, g, eps: _rms(x, g, eps).mean(-1))
    assert not fb and "shape" in fb.message
    fb = ch07.check_rms_norm(lambda x, g, eps: x / 0.0)
    assert not fb and "NaN or inf" in fb.message
