"""selfattn.circuits on models whose answers are known by hand: logit attribution through a final norm
(exact parts, the norm's scale and centring, signs), the restored fraction and its two ends, causal
structure of patching, the copying score of identity / negated / rotating circuits, refusals."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from selfattn import circuits
from selfattn.encoder import Encoder, EncoderConfig
from selfattn.experiments.induction import AttentionOnly, InductionConfig
from selfattn.experiments.induction import composition_scores as induction_composition
from selfattn.models.gpt import GPT, GPTConfig

SMALL = InductionConfig(vocab_size=16, seq_len=20, span=5, d_model=16, n_heads=2, steps=1, batch_size=4)


def _attn_only(final_norm: bool, seed: int = 0) -> AttentionOnly:
    torch.manual_seed(seed)
    model = AttentionOnly(InductionConfig(**{**SMALL.__dict__, "final_norm": final_norm})).eval()
    if final_norm:  # a norm that is not the identity: weight and bias away from 1 and 0
        with torch.no_grad():
            model.ln_f.weight.uniform_(0.5, 1.5)
            model.ln_f.bias.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_gpt_attribution_parts_sum_to_the_logit_in_float64(positions):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=16, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                          positions=positions)).double().eval()
    ids = torch.randint(20, (2, 10), generator=torch.Generator().manual_seed(1))
    for row, pos, tok in ((0, -1, 3), (1, 4, 17)):
        a = circuits.logit_attribution(model, ids, tok, position=pos, row=row)
        assert abs(float(a.parts.sum()) - float(model(ids).detach()[row, pos, tok])) < 1e-10
        assert a.labels[:3] == ("embed", "L0H0", "L0H1") and "L1 MLP" in a.labels and a.labels[-1] == "biases"
        assert a.heads.shape == (2, 2)


def test_attribution_parts_are_the_hand_computed_terms_through_the_norm():
    """Attention switched off (W_O = 0, b_O = 0): the stream is the embedding e alone, and
    logit = ((e - mean e) / s * w + b) . W_U[:, u] + b_U[u] with s = sqrt(mean((e - mean e)^2) + eps)."""
    for final_norm in (False, True):
        model = _attn_only(final_norm)
        with torch.no_grad():
            for layer in model.layers:
                layer.W_O.zero_()
                layer.b_O.zero_()
        ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
        u = 7
        e = model.token_embedding.weight[6].double()  # the last token, 6
        W_U, b_U = model.unembed.weight[u].double(), float(model.unembed.bias[u])
        if final_norm:
            w, b = model.ln_f.weight.double(), model.ln_f.bias.double()
            s = math.sqrt(float(((e - e.mean()) ** 2).mean()) + model.ln_f.eps)  # biased variance, as LayerNorm
            embed, biases = float(((e - e.mean()) / s * w) @ W_U), float(b @ W_U) + b_U
        else:
            s, embed, biases = 1.0, float(e @ W_U), b_U
        a = circuits.logit_attribution(model, ids, u)
        assert abs(a.part("embed") - embed) < 1e-5 and abs(a.part("biases") - biases) < 1e-5
        assert abs(a.scale - s) < 1e-5
        assert float(a.heads.abs().max()) == 0.0
        assert abs(float(a.parts.sum()) - float(model(ids)[0, -1, u])) < 1e-5
        # the sign: the embedding part is + its projection (a flipped convention gives -embed)
        assert abs(embed) > 0.05


def test_attribution_heads_are_the_heads_writes_and_sum_to_the_logit():
    model = _attn_only(True)
    ids = torch.randint(16, (3, 12), generator=torch.Generator().manual_seed(2))
    u, row, pos = 5, 2, 9
    a = circuits.logit_attribution(model, ids, u, position=pos, row=row)
    assert abs(float(a.parts.sum()) - float(model(ids)[row, pos, u])) < 1e-5
    # rebuilt: each head's write z^h W_O^h, centred, over the frozen scale, times w, on W_U[:, u]
    with torch.no_grad():
        x = model.embed(ids)
        H, Dh = 2, 8
        expected = torch.zeros(2, H)
        streams = [x]
        for layer in range(2):
            z, _ = model.head_contexts(layer, x)
            W_O = model.layers[layer].W_O.view(H, Dh, -1)
            for h in range(H):
                write = (z[row, h, pos] @ W_O[h]).double()
                expected[layer, h] = float((write - write.mean()) @ (model.unembed.weight[u].double()
                                                                     * model.ln_f.weight.double()))
            x = x + model.write(layer, z)
            streams.append(x)
        final = streams[-1][row, pos].double()
        s = torch.sqrt(((final - final.mean()) ** 2).mean() + model.ln_f.eps)
    torch.testing.assert_close(a.heads, expected.double() / s, atol=1e-5, rtol=0)
    # A split that forgets the scale (s = 1) or the centring does not sum to the logit
    parts_no_scale = a.parts[:-1] * s
    assert abs(float(parts_no_scale.sum() + a.parts[-1]) - a.logit) > 1e-2


def test_restored_fraction_ends_and_sign():
    assert circuits.restored_fraction(5.0, 5.0, -1.0) == 1.0
    assert circuits.restored_fraction(-1.0, 5.0, -1.0) == 0.0
    assert circuits.restored_fraction(2.0, 5.0, -1.0) == 0.5
    assert circuits.restored_fraction(-4.0, 5.0, -1.0) < 0  # moved away from clean: negative
    with pytest.raises(ValueError, match="no difference"):
        circuits.restored_fraction(1.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="finite"):
        circuits.restored_fraction(float("nan"), 2.0, 1.0)


def test_patching_whole_stream_restores_one_nothing_zero_and_the_past_is_untouched():
    model = _attn_only(True)
    clean = torch.randint(16, (4, 12), generator=torch.Generator().manual_seed(3))
    corrupt = clean.clone()
    corrupt[:, 6] = (clean[:, 6] + 1) % 16

    def metric(logits):
        return float(logits[:, -1, 0].mean() - logits[:, -1, 1].mean())

    whole = circuits.patch_residual(model, clean, corrupt, metric, positions="all")
    np.testing.assert_allclose(whole.numpy(), 1.0, atol=1e-5)
    assert float(circuits.patch_heads(model, clean, corrupt, metric, heads=[])) == 0.0
    all_heads = circuits.patch_heads(model, clean, corrupt, metric, heads=[(0, 0), (0, 1), (1, 0), (1, 1)])
    assert abs(float(all_heads) - 1.0) < 1e-5  # every head's output clean: the stream is clean again
    grid = circuits.patch_residual(model, clean, corrupt, metric)
    assert grid.shape == (3, 12)
    assert abs(float(grid[0, 6]) - 1.0) < 1e-5  # the only position that differs at the input
    assert float(grid[:, :6].abs().max()) < 1e-6  # causal: positions before the change are the same in both runs
    assert abs(float(grid[2, 11]) - 1.0) < 1e-5 and float(grid[2, :11].abs().max()) < 1e-6  # the metric reads pos 11
    # swapping the roles gives the mirror: corrupt -> clean patching of everything also restores 1
    back = circuits.patch_residual(model, corrupt, clean, metric, positions="all")
    np.testing.assert_allclose(back.numpy(), 1.0, atol=1e-5)


def test_encoder_patching_whole_stream_restores_one():
    torch.manual_seed(0)
    encoder = Encoder(EncoderConfig(vocab_size=50, d_model=12, n_layers=2, n_heads=3, d_ff=20)).eval()
    clean = torch.randint(50, (1, 7), generator=torch.Generator().manual_seed(4))
    corrupt = clean.clone()
    corrupt[0, 3] = (clean[0, 3] + 1) % 50

    def metric(hidden):
        return float(hidden[0].mean(0)[0])  # one coordinate (a post-norm output sums to about 0)

    whole = circuits.patch_residual(encoder, clean, corrupt, metric, positions="all")
    np.testing.assert_allclose(whole.numpy(), 1.0, atol=1e-5)
    grid = circuits.patch_residual(encoder, clean, corrupt, metric)
    assert abs(float(grid[0, 3]) - 1.0) < 1e-5 and float(grid[0, [0, 1, 2, 4, 5, 6]].abs().max()) < 1e-6
    assert circuits.patch_heads(encoder, clean, corrupt, metric).shape == (2, 3)


def _identity_ov_model(sign: float) -> AttentionOnly:
    """V = D = 16, W_E = W_U = I, no final norm; head 0 of layer 1 has W_V^0 = [I_8; 0] and
    W_O^0 = sign * [I_8, 0]: its OV circuit is sign * (the projection onto the first 8 tokens)."""
    model = _attn_only(False)
    with torch.no_grad():
        model.token_embedding.weight.copy_(torch.eye(16))
        model.unembed.weight.copy_(torch.eye(16))
        attn = model.layers[1]
        attn.W_V.zero_()
        attn.W_O.zero_()
        attn.W_V[:8, :8] = torch.eye(8)
        attn.W_O[:8, :8] = sign * torch.eye(8)
    return model


def test_copying_score_of_identity_negated_and_rotating_circuits():
    assert circuits.copying_score(torch.eye(5)) == pytest.approx(1.0, abs=1e-12)
    assert circuits.copying_score(-torch.eye(5)) == pytest.approx(-1.0, abs=1e-12)
    rotation = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +i, -i
    assert abs(circuits.copying_score(rotation)) < 1e-12
    assert circuits.copying_score(torch.diag(torch.tensor([3.0, -1.0]))) == pytest.approx(0.5, abs=1e-12)
    # a head whose OV circuit is the identity (on its 8 tokens) copies: score 1; negated: -1
    ov = circuits.ov_circuit(_identity_ov_model(1.0), 1, 0)
    expected = torch.zeros(16, 16, dtype=torch.float64)
    expected[:8, :8] = torch.eye(8)
    torch.testing.assert_close(ov, expected)
    assert circuits.copying_score(ov) == pytest.approx(1.0, abs=1e-9)
    assert circuits.copying_score(circuits.ov_circuit(_identity_ov_model(-1.0), 1, 0)) == pytest.approx(-1.0, abs=1e-9)


def test_qk_circuit_without_rope_is_the_product_and_composition_is_chapter_14s():
    model = _attn_only(False)
    model = copy.deepcopy(model)
    object.__setattr__(model.config, "rope_layers", 0)  # a layer without RoPE: R is the identity
    hw = model.layers[0].head_weights(1)
    W_E = model.token_embedding.weight
    torch.testing.assert_close(circuits.qk_circuit(model, 0, 1), (W_E @ hw.W_Q @ hw.W_K.T @ W_E.T).double(),
                               atol=1e-5, rtol=1e-5)
    model2 = _attn_only(False)
    for k, v in circuits.composition_scores(model2).items():
        torch.testing.assert_close(v, induction_composition(model2)[k])


def test_refusals():
    model = _attn_only(True)
    ids = torch.randint(16, (2, 8))
    with pytest.raises(ValueError, match="token"):
        circuits.logit_attribution(model, ids, 16)
    with pytest.raises(ValueError, match="position"):
        circuits.logit_attribution(model, ids, 1, position=8)
    with pytest.raises(ValueError, match="same shape"):
        circuits.patch_residual(model, ids, ids[:, :5], lambda x: 0.0)
    with pytest.raises(ValueError, match="no difference"):
        circuits.patch_residual(model, ids, ids.clone(), lambda x: float(x[0, -1, 0]))
    with pytest.raises(ValueError, match="square"):
        circuits.copying_score(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="zero matrix"):
        circuits.copying_score(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="layer"):
        circuits.ov_circuit(model, 2, 0)
    with pytest.raises(TypeError, match="AttentionOnly"):
        circuits.ov_circuit(torch.nn.Linear(2, 2), 0, 0)


def test_patch_heads_at_chosen_positions_leaves_the_changed_position_corrupted():
    # one layer-0 head patched everywhere but the changed position: its output there stays corrupted,
    # so a metric read at that position alone gets nothing from the patch in layer 0
    model = _attn_only(True)
    clean = torch.randint(16, (4, 12), generator=torch.Generator().manual_seed(3))
    corrupt = clean.clone()
    corrupt[:, 11] = (clean[:, 11] + 1) % 16

    def metric(logits):
        return float(logits[:, -1, 0].mean() - logits[:, -1, 1].mean())

    everywhere = circuits.patch_heads(model, clean, corrupt, metric)
    others = circuits.patch_heads(model, clean, corrupt, metric, positions=list(range(11)))
    only = circuits.patch_heads(model, clean, corrupt, metric, positions=[11])
    assert others.shape == (2, 2) and np.isfinite(others.numpy()).all()
    # positions before the change are equal in both runs: patching them restores nothing
    assert float(others.abs().max()) < 1e-6
    np.testing.assert_allclose(only.numpy(), everywhere.numpy(), atol=1e-6)
    assert float(everywhere.abs().max()) > 1e-3  # and patching the changed position does restore something
    # with the change at 6, all heads patched at 6 .. 11 clean the stream the metric reads at 11 (as everywhere)
    corrupt6 = clean.clone()
    corrupt6[:, 6] = (clean[:, 6] + 1) % 16
    together = circuits.patch_heads(model, clean, corrupt6, metric, heads=[(0, 0), (0, 1), (1, 0), (1, 1)],
                                    positions=list(range(6, 12)))
    assert abs(float(together) - 1.0) < 1e-5
    for bad in ([], [12], [3, 3], "all"):
        with pytest.raises(ValueError, match="positions"):
            circuits.patch_heads(model, clean, corrupt, metric, positions=bad)
