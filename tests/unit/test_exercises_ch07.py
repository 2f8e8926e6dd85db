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


# 7.3 RMSNorm


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


# 7.4 QK-norm attention weights


def _qk(q, k, g_q, g_k, eps, *, dim=-1, norm_q=True, norm_k=True, gains=True, centre=False, eps_inside=True,
        scale=None, softmax_dim=-1):
    def norm(x, g):
        if centre:
            x = x - x.mean(dim=dim, keepdim=True)
        ms = x.pow(2).mean(dim=dim, keepdim=True)
        x = x / (torch.sqrt(ms + eps) if eps_inside else torch.sqrt(ms) + eps)
        return g * x if gains else x

    qn = norm(q, g_q) if norm_q else q
    kn = norm(k, g_k) if norm_k else k
    scale = q.shape[-1] ** 0.5 if scale is None else scale
    return torch.softmax(qn @ kn.transpose(-1, -2) / scale, dim=softmax_dim)  # (B, H, T, S)


def test_qk_norm_weights_accepts_the_solution_the_package_and_float32():
    fb = ch07.check_qk_norm_weights(_qk)
    assert fb and fb.attempted and "QKNormAttention" in fb.message, fb.message

    def with_torch_rmsnorm(q, k, g_q, g_k, eps):
        F = torch.nn.functional
        qn = F.rms_norm(q, (q.shape[-1],), g_q, eps)
        kn = F.rms_norm(k, (k.shape[-1],), g_k, eps)
        return torch.softmax(qn @ kn.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)

    assert ch07.check_qk_norm_weights(with_torch_rmsnorm)
    # the score is a sum over i of g_q[i] g_k[i] q_hat[i] k_hat[i]: the gains swapped give the same weights
    assert ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: _qk(q, k, g_k, g_q, eps))
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: _qk(q.float(), k.float(), g_q.float(), g_k.float(), eps))
    assert fb, fb.message


def test_qk_norm_weights_agree_with_the_package_module():
    # the checker's expected weights are those of selfattn.modern.QKNormAttention's normalisation
    from selfattn import modern

    q, k, g_q, g_k = (torch.from_numpy(a) for a in ch07._qk_inputs())
    q_norm, k_norm = modern.RMSNorm(8, 0.1).double(), modern.RMSNorm(8, 0.1).double()
    with torch.no_grad():
        q_norm.weight.copy_(g_q)
        k_norm.weight.copy_(g_k)
        package = torch.softmax(q_norm(q) @ k_norm(k).transpose(-1, -2) / 8**0.5, dim=-1)
    torch.testing.assert_close(package, _qk(q, k, g_q, g_k, 0.1), rtol=0, atol=1e-12)


def test_qk_norm_weights_names_each_mistake():
    cases = [
        ({"softmax_dim": -2}, "softmax over the queries"),
        ({"dim": -2}, "normalised over the positions"),
        ({"dim": (1, 3)}, "over all heads' features together"),
        ({"norm_k": False}, "Only the queries are normalised"),
        ({"norm_q": False}, "Only the keys are normalised"),
        ({"gains": False}, "gains are missing"),
        ({"centre": True}, "that is layer norm"),
        ({"eps_inside": False}, "eps is in the wrong place"),
        ({"scale": 1.0}, "scores are not scaled"),
        ({"scale": (3 * 8) ** 0.5}, "sqrt(H * d_head)"),
    ]
    for kwargs, words in cases:
        fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps, kwargs=kwargs: _qk(q, k, g_q, g_k, eps, **kwargs))
        assert not fb and fb.attempted and words in fb.message, (kwargs, fb.message)


def test_qk_norm_weights_shape_nan_stub_crash_and_other_values():
    def stub(q, k, g_q, g_k, eps):
        raise NotImplementedError

    fb = ch07.check_qk_norm_weights(stub)
    assert not fb and not fb.attempted
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: _qk(q, k, g_q, g_k, eps)[0])
    assert not fb and "should have shape (2, 3, 4, 5); got (3, 4, 5)" in fb.message, fb.message
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: _qk(q, k, g_q, g_k, eps).transpose(-1, -2))
    assert not fb and "shape" in fb.message
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: _qk(q, k, g_q, g_k, eps) / 0.0)
    assert not fb and "NaN or inf" in fb.message
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: q @ k)
    assert not fb and "raised RuntimeError" in fb.message
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: "weights")
    assert not fb and "should be an array or tensor; got str" in fb.message, fb.message
    fb = ch07.check_qk_norm_weights(lambda q, k, g_q, g_k, eps: torch.full((2, 3, 4, 5), 0.2, dtype=torch.float64))
    assert not fb and "wrong values" in fb.message
