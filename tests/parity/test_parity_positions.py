"""selfattn.positions against the position code of real models in ``transformers`` (chapter 08).

Every transformers module is built from a config with random or fixed weights; nothing is
downloaded. What is compared, and why each tolerance is what it is:

(a) Llama (GPT-NeoX's "half" layout): ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` against
    ``apply_rope(layout="half")``. Llama computes its inverse frequencies and the angles
    ``position * inv_freq`` in float32 whatever the input dtype (``.float()`` in its forward), so the
    whole path is compared to our float64 result at a float32 tolerance: the angle ``a = p theta``
    carries a relative error of a few 2^-24, i.e. an absolute one of about ``a * 2^-23``, so the
    outputs may differ by ``|x| * max_angle * 2^-22`` (asserted, and the measured maximum printed).
    The rotation itself (``apply_rotary_pos_emb`` with cos/sin built in float64 in Llama's layout)
    is compared at 1e-12.
(b) Llama's "linear" scaling (position interpolation) against ``interpolation=factor``, and its
    "dynamic" NTK scaling against :func:`ntk_scaled_base`. HF's dynamic base for a sequence of L
    positions, trained length L0, is ``base * (factor * L / L0 - (factor - 1))^(Dh / (Dh - 2))``:
    our NTK base with the effective factor ``s = factor * L / L0 - (factor - 1)``, which is 1 at
    L = L0 and reaches ``factor`` at ``L = (2 - 1 / factor) * L0`` (both asserted). Float32 again.
(c) GPT-J (the "interleaved" layout, only on the first ``rotary_dim`` features of each head) and
    RoFormer against ``apply_rope(layout="interleaved")``. GPT-J's sin/cos table, rebuilt in float64
    by its own ``create_sinusoidal_positions`` under a float64 default dtype, gives 1e-12; the
    float32 table its module stores, float32 tolerance. RoFormer's rotation at 1e-12 with float64
    sin/cos; its float32 sinusoid table against our angles at 1e-6.
(d) BLOOM's ALiBi: its slopes (float32) against :func:`alibi_slopes` for every H in 1..64, exactly
    for H <= 8 (every ratio a power of two) and otherwise within ``k * 2^-24`` relative for the k-th
    power of a float32-rounded ratio; its bias ``m_h * j`` differs from ours ``-m_h (i - j)`` by a
    constant per query row (asserted, 1e-12), so softmax weights under a causal mask agree (1e-12
    with BLOOM's own slopes, 1e-5 with ours).
(e) A whole ``LlamaAttention`` layer (random weights, float64, float64 cos/sin) against selfattn's
    projections + ``apply_rope`` + causal attention: 1e-6, because Llama's eager softmax runs in
    float32; and the porting permutation end to end (interleaved RoPE with each head's W_Q / W_K
    columns un-permuted gives Llama's output; without the permutation it does not).

Measured maxima are printed after the module's tests (run with ``-s``).
"""

from __future__ import annotations

import math

import pytest
import torch

from selfattn import positions as P

transformers = pytest.importorskip("transformers")

from transformers.models.bloom.modeling_bloom import (  # noqa: E402
    _get_alibi_slopes,
    build_alibi_tensor,
)
from transformers.models.gptj.modeling_gptj import (  # noqa: E402
    GPTJRotaryEmbedding,
    create_sinusoidal_positions,
)
from transformers.models.gptj.modeling_gptj import (  # noqa: E402
    apply_rotary_pos_emb as gptj_apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
)
from transformers.models.llama.modeling_llama import (  # noqa: E402
    apply_rotary_pos_emb as llama_apply_rotary_pos_emb,
)
from transformers.models.roformer.modeling_roformer import (  # noqa: E402
    RoFormerSelfAttention,
    RoFormerSinusoidalPositionalEmbedding,
)

TOL64 = 1e-12
EPS32 = 2.0**-24  # float32 unit roundoff
MEASURED: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_measured_differences():
    yield
    print()
    for name, diff in sorted(MEASURED.items()):
        print(f"{name:60s} max abs diff {diff:.2e}")


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 0.0):
    """assert_close (fails on NaN) and record the measured max abs difference."""
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    diff = (actual.double() - expected.double()).abs().max().item()
    MEASURED[name] = max(diff, MEASURED.get(name, 0.0))


