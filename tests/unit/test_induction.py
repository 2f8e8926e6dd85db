"""selfattn.experiments.induction: the repeated-span data, the score definitions on attention patterns
whose answers are known by hand, mean ablation and path patching, composition scores, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn.experiments.induction import (
    AttentionOnly,
    InductionConfig,
    RepeatedSpans,
    composition_baseline,
    composition_scores,
    head_means,
    induction_scores,
    previous_token_scores,
    repeated_spans,
    run_ablated,
    span_losses,
)

SMALL = InductionConfig(vocab_size=16, seq_len=20, span=5, d_model=16, n_heads=2, steps=1, batch_size=4)


def test_repeated_spans_shapes_copies_and_determinism():
    batch = repeated_spans(64, SMALL, torch.Generator().manual_seed(0))
    assert batch.ids.shape == (64, 20) and batch.ids.dtype == torch.int64 and batch.span == 5
    assert int(batch.ids.min()) >= 0 and int(batch.ids.max()) < 16
    assert (batch.first >= 0).all() and (batch.second >= batch.first + 5).all() and (batch.second + 5 <= 20).all()
    for b in range(64):  # the span really is copied, token for token
        f, s = int(batch.first[b]), int(batch.second[b])
        assert batch.ids[b, s : s + 5].tolist() == batch.ids[b, f : f + 5].tolist()
    again = repeated_spans(64, SMALL, torch.Generator().manual_seed(0))
    assert torch.equal(again.ids, batch.ids) and torch.equal(again.second, batch.second)
    other = repeated_spans(64, SMALL, torch.Generator().manual_seed(1))
    assert not torch.equal(other.ids, batch.ids)
    # The gap varies: no fixed offset solves the task. Every allowed start occurs in 4000 draws.
    many = repeated_spans(4000, SMALL, torch.Generator().manual_seed(2))
    assert set((many.second - many.first).tolist()) == set(range(5, 16))
    assert set(many.first.tolist()) == set(range(0, 11))


def test_previous_token_score_on_hand_built_patterns():
    T = 6
    shifted = torch.zeros(1, 1, T, T)
    shifted[0, 0, 0, 0] = 1.0
    shifted[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1.0  # every t reads t - 1
    diagonal = torch.eye(T)[None, None]  # every t reads itself
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # t reads 0..t equally
    weights = torch.cat([shifted, diagonal, uniform[None, None]], dim=1)  # (1, 3, T, T)
    expected_uniform = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)
    torch.testing.assert_close(previous_token_scores(weights),
                               torch.tensor([1.0, 0.0, expected_uniform]), rtol=0, atol=1e-7)


def test_induction_score_on_hand_built_patterns():
    T, S = 12, 3
    ids = torch.arange(T)[None].clone()
    ids[0, 7:10] = ids[0, 2:5]  # span at 2 repeated at 7
    batch = RepeatedSpans(ids, torch.tensor([2]), torch.tensor([7]), S)
    induction = torch.eye(T)  # rows that are not of the second occurrence: attend to self
    for i in range(S - 1):  # query 7 + i reads 2 + i + 1
        induction[7 + i] = 0.0
        induction[7 + i, 3 + i] = 1.0
    copy = torch.eye(T)  # the query reads the earlier copy of itself (2 + i), not the token after
    for i in range(S):
        copy[7 + i] = 0.0
        copy[7 + i, 2 + i] = 1.0
    half = 0.5 * induction + 0.5 * torch.eye(T)
    weights = torch.stack([induction, copy, half])[None]  # (1, 3, T, T)
    torch.testing.assert_close(induction_scores(weights, batch), torch.tensor([1.0, 0.0, 0.5]), rtol=0, atol=1e-7)
    # The previous-token score of the same patterns: the copy head reads t - 5, never t - 1.
    assert float(previous_token_scores(weights)[1]) == 0.0


def test_span_losses_against_hand_computed_log_probabilities():
    T, S, V = 10, 3, 4
    ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 1, 2]])
    batch = RepeatedSpans(ids, torch.tensor([1]), torch.tensor([5]), S)  # span (1, 2, 3) at 1 and 5
    logits = torch.zeros(1, T, V)
    logits[0, 5, 2] = math.log(3.0)  # at the second occurrence's first token: p(2) = 3/6 = 1/2
    first, second = span_losses(logits, batch)
    torch.testing.assert_close(first, torch.full((2,), math.log(4.0)))
    torch.testing.assert_close(second, torch.tensor([math.log(2.0), math.log(4.0)]))


def test_run_ablated_without_heads_is_the_model_and_ablation_changes_only_what_it_should():
    torch.manual_seed(0)
    model = AttentionOnly(SMALL).eval()
    batch = repeated_spans(8, SMALL, torch.Generator().manual_seed(0))
    means = head_means(model, batch)
    assert means.shape == (2, 2, 8) and torch.isfinite(means).all()
    with torch.no_grad():
        logits, weights = model(batch.ids, return_weights=True)
    for side in (None, "queries", "keys", "values"):
        ablated, _ = run_ablated(model, batch.ids, means, [], side=side)
        torch.testing.assert_close(ablated, logits, rtol=0, atol=0)
    # A layer-2 head ablated "on the keys of later layers" changes nothing: no later layer reads it.
    torch.testing.assert_close(run_ablated(model, batch.ids, means, [(1, 0)], side="keys")[0], logits)
    # Layer 1 ablated on the keys side: layer 2's weights change, layer 1's do not.
    _, w_keys = run_ablated(model, batch.ids, means, [(0, 1)], side="keys")
    torch.testing.assert_close(w_keys[0], weights[0], rtol=0, atol=0)
    assert (w_keys[1] - weights[1]).abs().max() > 1e-4
    # A full mean ablation of a last-layer head: its output becomes means @ W_O^h, by hand.
    attn = model.layers[1]
    with torch.no_grad():
        contexts, _ = model.head_contexts(1, model.embed(batch.ids) + model.write(0, model.head_contexts(0, model.embed(batch.ids))[0]))
        W_O = attn.W_O.reshape(2, 8, 16)  # (H, Dh, D)
        change = (means[1, 0] - contexts[:, 0]) @ W_O[0]  # (B, T, Dh) @ (Dh, D)
        expected = logits + change @ model.unembed.weight.T
    torch.testing.assert_close(run_ablated(model, batch.ids, means, [(1, 0)])[0], expected, rtol=1e-4, atol=1e-4)


def test_composition_scores_on_hand_built_heads():
    torch.manual_seed(0)
    model = AttentionOnly(SMALL)
    D = 16
    with torch.no_grad():
        for layer in model.layers:
            for W in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O):
                W.zero_()
        # layer 1 head 0 writes into features 0..7 (W_V reads 8..15); layer 2 head 0's keys read 0..7,
        # layer 2 head 1's keys read 8..15 (orthogonal to what head 0 wrote)
        model.layers[0].W_V[8:, :8] = torch.eye(8)
        model.layers[0].W_O[:8, :8] = torch.eye(8)
        model.layers[0].W_V[:8, 8:] = torch.eye(8)  # layer 1 head 1 writes into 8..15, reads 0..7
        model.layers[0].W_O[8:, 8:] = torch.eye(8)
        model.layers[1].W_Q[8:, :8] = torch.eye(8)
        model.layers[1].W_K[:8, :8] = torch.eye(8)
        model.layers[1].W_Q[:8, 8:] = torch.eye(8)
        model.layers[1].W_K[8:, 8:] = torch.eye(8)
        model.layers[1].W_V[:, :8] = torch.eye(D)[:, :8]
        model.layers[1].W_O[:8, :8] = torch.eye(8)
        model.layers[1].W_V[:, 8:] = torch.eye(D)[:, 8:]
        model.layers[1].W_O[8:, 8:] = torch.eye(8)
    scores = composition_scores(model)
    # W_QK^h2 W_OV^h1^T: identity blocks that meet give ||I_8||_F / (||I_8|| ||I_8||) = 1 / sqrt(8).
    k = scores["keys"]
    torch.testing.assert_close(k, torch.tensor([[8**-0.5, 0.0], [0.0, 8**-0.5]]))
    for kind in ("queries", "values"):
        assert scores[kind].shape == (2, 2) and torch.isfinite(scores[kind]).all()
    torch.testing.assert_close(scores["queries"], torch.tensor([[0.0, 8**-0.5], [8**-0.5, 0.0]]))


def test_composition_baseline_is_reproducible_and_near_its_scale():
    a, b = composition_baseline(32, 8, n=50, seed=0), composition_baseline(32, 8, n=50, seed=0)
    assert a == b and set(a) == {"keys", "queries", "values"}
    for v in a.values():
        assert 0.05 < v < 0.5  # random rank-8 products in 32 dimensions: well below 1, well above 0
    # Full-rank square heads: the score of two random D x D Gaussians, about 1 / sqrt(D) times a constant.
    full = composition_baseline(8, 8, n=200)
    assert full["keys"] > a["keys"]


def test_refusals():
    with pytest.raises(ValueError, match="span"):
        InductionConfig(seq_len=10, span=6)
    with pytest.raises(ValueError, match="divisible"):
        InductionConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="lr"):
        InductionConfig(lr=float("nan"))
    with pytest.raises(ValueError, match="rope_layers"):
        InductionConfig(rope_layers=3)
    with pytest.raises(TypeError, match="generator"):
        repeated_spans(2, SMALL, 0)
    with pytest.raises(TypeError, match="InductionConfig"):
        repeated_spans(2, {"span": 3}, torch.Generator())
    with pytest.raises(ValueError, match="T >= 2"):
        previous_token_scores(torch.ones(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"\(B, H, T, T\)"):
        previous_token_scores(torch.ones(1, 1, 3, 4))
    batch = repeated_spans(2, SMALL, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="for this batch"):
        induction_scores(torch.ones(3, 1, 20, 20), batch)
    with pytest.raises(ValueError, match="logits"):
        span_losses(torch.zeros(2, 19, 16), batch)
    model = AttentionOnly(SMALL)
    means = head_means(model, batch)
    with pytest.raises(ValueError, match="heads"):
        run_ablated(model, batch.ids, means, [(2, 0)])
    with pytest.raises(ValueError, match="side"):
        run_ablated(model, batch.ids, means, [(0, 0)], side="outputs")
    with pytest.raises(ValueError, match="means"):
        run_ablated(model, batch.ids, means[0], [(0, 0)])
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match="earlier"):
        composition_scores(model, 1, 0)


def test_scores_measured_during_training_leave_the_training_bit_identical():
    # evaluating on a fixed batch every few steps must not change the random stream or the weights
    from selfattn.experiments.induction import train_induction

    config = InductionConfig(vocab_size=16, seq_len=20, span=5, d_model=16, n_heads=2, steps=30, batch_size=8)
    plain = train_induction(config, seed=3)
    watched = train_induction(config, seed=3, eval_every=10, eval_size=16)
    assert plain.train_loss == watched.train_loss
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), watched.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert watched.eval_steps == [0, 10, 20, 30] and plain.eval_steps == []
    assert watched.ind_scores.shape == (4, 2, 2) and watched.prev_scores.shape == (4, 2, 2)
    assert torch.isfinite(watched.ind_scores).all()
    assert float(watched.ind_scores.min()) >= 0 and float(watched.ind_scores.max()) <= 1
    # the last evaluation is of the trained weights: the same scores as measuring them afterwards
    batch = repeated_spans(16, config, torch.Generator().manual_seed(10_000 + 3))
    with torch.no_grad():
        _, weights = watched.model(batch.ids, return_weights=True)
    torch.testing.assert_close(watched.ind_scores[-1], torch.stack([induction_scores(w, batch) for w in weights]),
                               atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="eval_every"):
        train_induction(config, eval_every=-1)
