"""Chapter 13's claim 19 on the real model: a high attention weight is not proof of causal
importance. Numbers measured on the chapter's sentence (CPU, float32) and asserted with margins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfattn import interpret
from selfattn.viz.interpret import edge_measures_figure, key_scatter_figure

SENTENCE = "The bank raised interest rates, and the markets fell."
REFERENCE = "Stocks dropped after the central bank's decision."


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is fastest on a shared CPU
    yield
    torch.set_num_threads(before)


def _measure(minilm):
    encoder = minilm.encoder()
    batch = minilm.tokenize(SENTENCE)
    reference = minilm.sentence_embedding(REFERENCE)[0]
    tokens = batch.tokens[0]
    A = interpret.edge_attributions(encoder, batch.input_ids, reference, tokens)
    keys = np.stack(
        [interpret.ablate_keys(encoder, batch.input_ids, reference, layer) for layer in range(6)]
    )
    edges = np.stack(
        [interpret.ablate_edges(encoder, batch.input_ids, reference, 5, h) for h in (0, 9)]
    )
    return tokens, A, keys, edges


@pytest.fixture(scope="module")
def measured(minilm, one_thread):
    return _measure(minilm)


def test_claim_19_high_weight_is_not_causal_importance(measured):
    tokens, A, keys, _ = measured
    received = A.weights.sum(axis=2)  # (L, H, T)
    effect = np.abs(keys)
    assert np.isfinite(effect).all()
    top_weight = np.unravel_index(np.argmax(received), received.shape)
    top_effect = np.unravel_index(np.argmax(effect), effect.shape)
    # The most attended (head, key) pair: layer 1, head 11 -> [CLS] (counted from 0), 88 % of the head's weight.
    assert tuple(int(i) for i in top_weight) == (1, 11, 0) and tokens[0] == "[CLS]"
    assert received[top_weight] / len(tokens) > 0.8
    # Measured: |effect| 0.0008, rank 221 of 936; the largest effect (layer 5, head 9 -> "fell")
    # is 0.095, 113 times larger.
    rank = int((effect > effect[top_weight]).sum()) + 1
    assert rank > 100, rank
    assert effect[top_effect] / effect[top_weight] > 50
    assert tuple(int(i) for i in top_effect) == (5, 9, 10) and tokens[10] == "fell"
    assert received[top_effect] < received[top_weight]


def test_claim_19_weights_norms_and_gradients_disagree_as_stated(measured):
    tokens, A, keys, edges = measured
    weight_share = A.weights.sum(axis=(0, 1, 2)) / A.weights.sum()
    norm_share = A.norms.sum(axis=(0, 1, 2)) / A.norms.sum()
    assert weight_share[0] == pytest.approx(0.473, abs=0.02)  # [CLS]
    assert norm_share[0] == pytest.approx(0.050, abs=0.01)
    rho_norm = interpret.per_head_spearman(A.weights, A.norms)
    rho_grad = interpret.per_head_spearman(A.weights, np.abs(A.grad_x_weight))
    assert rho_norm.mean() == pytest.approx(0.85, abs=0.05)
    assert rho_grad.mean() == pytest.approx(0.60, abs=0.05)
    effect = np.abs(keys)
    assert interpret.spearman(effect, A.weights.sum(axis=2)) == pytest.approx(0.55, abs=0.05)
    assert interpret.spearman(effect, np.abs(A.grad_x_weight.sum(axis=2))) == pytest.approx(
        0.68, abs=0.05
    )
    # Layer 5 (the last): head 0 is where weight and edge ablation agree least (0.26), head 9 one of the best.
    rho_edges = interpret.per_head_spearman(A.weights[5, [0, 9]][None], np.abs(edges)[None])[0]
    assert rho_edges[0] == pytest.approx(0.26, abs=0.08)
    assert rho_edges[1] == pytest.approx(0.89, abs=0.05)
    # The strongest edge of 11 of the 12 last-layer heads points at [CLS]; in head 0 it is not the
    # edge whose ablation matters most (rank 4), in head 9 (fell -> fell) it is.
    T = len(tokens)
    strongest = [int(np.argmax(A.weights[5, h])) % T for h in range(12)]
    assert sum(j == 0 for j in strongest) >= 10
    for k, agrees in ((0, False), (1, True)):
        h = (0, 9)[k]
        same = np.argmax(A.weights[5, h]) == np.argmax(np.abs(edges[k]))
        assert same == agrees, h


def test_claim_19_numbers_and_figures_are_reproducible(minilm, measured, one_thread):
    tokens, A, keys, edges = measured
    tokens2, A2, keys2, edges2 = _measure(minilm)
    assert tokens2 == tokens
    for name in ("weights", "norms", "grad_x_weight", "token_grad_x_input"):
        np.testing.assert_allclose(
            getattr(A2, name), getattr(A, name), rtol=0, atol=1e-6, err_msg=name
        )
    np.testing.assert_allclose(keys2, keys, rtol=0, atol=1e-6)
    np.testing.assert_allclose(edges2, edges, rtol=0, atol=1e-6)

    def figures(A, keys, edges):
        measures = {
            "weight": A.weights[5, [0, 9]],
            "moved norm": A.norms[5, [0, 9]],
            "|ablation effect|": edges,
        }
        special = np.tile(np.array([t in ("[CLS]", "[SEP]", ",", ".") for t in tokens]), 72)
        received = A.weights.sum(axis=2).ravel()
        return (
            edge_measures_figure(tokens, measures, ["L5 H0", "L5 H9"]),
            key_scatter_figure(
                received, {"|effect|": np.abs(keys).ravel()}, [""] * received.size, special
            ),
        )

    for fig1, fig2 in zip(figures(A, keys, edges), figures(A2, keys2, edges2), strict=True):
        for t1, t2 in zip(fig1.data, fig2.data, strict=True):
            for attr in ("x", "y", "z"):
                if getattr(t1, attr, None) is not None:
                    a = np.asarray(getattr(t1, attr), dtype=object)
                    b = np.asarray(getattr(t2, attr), dtype=object)
                    if a.dtype == object and isinstance(a.flat[0], str):
                        assert a.tolist() == b.tolist()
                    else:
                        np.testing.assert_allclose(
                            np.asarray(b, float), np.asarray(a, float), atol=1e-3
                        )
        assert len(fig1.to_json()) < 300_000


# The twelve sentences of chapter 13's last section (this chapter's, the bank sentences of chapters
# 01-02 and four unrelated ones), each against the same reference.
SENTENCES = [
    SENTENCE,
    "Yesterday the central bank raised interest rates.",
    "She deposited the money at the bank on Monday.",
    "Thieves robbed the bank and took the cash.",
    "I opened a bank account.",
    "She sat on the river bank and watched the boats.",
    "The muddy river bank flooded after the storm.",
    "The steep grassy bank ran down to the water.",
    "The bat flew out of the cave at dusk.",
    "He swung the bat and hit the ball.",
    "The cat sat quietly on the warm mat.",
    "Attention lets every token read every other token.",
]


def test_claim_19_rank_correlations_hold_across_sentences_under_zero_and_mean_ablation(minilm, one_thread):
    encoder = minilm.encoder()
    reference = minilm.sentence_embedding(REFERENCE)[0]
    ids = [minilm.tokenize(s).input_ids for s in SENTENCES]
    means = interpret.dataset_means(encoder, ids)
    assert means.n_tokens == 135
    # keys (the costly level) on the second sentence here (the first one's zero ablation is asserted
    # above), on three in the chapter; heads and tokens on all twelve
    rho = [interpret.importance_correlations(encoder, x, reference, means, keys=n == 1) for n, x in enumerate(ids)]
    assert all(np.isfinite(list(r.values())).all() for r in rho)

    def values(key):
        return np.array([r[key] for r in rho if key in r])

    # Keys: the weight predicts the effect moderately under both ablations (measured 0.64 / 0.62 on
    # the second sentence), gradient x weight better; the two ablations rank keys alike (0.81).
    for ablation in ("zero", "mean"):
        weight, grad = values(("keys", ablation, "weight")), values(("keys", ablation, "gradient x weight"))
        assert len(weight) == 1 and np.all((0.45 < weight) & (weight < 0.75)), weight
        assert np.all(grad > weight), (grad, weight)
    assert np.all(np.abs(values(("keys", "zero", "weight")) - values(("keys", "mean", "weight"))) < 0.1)
    assert np.all(values(("keys", "zero vs mean", "")) > 0.7)
    # Heads: resting on [CLS] goes with a small effect in every sentence under zero ablation (highest
    # -0.15), on average under mean ablation (mean -0.27, highest -0.06); the two ablations agree on
    # heads (0.47 on average) much less than on keys.
    assert values(("heads", "zero", "[CLS] share")).max() < -0.05
    assert values(("heads", "mean", "[CLS] share")).mean() < -0.15
    assert values(("heads", "mean", "[CLS] share")).max() < 0.1
    assert values(("heads", "zero vs mean", "")).mean() < values(("keys", "zero vs mean", "")).mean() - 0.2
    # Tokens: rollout ranks them worse than the last layer's raw weights under both ablations (means
    # -0.07 / -0.06 against 0.46 / 0.57), over twelve sentences.
    for ablation in ("zero", "mean"):
        raw, roll = values(("tokens", ablation, "raw attention")), values(("tokens", ablation, "rollout"))
        assert len(raw) == len(roll) == 12
        assert raw.mean() > roll.mean() + 0.3, (raw.mean(), roll.mean())
    # On the chapter's sentence rollout gives [CLS] more of the output than either ablation finds there.
    A = interpret.edge_attributions(encoder, ids[0], reference, [""] * ids[0].shape[1])
    rollout = interpret.attention_rollout(A.weights).mean(axis=0)
    zero = np.abs(interpret.ablate_tokens(encoder, ids[0], reference))
    mean = np.abs(interpret.ablate_tokens(encoder, ids[0], reference, means))
    assert rollout[0] / rollout.sum() > 0.5 > max(zero[0] / zero.sum(), mean[0] / mean.sum())