def _gaussian(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _llama_config(head_dim: int, rope_parameters: dict, max_positions: int = 4096):
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=rope_parameters,
    )


def _float32_angle_atol(x: torch.Tensor, max_angle: float) -> float:
    """Bound on |rotation error| when the angles come from float32: |x| * max_angle * 2^-22."""
    return x.abs().max().item() * max_angle * 4 * EPS32 + 1e-12


# --- (a) Llama ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("head_dim", "theta"), [(16, 10000.0), (64, 500000.0), (128, 500000.0)])
def test_llama_rotary_embedding_equals_apply_rope_half(head_dim, theta):
    rotary = LlamaRotaryEmbedding(
        _llama_config(head_dim, {"rope_type": "default", "rope_theta": theta})
    )
    _close(
        "llama inv_freq (float32) vs rope_frequencies, relative",
        rotary.inv_freq.double() / P.rope_frequencies(head_dim, base=theta),
        torch.ones(head_dim // 2, dtype=torch.float64),
        atol=4 * EPS32,
    )
    B, H, T = 2, 4, 40
    q, k = _gaussian(0, B, H, T, head_dim), _gaussian(1, B, H, T, head_dim)
    positions = torch.cat([torch.arange(20), torch.arange(1000, 1020)])  # (T,) incl. far positions
    cos, sin = rotary(q, positions[None].expand(B, T))  # (B, T, Dh), computed in float32
    q_hf, k_hf = llama_apply_rotary_pos_emb(q, k, cos, sin)  # (B, H, T, Dh)
    atol = _float32_angle_atol(q, max_angle=float(positions.max()))
    _close(
        "llama rope (float32 angles) vs apply_rope half",
        q_hf,
        P.apply_rope(q, positions, base=theta, layout="half"),
        atol,
    )
    _close(
        "llama rope (float32 angles) vs apply_rope half",
        k_hf,
        P.apply_rope(k, positions, base=theta, layout="half"),
        atol,
    )


@pytest.mark.parametrize("interpolation", [1.0, 4.0])
def test_llama_rotation_in_float64_equals_apply_rope_half(interpolation):
    Dh, T = 32, 50
    q, k = _gaussian(2, 2, 3, T, Dh), _gaussian(3, 2, 3, T, Dh)
    positions = torch.arange(3000, 3000 + T)
    cos, sin = P.rope_cos_sin(
        positions, Dh, base=500000.0, interpolation=interpolation
    )  # (T, Dh/2)
    cos, sin = (
        torch.cat([cos, cos], -1)[None],
        torch.cat([sin, sin], -1)[None],
    )  # Llama's (1, T, Dh)
    q_hf, k_hf = llama_apply_rotary_pos_emb(q, k, cos, sin)
    kw = dict(base=500000.0, layout="half", interpolation=interpolation)
    _close(
        "llama apply_rotary_pos_emb float64 vs apply_rope half",
        q_hf,
        P.apply_rope(q, positions, **kw),
        TOL64,
    )
    _close(
        "llama apply_rotary_pos_emb float64 vs apply_rope half",
        k_hf,
        P.apply_rope(k, positions, **kw),
        TOL64,
    )


# --- (b) Llama's scaled variants -----------------------------------------------------------------


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_llama_linear_scaling_is_position_interpolation(factor):
    Dh = 64
    params = {"rope_type": "linear", "rope_theta": 10000.0, "factor": factor}
    rotary = LlamaRotaryEmbedding(_llama_config(Dh, params))
    _close(
        "llama linear inv_freq * factor vs rope_frequencies, relative",
        rotary.inv_freq.double() * factor / P.rope_frequencies(Dh),
        torch.ones(Dh // 2, dtype=torch.float64),
        atol=4 * EPS32,
    )
    x = _gaussian(4, 1, 2, 64, Dh)
    positions = torch.arange(0, 64 * 50, 50)  # up to 3150
    cos, sin = rotary(x, positions[None])
    x_hf, _ = llama_apply_rotary_pos_emb(x, x, cos, sin)
    expected = P.apply_rope(x, positions, layout="half", interpolation=factor)
    atol = _float32_angle_atol(x, max_angle=float(positions.max()) / factor)
    _close("llama linear scaling vs apply_rope interpolation", x_hf, expected, atol)
    # and interpolation is dividing positions: the same as unscaled RoPE at p / factor
    _close(
        "llama linear scaling vs apply_rope at p / factor",
        x_hf,
        P.apply_rope(x, positions / factor),
        atol,
    )


@pytest.mark.parametrize(
    ("factor", "L0", "L"), [(2.0, 32, 96), (2.0, 32, 48), (4.0, 64, 512), (3.0, 100, 100)]
)
def test_llama_dynamic_ntk_base_is_ntk_scaled_base_of_the_effective_factor(factor, L0, L):
    Dh, base = 16, 10000.0
    params = {"rope_type": "dynamic", "rope_theta": base, "factor": factor}
    rotary = LlamaRotaryEmbedding(_llama_config(Dh, params, max_positions=L0))
    x = _gaussian(5, 1, 1, L, Dh)
    positions = torch.arange(L)
    cos, sin = rotary(x, positions[None])  # the forward rescales the base for L positions
    s = factor * L / L0 - (factor - 1)
    ours_base = P.ntk_scaled_base(base, s, Dh)
    if L == L0:
        assert s == 1 and ours_base == base  # nothing changes within the trained length
    if L == (2 - 1 / factor) * L0:
        assert ours_base == pytest.approx(P.ntk_scaled_base(base, factor, Dh), rel=1e-12)
    _close(
        "llama dynamic inv_freq vs rope_frequencies(ntk base), relative",
        rotary.inv_freq.double() / P.rope_frequencies(Dh, base=ours_base),
        torch.ones(Dh // 2, dtype=torch.float64),
        atol=16 * EPS32,  # the base itself is computed in float32, then raised to powers <= 1
    )
    x_hf, _ = llama_apply_rotary_pos_emb(x, x, cos, sin)
    atol = _float32_angle_atol(x, max_angle=float(L)) * 4
    _close(
        "llama dynamic NTK rope vs apply_rope(ntk base)",
        x_hf,
        P.apply_rope(x, positions, base=ours_base),
        atol,
    )


# --- (c) interleaved layouts: GPT-J and RoFormer --------------------------------------------------


def _gptj_rotate(q: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, rotary_dim: int):
    """GPTJAttention.forward's handling of rotary_dim: rotate the first rotary_dim features of each
    head with GPT-J's own apply_rotary_pos_emb, pass the rest through. q: (B, T, H, Dh)."""
    q_rot = gptj_apply_rotary_pos_emb(q[..., :rotary_dim], sin, cos)
    return torch.cat([q_rot, q[..., rotary_dim:]], dim=-1)


def _ours_partial(q: torch.Tensor, positions, rotary_dim: int):
    """apply_rope(layout="interleaved") on the first rotary_dim features; q: (B, T, H, Dh)."""
    qh = q.transpose(1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh): apply_rope wants T second to last
    rot = P.apply_rope(qh[..., :rotary_dim], positions, layout="interleaved")
    return torch.cat([rot, qh[..., rotary_dim:]], dim=-1).transpose(1, 2)  # -> (B, T, H, Dh)


@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(16, 16), (16, 8), (64, 32)])
def test_gptj_rotary_equals_apply_rope_interleaved_in_float64(head_dim, rotary_dim):
    n_pos, B, T, H = 2048, 2, 30, 4
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # GPT-J's own table function, evaluated in float64
    try:
        table = create_sinusoidal_positions(n_pos, rotary_dim)  # (n_pos, rotary_dim): [sin | cos]
    finally:
        torch.set_default_dtype(before)
    assert table.dtype == torch.float64
    positions = torch.cat([torch.arange(15), torch.arange(2000, 2015)])  # (T,)
    sin, cos = table[positions][None].chunk(2, dim=-1)  # (1, T, rotary_dim/2) each
    q = _gaussian(6, B, T, H, head_dim)  # GPT-J's (B, T, H, Dh) layout
    _close(
        "gptj rotate_every_two float64 vs apply_rope interleaved",
        _gptj_rotate(q, sin, cos, rotary_dim),
        _ours_partial(q, positions, rotary_dim),
        TOL64,
    )


def test_gptj_rotary_module_float32_table_equals_apply_rope_interleaved():
    config = transformers.GPTJConfig(n_embd=64, n_head=4, rotary_dim=8, n_positions=512)
    rotary = GPTJRotaryEmbedding(config)  # stores a float32 table
    B, T, H, Dh = 1, 40, 4, 16
    q = _gaussian(7, B, T, H, Dh)
    positions = torch.arange(472, 512)
    sin, cos = rotary(q, positions[None])  # cast to q's dtype
    atol = _float32_angle_atol(q, max_angle=511.0)
    _close(
        "gptj module (float32 table) vs apply_rope interleaved",
        _gptj_rotate(q, sin, cos, config.rotary_dim),
        _ours_partial(q, positions, config.rotary_dim),
        atol,
    )
    assert torch.equal(_gptj_rotate(q, sin, cos, 8)[..., 8:], q[..., 8:])  # the rest passes through


def test_roformer_rotation_equals_apply_rope_interleaved():
    Dh, T = 16, 64
    positions = torch.arange(T)
    cos, sin = P.rope_cos_sin(positions, Dh)  # (T, Dh/2) float64
    sinusoidal_pos = torch.cat([sin, cos], dim=-1)[
        None, None
    ]  # RoFormer's (1, 1, T, Dh): [sin | cos]
    q, k = _gaussian(8, 2, 3, T, Dh), _gaussian(9, 2, 3, T, Dh)
    q_hf, k_hf = RoFormerSelfAttention.apply_rotary_position_embeddings(sinusoidal_pos, q, k)
    _close(
        "roformer rotation float64 vs apply_rope interleaved",
        q_hf,
        P.apply_rope(q, positions, layout="interleaved"),
        TOL64,
    )
    _close(
        "roformer rotation float64 vs apply_rope interleaved",
        k_hf,
        P.apply_rope(k, positions, layout="interleaved"),
        TOL64,
    )
    # RoFormer's own table (float32 numbers): sin of every angle in the first half, cos in the second
    table = RoFormerSinusoidalPositionalEmbedding(T, Dh).create_weight().double()  # (T, Dh)
    _close(
        "roformer sinusoid table (float32) vs rope_cos_sin",
        table,
        torch.cat([sin, cos], dim=-1),
        1e-6,
    )


# --- (d) BLOOM's ALiBi -------------------------------------------------------------------------


@pytest.mark.parametrize("H", range(1, 65))
def test_bloom_alibi_slopes_equal_alibi_slopes(H):
    bloom = _get_alibi_slopes(H, torch.device("cpu")).double()  # float32 numbers
    ours = P.alibi_slopes(H)
    if H <= 8:  # the ratios 2^-8, 2^-4, 2^-2, 2^-1 (and 2^-1 for the extras) are exact in float32
        assert torch.equal(bloom, ours)
    n = 2 ** int(math.log2(H))
    extra_powers = torch.arange(1, 2 * (H - n), 2) if H > n else torch.arange(0)  # 1, 3, 5, ...
    k = torch.cat([torch.arange(1, n + 1), extra_powers]).double()  # the power of each slope
    relative = ((bloom - ours) / ours).abs()
    assert torch.isfinite(relative).all() and (relative <= (k + 1) * EPS32).all(), relative.max()
    MEASURED["bloom slopes vs alibi_slopes, relative"] = max(
        relative.max().item(), MEASURED.get("bloom slopes vs alibi_slopes, relative", 0.0)
    )


@pytest.mark.parametrize("H", [1, 6, 8, 12, 16, 40])
def test_bloom_alibi_tensor_gives_the_same_causal_softmax(H):
    T = 17
    bloom = build_alibi_tensor(torch.ones(1, T), H, torch.float64)  # (B*H, 1, T): m_h * j
    bloom_slopes = _get_alibi_slopes(H, torch.device("cpu")).double()
    pos = torch.arange(T)
    ours_same_slopes = P.alibi_bias(bloom_slopes, pos, pos)  # (H, T, T): -m_h (i - j)
    difference = ours_same_slopes - bloom  # (H, T, T) - (H, 1, T)
    # BLOOM multiplies m_h * j in float32 before the cast: constant up to that one rounding
    atol = bloom.abs().max().item() * EPS32
    _close(
        "alibi_bias - bloom tensor: constant along keys",
        difference,
        difference[..., :1].expand_as(difference),
        atol,
    )
    _close(
        "alibi_bias - bloom tensor: the constant is -m_h i",
        difference[..., 0],
        -bloom_slopes[:, None] * pos,
        atol,
    )

    scores = _gaussian(10, H, T, T) * 3
    keep = torch.ones(T, T, dtype=torch.bool).tril()  # causal

    def weights(bias):
        return torch.softmax((scores + bias).masked_fill(~keep, float("-inf")), dim=-1)

    # weights move by at most about twice the largest bias error (float32 rounding of m_h j)
    _close(
        "causal softmax: alibi_bias (bloom slopes) vs bloom",
        weights(ours_same_slopes),
        weights(bloom),
        2 * atol,
    )
    ours = P.alibi_bias(P.alibi_slopes(H), pos, pos)
    _close("causal softmax: alibi_bias (our slopes) vs bloom", weights(ours), weights(bloom), 1e-5)
    # the bias does matter (> 1e-3 even for H = 1, whose one slope is 1/256)
    assert (weights(ours) - weights(torch.zeros(()))).abs().max() > 1e-3


# --- Llama's whole attention layer: RoPE in place, and the porting permutation ------------------


def test_llama_attention_layer_equals_our_attention_with_rope_and_the_porting_permutation():
    """LlamaAttention (random weights, float64, eager) against selfattn's pieces: project, split
    heads, apply_rope(layout="half") on Q and K, causal attention, merge, project. Then the porting
    story: the same layer written for interleaved RoPE (Meta's original layout) needs each head's
    W_Q / W_K columns in the inverse permutation; with them it gives Llama's output, without them not.
    Llama's eager softmax runs in float32 (``softmax(..., dtype=torch.float32)``): tolerance 1e-6 on
    outputs of order 1. cos/sin are given in float64 (Llama's layout) so the angles are exact."""
    from selfattn import causal_mask, merge_heads, scaled_dot_product_attention, split_heads

    H, Dh, T, B = 4, 16, 20, 2
    config = _llama_config(Dh, {"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer = (
        transformers.models.llama.modeling_llama.LlamaAttention(config, layer_idx=0).double().eval()
    )
    X = _gaussian(11, B, T, H * Dh)
    positions = torch.arange(T) + 100
    cos, sin = P.rope_cos_sin(positions, Dh)
    cos, sin = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]  # (1, T, Dh)
    additive_causal = torch.zeros(T, T, dtype=torch.float64).masked_fill(
        ~causal_mask(T), float("-inf")
    )
    with torch.no_grad():
        expected, _ = layer(
            X, position_embeddings=(cos, sin), attention_mask=additive_causal[None, None]
        )
    W_Q, W_K = layer.q_proj.weight.T.detach(), layer.k_proj.weight.T.detach()  # (D, D), X @ W
    W_V, W_O = layer.v_proj.weight.T.detach(), layer.o_proj.weight.T.detach()

    def ours(W_q, W_k, layout):
        Q = P.apply_rope(split_heads(X @ W_q, H), positions, layout=layout)  # (B, H, T, Dh)
        K = P.apply_rope(split_heads(X @ W_k, H), positions, layout=layout)
        context = scaled_dot_product_attention(Q, K, split_heads(X @ W_V, H), causal_mask(T))
        return merge_heads(context) @ W_O  # (B, H, T, Dh) -> (B, T, D) @ (D, D)

    _close(
        "llama attention layer vs selfattn + apply_rope half",
        ours(W_Q, W_K, "half"),
        expected,
        1e-6,
    )
    inverse = torch.argsort(P.rope_interleaved_to_half(Dh))  # half -> interleaved, per head

    def per_head(W, perm):
        return torch.cat([W[:, h * Dh : (h + 1) * Dh][:, perm] for h in range(H)], dim=1)

    original = ours(per_head(W_Q, inverse), per_head(W_K, inverse), "interleaved")
    _close(
        "llama attention vs interleaved rope with un-permuted W_Q, W_K", original, expected, 1e-6
    )
    unported = ours(W_Q, W_K, "interleaved")  # the porting bug, the other way round
    relative = ((unported - expected).norm() / expected.norm()).item()
    MEASURED["llama attention: interleaved without permutation, relative"] = relative
    assert relative > 0.05, relative
