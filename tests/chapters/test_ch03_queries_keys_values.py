"""Claims of chapter 03 (Queries, keys and values), computed with the package, not by running the notebook."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import selfattn
from selfattn import ref
from selfattn.experiments.tying import RecallConfig, RecallModel, TiedRecallModel, train_recall


@pytest.fixture(scope="module")
def head():
    return selfattn.SelfAttention(selfattn.AttentionConfig(d_model=16, d_head=4),
                                  generator=torch.Generator().manual_seed(3)).double()


@pytest.fixture(scope="module")
def X():
    return torch.randn(5, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)  # (T, D)


def test_claim_03_q_k_v_are_three_learned_projections_of_the_same_x(head, X):
    Q, K, V = head.project(X)
    x, wq, wk, wv = (t.detach().numpy() for t in (X, head.W_Q, head.W_K, head.W_V))
    for got, W in ((Q, wq), (K, wk), (V, wv)):
        assert W.shape == (16, 4)
        np.testing.assert_allclose(got.detach().numpy(), x @ W, rtol=1e-12, atol=1e-12)
    assert not np.allclose(wq, wk) and not np.allclose(wk, wv)  # three different matrices
    # all three are learned: a loss on the output sends a gradient to each
    head.zero_grad()
    head(X).pow(2).sum().backward()
    for name in ("W_Q", "W_K", "W_V"):
        grad = getattr(head, name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def test_claim_03_real_model_heads_are_three_projections_of_one_x():
    from selfattn.pretrained import load_minilm

    minilm = load_minilm()
    run = minilm.run("The bank of the river was muddy after the rain.")
    X0 = run.hidden_states[0][0]  # (T, D): the input to layer 0
    sd = minilm.state_dict
    Dh = minilm.config.d_head
    for h in range(minilm.config.n_heads):
        rows = slice(h * Dh, (h + 1) * Dh)
        Q, K, V = (X0 @ sd[f"encoder.layer.0.attention.self.{n}.weight"][rows].T + sd[f"encoder.layer.0.attention.self.{n}.bias"][rows]
                   for n in ("query", "key", "value"))  # (T, D) @ (D, Dh) -> (T, Dh)
        weights = ref.softmax((Q @ K.T).double().numpy() / math.sqrt(Dh))
        np.testing.assert_allclose(weights, run.weights[0][0, h].double().numpy(), rtol=1e-4, atol=1e-5)


def test_claim_04_score_matrix_holds_every_query_key_dot_product(head, X):
    Q, K, _ = (t.detach().numpy() for t in head.project(X))
    T, S = Q.shape[0], K.shape[0]
    loop = np.empty((T, S))
    for i in range(T):
        for j in range(S):
            loop[i, j] = sum(Q[i, d] * K[j, d] for d in range(Q.shape[1]))
    np.testing.assert_allclose(Q @ K.T, loop, rtol=1e-12, atol=1e-12)
    _, weights = head(X, return_weights=True)
    np.testing.assert_allclose(weights.detach().numpy(), ref.softmax(loop / math.sqrt(Q.shape[1])), rtol=1e-12, atol=1e-14)


def test_claim_07_each_output_row_is_a_weighted_sum_of_value_rows(head, X):
    _, _, V = head.project(X)
    context, weights = head(X, return_weights=True)
    context, weights, V = (t.detach().numpy() for t in (context, weights, V))
    for i in range(context.shape[0]):
        mix = sum(weights[i, j] * V[j] for j in range(V.shape[0]))
        np.testing.assert_allclose(context[i], mix, rtol=1e-12, atol=1e-12)
    assert (context >= V.min(axis=0) - 1e-12).all() and (context <= V.max(axis=0) + 1e-12).all()  # convex hull box
    np.testing.assert_allclose(context, ref.scaled_dot_product_attention(*(t.detach().numpy() for t in head.project(X))),
                               rtol=1e-12, atol=1e-12)


def test_claim_08_keys_decide_where_values_decide_what(head, X):
    context, weights = head(X, return_weights=True)
    other = selfattn.SelfAttention(head.config).double()
    with torch.no_grad():
        other.W_Q.copy_(head.W_Q)
        other.W_K.copy_(head.W_K)
        other.W_V.copy_(torch.randn(16, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64))
    context_v, weights_v = other(X, return_weights=True)
    torch.testing.assert_close(weights_v, weights, rtol=0, atol=0)  # new values: the same reading pattern
    assert (context_v - context).abs().max() > 0.1  # ... but other content is read
    with torch.no_grad():
        other.W_V.copy_(head.W_V)
        other.W_K.copy_(head.W_K.flip(0))
    _, weights_k = other(X, return_weights=True)
    assert (weights_k - weights).abs().max() > 0.05  # new keys: a different reading pattern


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_claim_08_tying_values_to_keys_costs_recall_accuracy(seed):
    config = RecallConfig()  # d_head = 4 for D = 32: a narrow head
    untied = train_recall(RecallModel, config, seed)
    tied = train_recall(TiedRecallModel, config, seed)
    assert np.isfinite([untied.loss, tied.loss]).all()
    assert untied.accuracy >= 0.95, untied
    assert tied.accuracy < 0.5 and untied.accuracy - tied.accuracy >= 0.4, (untied.accuracy, tied.accuracy)
    assert tied.loss > untied.loss + 1.0  # nats of cross-entropy


def test_claim_04_scores_depend_only_on_the_qk_circuit_and_output_on_the_ov_circuit(head, X):
    g = torch.Generator().manual_seed(11)
    d_model, d_head = head.config.d_model, head.config.d_head
    A, B = (torch.randn(d_head, d_head, generator=g, dtype=torch.float64) for _ in range(2))
    assert max(torch.linalg.cond(A), torch.linalg.cond(B)) < 1e4  # safely invertible
    W_O = torch.randn(d_head, d_model, generator=g, dtype=torch.float64)
    other = selfattn.SelfAttention(head.config).double()
    with torch.no_grad():
        other.W_Q.copy_(head.W_Q @ A)
        other.W_K.copy_(head.W_K @ torch.linalg.inv(A).T)
        other.W_V.copy_(head.W_V @ B)
        Q, K, _ = head.project(X)
        Q2, K2, _ = other.project(X)
        context, weights = head(X, return_weights=True)
        context2, weights2 = other(X, return_weights=True)
    assert (Q2 - Q).abs().max() > 0.1 and (K2 - K).abs().max() > 0.1  # other queries and keys ...
    torch.testing.assert_close(Q2 @ K2.T, Q @ K.T, rtol=0, atol=1e-10)  # ... the same scores
    torch.testing.assert_close(weights2, weights, rtol=0, atol=1e-12)
    assert (context2 - context).abs().max() > 0.1  # other values ...
    torch.testing.assert_close(context2 @ (torch.linalg.inv(B) @ W_O), context @ W_O, rtol=0, atol=1e-10)  # ... same output
    # the scores are the bilinear form x_i W_QK x_j of the product, whose rank is d_head
    W_QK = (head.W_Q @ head.W_K.T).detach()  # (D, Dh) @ (Dh, D) -> (D, D)
    torch.testing.assert_close(X @ W_QK @ X.T, Q @ K.T, rtol=0, atol=1e-10)
    assert int(torch.linalg.matrix_rank(W_QK)) == d_head < d_model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_claim_08_untied_beats_tied_at_equal_parameters(seed):
    untied = train_recall(RecallModel, RecallConfig(d_head=4), seed)
    tied = train_recall(TiedRecallModel, RecallConfig(d_head=6), seed)  # W_Q, W_K: 2 * 32 * 6 = 384 numbers
    n_untied = sum(getattr(untied.model.attn, n).numel() for n in ("W_Q", "W_K", "W_V"))
    n_tied = sum(getattr(tied.model.attn, n).numel() for n in ("W_Q", "W_K"))
    assert n_untied == n_tied == 384
    assert not tied.model.attn.W_V.requires_grad  # the tied model never trains (or uses) W_V
    assert np.isfinite([untied.loss, tied.loss]).all()
    # measured over seeds 0-4: untied 1.00, tied 0.74-0.90 (gap 0.10-0.26)
    assert untied.accuracy >= 0.95 and untied.accuracy - tied.accuracy > 0.1, (untied.accuracy, tied.accuracy)
    assert tied.accuracy > 0.5  # far better than the narrow tied head (about 0.3): width was most of its cost


def test_claim_08_trained_keys_read_key_features_and_values_value_features():
    config = RecallConfig()
    untied = train_recall(RecallModel, config, seed=0)
    tied = train_recall(TiedRecallModel, RecallConfig(d_head=6), seed=0)

    def key_share(W):  # fraction of the squared weight on the n_keys key rows of the input
        W = W.detach()
        return float(W[: config.n_keys].pow(2).sum() / W.pow(2).sum())

    # measured (seeds 0-2): W_K 0.999, W_V 0.000-0.001, tied 0.63-0.65
    assert key_share(untied.model.attn.W_K) > 0.95
    assert key_share(untied.model.attn.W_V) < 0.05
    assert 0.2 < key_share(tied.model.attn.W_K) < 0.9
    # and with 4 times the steps the equal-parameter tied head also solves the task (measured 1.00)
    assert train_recall(TiedRecallModel, RecallConfig(d_head=6, steps=1200), seed=0).accuracy >= 0.95
