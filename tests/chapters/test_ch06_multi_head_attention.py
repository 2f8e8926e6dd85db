"""Claims of chapter 06 (multi-head attention), each checked against an independent oracle.

Claim 9: in a real pretrained model (all-MiniLM-L6-v2), which positions a word attends to, on real
sentences. Claim 13: multi-head attention is parallel heads, concatenated and projected by W_O;
heads differ in a real model. The figures the chapter states are asserted here with the same
thresholds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import selfattn
from selfattn.viz.heads import key_share, pairwise_head_distances

SENTENCES = [
    "The chef added salt because the soup tasted bland.",
    "The animal didn't cross the street because it was too tired.",
    "She sat on the river bank and watched the boats.",
]


@pytest.fixture(scope="module")
def maps():
    from selfattn.pretrained import load_minilm

    minilm = load_minilm()
    result = {}
    for sentence in SENTENCES:
        run = minilm.run(sentence)  # one sentence at a time: no padding
        result[sentence] = (
            run.batch.tokens[0],
            torch.stack(run.weights, dim=1)[0].double().numpy(),
        )
    return result  # {sentence: (tokens, (L, H, T, T))}


def _mha(D=16, H=4, seed=0):
    mha = selfattn.MultiHeadAttention(
        selfattn.MHAConfig(D, H), generator=torch.Generator().manual_seed(seed)
    )
    mha = mha.double().eval()
    with torch.no_grad():
        for b in (mha.b_Q, mha.b_K, mha.b_V, mha.b_O):
            b.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(seed + 1))
    return mha


def test_claim_13_multi_head_is_heads_concatenated_then_W_O(rng):
    mha = _mha()
    H, Dh = 4, 4
    X = rng.normal(size=(2, 5, 16))
    with torch.no_grad():
        out, weights = mha(torch.from_numpy(X), return_weights=True)
    p = {
        n: getattr(mha, n).detach().numpy()
        for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    }
    # Independent oracle: one head at a time in NumPy, concatenated, then W_O.
    heads, ws = [], []
    for h in range(H):
        c = slice(h * Dh, (h + 1) * Dh)
        Q, K, V = (X @ p[f"W_{n}"][:, c] + p[f"b_{n}"][c] for n in "QKV")  # (B, T, Dh)
        s = Q @ K.transpose(0, 2, 1) / math.sqrt(Dh)  # (B, T, T)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        heads.append(w @ V)
        ws.append(w)
    expected = np.concatenate(heads, axis=-1) @ p["W_O"] + p["b_O"]  # (B, T, D) @ (D, D)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12, rtol=0)
    np.testing.assert_allclose(weights.numpy(), np.stack(ws, axis=1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("batch_first", [True, False])
def test_claim_13_equals_torch_multihead_attention(batch_first, gen):
    D, H = 16, 4
    torch_mha = nn.MultiheadAttention(D, H, batch_first=batch_first).double().eval()
    ours = selfattn.MultiHeadAttention.from_torch(torch_mha).eval()
    X = torch.randn(2, 5, D, generator=gen, dtype=torch.float64)  # (B, T, D)
    Xt = X if batch_first else X.transpose(0, 1)  # (T, B, D) when not batch_first
    with torch.no_grad():
        out, weights = ours(X, return_weights=True)
        out_t, w_avg = torch_mha(Xt, Xt, Xt)
        _, w_heads = torch_mha(Xt, Xt, Xt, average_attn_weights=False)
        Q, K, V = (selfattn.split_heads(X @ W + b, H) for W, b in
                   ((ours.W_Q, ours.b_Q), (ours.W_K, ours.b_K), (ours.W_V, ours.b_V)))  # fmt: skip
        context = torch.nn.functional.scaled_dot_product_attention(Q, K, V)  # (B, H, T, Dh)
    out_t = out_t if batch_first else out_t.transpose(0, 1)
    torch.testing.assert_close(out, out_t, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, w_heads, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights.mean(dim=1), w_avg, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        selfattn.merge_heads(context) @ ours.W_O + ours.b_O, out, atol=1e-12, rtol=0
    )
    # The fused layout: in_proj_weight rows are W_Q^T, W_K^T, W_V^T.
    torch.testing.assert_close(torch_mha.in_proj_weight[D : 2 * D], ours.W_K.T)


def test_claim_09_a_word_attends_to_specific_positions_in_specific_heads(maps):
    for sentence, query, key, (layer, head) in [
        (SENTENCES[0], "bland", "soup", (1, 11)),
        (SENTENCES[1], "it", "animal", (4, 2)),
    ]:
        tokens, w = maps[sentence]
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert np.isfinite(w).all()
        to_key = w[:, :, tokens.index(query), tokens.index(key)]  # (L, H)
        uniform = 1.0 / len(tokens)
        best = tuple(int(i) + 1 for i in np.unravel_index(to_key.argmax(), to_key.shape))
        assert best == (layer, head)
        assert to_key.max() > max(4 * uniform, 0.45)  # the chapter: 0.49 ("almost half") and 0.68
        assert np.median(to_key) < uniform  # ... while most heads give it less than uniform


def test_claim_09_previous_token_head_in_layer_0(maps):
    for tokens, w in maps.values():
        n = len(tokens)
        prev = np.mean([w[0, 2, i, i - 1] for i in range(1, n)])
        assert prev > 0.95, f"layer 0 head 2 puts {prev:.3f} on the previous token"


def test_claim_09_many_heads_park_weight_on_cls(maps):
    cls = np.mean([key_share(w, [0]) for _, w in maps.values()], axis=0)  # (L, H)
    assert cls[1:5].mean() > 0.5 and cls[0].mean() < 0.35
    # most of the 48 heads of layers 1-4 (the text: "most heads"; measured 34)
    assert (cls[1:5] > 0.5).sum() > 24


def test_claim_13_heads_differ_in_the_real_model(maps):
    dist = np.mean(
        [
            np.stack([pairwise_head_distances(w[layer]) for layer in range(w.shape[0])])
            for _, w in maps.values()
        ],
        axis=0,
    )  # (L, H, H)
    iu = np.triu_indices(dist.shape[1], k=1)
    pairs = dist[:, iu[0], iu[1]]  # (L, 66)
    assert np.isfinite(pairs).all()
    assert pairs.min() > 0.1, f"closest pair of heads {pairs.min():.3f}"
    assert pairs.mean() > 0.25, f"mean distance {pairs.mean():.3f}"


def test_claim_13_heads_cost_the_same_flops_but_h_times_the_score_memory():
    """H heads of width D/H: the parameters and matrix-product FLOPs of one head of width D, but H
    (T, T) weight matrices instead of one, and a peak memory larger by at least one per extra head."""
    from torch.utils.flop_counter import FlopCounterMode

    from selfattn.efficient.memory import peak_tensor_bytes

    D, T = 64, 256
    x = torch.randn(1, T, D, generator=torch.Generator().manual_seed(6))
    costs = {}
    for H in (1, 8):
        layer = selfattn.MultiHeadAttention(selfattn.MHAConfig(D, H)).eval()
        with torch.no_grad():
            with FlopCounterMode(display=False) as counter:
                out, w = layer(x, return_weights=True)
            peak, _ = peak_tensor_bytes(layer, x)
        assert torch.isfinite(out).all()
        params = sum(p.numel() for p in layer.parameters())
        costs[H] = (params, counter.get_total_flops(), w.numel(), peak)
    # Expected values from the shapes alone: 4 (D, D) matrices and biases; 4 projections of
    # 2 T D^2 FLOPs and 2 products of 2 T^2 D FLOPs (H * 2 T^2 Dh = 2 T^2 D).
    assert costs[1][0] == costs[8][0] == 4 * D * D + 4 * D
    assert costs[1][1] == costs[8][1] == 4 * 2 * T * D * D + 2 * 2 * T * T * D
    assert costs[1][2] == T * T and costs[8][2] == 8 * T * T
    assert costs[8][3] - costs[1][3] >= 7 * T * T * 4  # float32 (T, T) per extra head, at least once


def test_claim_13_two_heads_do_two_lookups_one_head_does_not_learn_both():
    """A task that needs two lookups at once: two heads of width 8 learn it, one head of width 16
    with the same parameters and the same training does not learn both lookups within this budget
    (the chapter's seed, 0; seeds 1 and 2 below). Not a proof that one head cannot."""
    from selfattn.experiments.two_lookups import (
        TwoLookupConfig,
        sample_two_lookups,
        train_two_lookups,
    )

    config = TwoLookupConfig()
    one, two = (train_two_lookups(H, config, seed=0) for H in (1, 2))
    assert one.n_parameters == two.n_parameters
    assert all(math.isfinite(v) for v in one.losses + two.losses)
    assert two.accuracy > 0.95 and one.accuracy < 0.5 and two.accuracy - one.accuracy > 0.5
    keys, values, _, _ = sample_two_lookups(config, 512, torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, weights = two.model(keys, values, return_weights=True)  # (B, H, 1, P)
    where = keys.argsort(dim=1)[:, :2]  # positions of key A and key B
    share = weights[:, :, 0].gather(2, where[:, None, :].expand(-1, 2, -1)).mean(dim=0)  # (H, 2)
    assert float(share.max(dim=1).values.min()) > 0.9
    assert int(share.argmax(dim=1)[0]) != int(share.argmax(dim=1)[1])


@pytest.mark.parametrize("seed", [1, 2])
def test_claim_13_two_heads_beat_one_for_other_seeds_too(seed):
    """The margin of the chapter's seed is not luck: the same comparison with other seeds."""
    from selfattn.experiments.two_lookups import TwoLookupConfig, train_two_lookups

    one, two = (train_two_lookups(H, TwoLookupConfig(), seed=seed) for H in (1, 2))
    assert two.accuracy > 0.95 and one.accuracy < 0.5 and two.accuracy - one.accuracy > 0.5
