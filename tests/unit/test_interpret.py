"""selfattn.interpret: the instrumented run equals the encoder, the masks do what the text says,
the attributions match independent computations (finite differences, torch autograd, scipy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfattn import interpret

SENTENCE = "The cat sat on the mat."
REFERENCE = "A kitten rested on the rug."


@pytest.fixture(scope="module")
def setup(minilm):
    encoder = minilm.encoder()
    batch = minilm.tokenize(SENTENCE)
    reference = minilm.sentence_embedding(REFERENCE)[0]
    return minilm, encoder, batch, reference


def _f(minilm, encoder, ids, reference, masks=None):
    with torch.no_grad():
        hidden, _ = interpret.run_layers(encoder, encoder.embeddings(ids), masks=masks)
    return float(interpret.sentence_embedding(hidden[-1])[0] @ reference)


def test_run_layers_equals_the_encoder_and_the_model_embedding(setup):
    minilm, encoder, batch, reference = setup
    with torch.no_grad():
        out = encoder(batch.input_ids, output_weights=True)
        hidden, weights = interpret.run_layers(encoder, encoder.embeddings(batch.input_ids))
        mid, _ = interpret.run_layers(encoder, out.hidden_states[3], start=3)
    for ours, theirs in zip(hidden, out.hidden_states[1:], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    for ours, theirs in zip(weights, out.weights, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(mid[-1], out.hidden_states[-1], rtol=0, atol=0)
    torch.testing.assert_close(
        interpret.sentence_embedding(hidden[-1]),
        minilm.sentence_embedding(SENTENCE),
        rtol=1e-5,
        atol=1e-6,
    )


def test_blocking_an_edge_zeroes_it_and_renormalises_the_row(setup):
    _, encoder, batch, _ = setup
    T, H = batch.input_ids.shape[1], encoder.config.n_heads
    keep = torch.ones(1, H, T, T, dtype=torch.bool)
    keep[0, 4, 2, 0] = False
    with torch.no_grad():
        x = encoder.embeddings(batch.input_ids)
        _, (w0,) = interpret.run_layers(encoder, x, start=5)
        _, (w1,) = interpret.run_layers(encoder, x, start=5, masks={5: keep})
    # Layer 6 reads the embeddings here (start=5 on x): both runs see the same input.
    assert w1[0, 4, 2, 0].item() == 0.0
    expected = w0[0, 4, 2].clone()
    expected[0] = 0.0
    expected = expected / expected.sum()
    torch.testing.assert_close(w1[0, 4, 2], expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w1[0, 3], w0[0, 3], rtol=0, atol=0)  # other heads untouched


def test_head_ablation_equals_zeroing_the_heads_context(setup):
    """Blocking every key of head h must equal removing h's share of W_O from the output."""
    _, encoder, batch, _ = setup
    block = encoder.blocks[2]
    attn = block.attn
    H, Dh = attn.config.n_heads, attn.config.d_head
    with torch.no_grad():
        x = encoder.embeddings(batch.input_ids)
        keep = torch.ones(1, H, 1, 1, dtype=torch.bool)
        keep[0, 7] = False
        ablated = attn(x, mask=keep)
        # Independent: the per-head contributions of torch's own MHA weights, head 7's removed.
        Q = (x @ attn.W_Q + attn.b_Q).reshape(1, -1, H, Dh).transpose(1, 2)
        K = (x @ attn.W_K + attn.b_K).reshape(1, -1, H, Dh).transpose(1, 2)
        V = (x @ attn.W_V + attn.b_V).reshape(1, -1, H, Dh).transpose(1, 2)
        context = torch.nn.functional.scaled_dot_product_attention(Q, K, V)
        context[:, 7] = 0.0
        expected = context.transpose(1, 2).reshape(1, -1, H * Dh) @ attn.W_O + attn.b_O
    torch.testing.assert_close(ablated, expected, rtol=1e-5, atol=1e-5)


def test_ablation_functions_agree_with_single_runs(setup):
    minilm, encoder, batch, reference = setup
    ids = batch.input_ids
    T, H = ids.shape[1], encoder.config.n_heads
    base = _f(minilm, encoder, ids, reference)
    heads = interpret.ablate_heads(encoder, ids, reference)
    keys = interpret.ablate_keys(encoder, ids, reference, 4)
    edges = interpret.ablate_edges(encoder, ids, reference, 5, 2)
    assert heads.shape == (6, H) and keys.shape == (H, T) and edges.shape == (T, T)
    assert np.isfinite(heads).all() and np.isfinite(keys).all() and np.isfinite(edges).all()
    keep = torch.ones(1, H, 1, 1, dtype=torch.bool)
    keep[0, 9] = False
    assert heads[1, 9] == pytest.approx(
        _f(minilm, encoder, ids, reference, {1: keep}) - base, abs=1e-5
    )
    keep = torch.ones(1, H, 1, T, dtype=torch.bool)
    keep[0, 3, 0, 2] = False
    assert keys[3, 2] == pytest.approx(
        _f(minilm, encoder, ids, reference, {4: keep}) - base, abs=1e-5
    )
    keep = torch.ones(1, H, T, T, dtype=torch.bool)
    keep[0, 2, 5, 1] = False
    assert edges[5, 1] == pytest.approx(
        _f(minilm, encoder, ids, reference, {5: keep}) - base, abs=1e-5
    )


def test_edge_attributions_against_autograd_and_finite_differences(setup):
    minilm, encoder, batch, reference = setup
    A = interpret.edge_attributions(encoder, batch.input_ids, reference, batch.tokens[0])
    L, H, T = 6, 12, batch.input_ids.shape[1]
    assert A.weights.shape == A.norms.shape == A.grad_x_weight.shape == (L, H, T, T)
    assert A.target == pytest.approx(_f(minilm, encoder, batch.input_ids, reference), abs=1e-6)
    with torch.no_grad():
        out = encoder(batch.input_ids, output_weights=True)
    np.testing.assert_allclose(
        A.weights, torch.stack(out.weights)[:, 0].double().numpy(), atol=1e-7
    )
    # Norms: alpha_ij * ||(x_j W_V + b_V)^h W_O^h||, computed here with explicit slices.
    attn = encoder.blocks[3].attn
    h, j = 5, 2
    hw = attn.head_weights(h)
    v = out.hidden_states[3][0, j] @ hw.W_V + attn.b_V[h * 32 : (h + 1) * 32]
    moved = (v @ hw.W_O).norm().item()
    np.testing.assert_allclose(A.norms[3, h, :, j], A.weights[3, h, :, j] * moved, rtol=1e-5)
    # Gradient x weight, independently: rebuild layer 3 with the weights as an explicit leaf tensor
    # (context = alpha @ V, then W_O, the residual and the two layer norms), run the rest, autograd.
    block = encoder.blocks[2]
    a = encoder.blocks[2].attn
    x_in = out.hidden_states[2]
    alpha = out.weights[2].clone().requires_grad_(True)  # (1, H, T, T)
    V = (x_in @ a.W_V + a.b_V).reshape(1, T, H, 32).transpose(1, 2)  # (1, H, T, Dh)
    attn_out = (alpha @ V).transpose(1, 2).reshape(1, T, H * 32) @ a.W_O + a.b_O
    y = block.ln1(x_in + attn_out)
    y = block.ln2(y + block.ffn(y))
    rest, _ = interpret.run_layers(encoder, y, start=3)
    f = interpret.sentence_embedding(rest[-1])[0] @ reference
    (g,) = torch.autograd.grad(f, alpha)
    np.testing.assert_allclose(
        A.grad_x_weight[2], (alpha * g)[0].detach().double().numpy(), atol=1e-6
    )
    # Token-level gradient x input, against autograd on a fresh graph.
    x = encoder.embeddings(batch.input_ids).detach().requires_grad_(True)
    hidden, _ = interpret.run_layers(encoder, x)
    f = interpret.sentence_embedding(hidden[-1])[0] @ reference
    (grad,) = torch.autograd.grad(f, x)
    np.testing.assert_allclose(
        A.token_grad_x_input, (grad * x).sum(-1)[0].detach().double().numpy(), atol=1e-6
    )
    assert np.isfinite(A.grad_x_weight).all() and np.abs(A.grad_x_weight).max() > 0


def test_spearman_against_the_classical_formula_and_a_tied_example(rng):
    a = rng.normal(size=50)
    b = a + rng.normal(size=50)
    # Without ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)), d the rank differences (Spearman 1904).
    d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
    expected = 1 - 6 * (d**2).sum() / (50 * (50**2 - 1))
    assert interpret.spearman(a, b) == pytest.approx(expected, abs=1e-12)
    # With ties, by hand: ranks of [1, 2, 2, 3] are [0, 1.5, 1.5, 3]; of [1, 3, 2, 4]: [0, 2, 1, 3].
    ra, rb = np.array([0, 1.5, 1.5, 3]), np.array([0.0, 2, 1, 3])
    ra, rb = ra - ra.mean(), rb - rb.mean()
    tied = (ra * rb).sum() / np.sqrt((ra**2).sum() * (rb**2).sum())
    assert interpret.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(tied, abs=1e-12)
    assert interpret.spearman(a, a**3) == pytest.approx(1.0, abs=1e-12)
    assert interpret.spearman(a, -a) == pytest.approx(-1.0, abs=1e-12)
    with pytest.raises(ValueError, match="constant"):
        interpret.spearman(np.ones(5), a[:5])
    with pytest.raises(ValueError, match="finite"):
        interpret.spearman([1.0, np.nan, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        interpret.per_head_spearman(np.ones((2, 3, 3)), np.ones((2, 3, 3)))


def test_bad_inputs_name_the_argument(setup):
    minilm, encoder, batch, reference = setup
    with pytest.raises(TypeError, match="Encoder"):
        interpret.run_layers(object(), torch.zeros(1, 3, 384))
    with pytest.raises(ValueError, match="start"):
        interpret.run_layers(encoder, torch.zeros(1, 3, 384), start=6)
    with pytest.raises(ValueError, match="one sentence"):
        interpret.ablate_heads(encoder, batch.input_ids.repeat(2, 1), reference)
    with pytest.raises(ValueError, match="reference"):
        interpret.edge_attributions(encoder, batch.input_ids, reference[None], batch.tokens[0])


# ---- attention rollout and mean ablation (issue 14)


def test_attention_rollout_by_hand_on_two_layers():
    # Layer 1: both heads move all of token 1 into token 0's output (rows: queries).
    # Layer 2: head 1 uniform, head 2 the identity -> heads averaged: [[0.75, 0.25], [0.25, 0.75]].
    layer1 = np.array([[[0.0, 1.0], [0.0, 1.0]]] * 2)  # (H, T, T)
    layer2 = np.stack([np.full((2, 2), 0.5), np.eye(2)])
    R1 = 0.5 * np.eye(2) + 0.5 * np.array([[0.0, 1.0], [0.0, 1.0]])  # [[0.5, 0.5], [0, 1]]
    R2 = 0.5 * np.eye(2) + 0.5 * np.array([[0.75, 0.25], [0.25, 0.75]])  # [[0.875, 0.125], [0.125, 0.875]]
    got = interpret.attention_rollout(np.stack([layer1, layer2]))
    # R2 @ R1 = [[0.4375, 0.5625], [0.0625, 0.9375]], worked out by hand
    np.testing.assert_allclose(got, [[0.4375, 0.5625], [0.0625, 0.9375]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(got, R2 @ R1, rtol=0, atol=1e-15)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-15)
    # one layer of pure self-attention keeps every token where it is
    np.testing.assert_allclose(interpret.attention_rollout(np.eye(3)[None, None]), np.eye(3), atol=0)


def test_attention_rollout_renormalises_rows_and_rejects_bad_input(setup):
    minilm, encoder, batch, reference = setup
    with torch.no_grad():
        weights = encoder(batch.input_ids, output_weights=True).weights
    got = interpret.attention_rollout(torch.stack([w[0] for w in weights]))
    assert np.isfinite(got).all() and (got >= 0).all()
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    # residual 0: the plain product of the head-averaged maps
    W = torch.stack([w[0] for w in weights]).double().mean(1).numpy()  # (L, T, T)
    expected = np.linalg.multi_dot(list(W[::-1]))
    np.testing.assert_allclose(interpret.attention_rollout(torch.stack([w[0] for w in weights]), residual=0.0),
                               expected, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        interpret.attention_rollout(np.ones((2, 3, 3)))
    with pytest.raises(ValueError, match="non-negative"):
        interpret.attention_rollout(-np.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="residual"):
        interpret.attention_rollout(np.ones((1, 1, 2, 2)), residual=1.0)


@pytest.fixture(scope="module")
def means(minilm, setup):
    _, encoder, _, _ = setup
    ids = [minilm.tokenize(s).input_ids for s in (SENTENCE, REFERENCE, "I opened a bank account.")]
    return interpret.dataset_means(encoder, ids), ids


def test_dataset_means_average_every_token_position(setup, means):
    minilm, encoder, _, _ = setup
    m, ids = means
    assert m.n_tokens == sum(i.shape[1] for i in ids)
    with torch.no_grad():
        embeddings = torch.cat([encoder.embeddings(i)[0] for i in ids])  # (sum T, D)
    torch.testing.assert_close(m.embedding, embeddings.mean(0), atol=1e-6, rtol=1e-6)
    # the context mean of layer 0, head 3 from the encoder's own weights and an explicit value projection
    attn, Dh = encoder.blocks[0].attn, encoder.blocks[0].attn.config.d_head
    contexts = []
    for i in ids:
        with torch.no_grad():
            out = encoder(i, output_weights=True)
            V = out.hidden_states[0][0] @ attn.head_weights(3).W_V + attn.b_V[3 * Dh : 4 * Dh]  # (T, Dh)
            contexts.append(out.weights[0][0, 3] @ V)
    torch.testing.assert_close(m.contexts[0, 3], torch.cat(contexts).mean(0), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="at least one"):
        interpret.dataset_means(encoder, [])


def _f_with_attention_output(encoder, ids, reference, layer, change):
    """f after replacing block ``layer``'s attention output by change(x, attn): an explicit rebuild
    of the post-norm block (ln1(x + attn), then ln2(x + ffn(x))) and the blocks after it."""
    with torch.no_grad():
        x = encoder.embeddings(ids)
        if layer > 0:
            x = interpret.run_layers(encoder, x)[0][layer - 1]
        block = encoder.blocks[layer]
        h = block.ln1(x + change(x, block.attn))
        h = block.ln2(h + block.ffn(h))
        if layer + 1 < len(encoder.blocks):
            h = interpret.run_layers(encoder, h, start=layer + 1)[0][-1]
        return float(interpret.sentence_embedding(h)[0] @ reference)


def _explicit_attention(x, attn, value_of=None):
    """The attention layer written out head by head; value_of(h, V_h) may change head h's values."""
    H, Dh = attn.config.n_heads, attn.config.d_head
    out = attn.b_O.clone()
    for h in range(H):
        hw = attn.head_weights(h)
        cols = slice(h * Dh, (h + 1) * Dh)
        Q, K = x[0] @ hw.W_Q + attn.b_Q[cols], x[0] @ hw.W_K + attn.b_K[cols]
        V = x[0] @ hw.W_V + attn.b_V[cols]  # (T, Dh)
        if value_of is not None:
            V = value_of(h, V)
        weights = torch.softmax(Q @ K.T / Dh**0.5, dim=-1)
        out = out + weights @ V @ hw.W_O
    return out[None]


def test_mean_ablate_keys_equals_an_explicit_rebuild(setup, means):
    minilm, encoder, batch, reference = setup
    m, _ = means
    ids = batch.input_ids
    base = _f_with_attention_output(encoder, ids, reference, 2, _explicit_attention)
    assert abs(base - _f(minilm, encoder, ids, reference)) < 1e-5  # the rebuild is the model
    got = interpret.mean_ablate_keys(encoder, ids, reference, 2, m)
    assert got.shape == (12, ids.shape[1]) and np.isfinite(got).all()
    for h, j in ((0, 0), (4, 3), (11, ids.shape[1] - 1)):
        def value_of(head, V, h=h, j=j):
            if head != h:
                return V
            V = V.clone()
            V[j] = m.values[2, h]  # key j supplies the mean value of head h
            return V

        want = _f_with_attention_output(encoder, ids, reference, 2,
                                        lambda x, attn, v=value_of: _explicit_attention(x, attn, v)) - base
        assert abs(got[h, j] - want) < 2e-5, (h, j, got[h, j], want)


def test_zero_value_keys_equals_an_explicit_rebuild_and_isolates_the_replacement_value(setup, means):
    """Value zero, weights fixed: an explicit rebuild with v_j^h = 0; it differs from blocking the key
    (which renormalises the row) and from the mean value (which supplies another vector)."""
    minilm, encoder, batch, reference = setup
    m, _ = means
    ids = batch.input_ids
    base = _f_with_attention_output(encoder, ids, reference, 2, _explicit_attention)
    got = interpret.zero_value_keys(encoder, ids, reference, 2)
    assert got.shape == (12, ids.shape[1]) and np.isfinite(got).all()
    for h, j in ((0, 0), (4, 3), (11, ids.shape[1] - 1)):
        def value_of(head, V, h=h, j=j):
            if head != h:
                return V
            V = V.clone()
            V[j] = 0.0  # key j supplies nothing to head h; its weight is unchanged
            return V

        want = _f_with_attention_output(encoder, ids, reference, 2,
                                        lambda x, attn, v=value_of: _explicit_attention(x, attn, v)) - base
        assert abs(got[h, j] - want) < 2e-5, (h, j, got[h, j], want)
    blocked = interpret.ablate_keys(encoder, ids, reference, 2)
    mean_value = interpret.mean_ablate_keys(encoder, ids, reference, 2, m)
    # three different ablations: each pair differs by far more than the rebuild's tolerance somewhere
    assert np.abs(got - blocked).max() > 1e-3 and np.abs(got - mean_value).max() > 1e-3
    with pytest.raises(ValueError, match="layer"):
        interpret.zero_value_keys(encoder, ids, reference, 6)


def test_mean_ablate_heads_equals_an_explicit_rebuild_and_differs_from_zero_ablation(setup, means):
    minilm, encoder, batch, reference = setup
    m, _ = means
    ids = batch.input_ids
    got = interpret.mean_ablate_heads(encoder, ids, reference, m)
    assert got.shape == (6, 12) and np.isfinite(got).all()
    base = _f_with_attention_output(encoder, ids, reference, 4, _explicit_attention)
    attn = encoder.blocks[4].attn
    Dh = attn.config.d_head

    def replaced(x, attn, h=7):
        hw = attn.head_weights(h)
        cols = slice(h * Dh, (h + 1) * Dh)
        weights = torch.softmax((x[0] @ hw.W_Q + attn.b_Q[cols]) @ (x[0] @ hw.W_K + attn.b_K[cols]).T / Dh**0.5, -1)
        own = weights @ (x[0] @ hw.W_V + attn.b_V[cols]) @ hw.W_O  # (T, D): head 7's contribution
        return _explicit_attention(x, attn) + (m.contexts[4, h] @ hw.W_O - own)[None]

    want = _f_with_attention_output(encoder, ids, reference, 4, replaced) - base
    assert abs(got[4, 7] - want) < 2e-5, (got[4, 7], want)
    # zero and mean ablation are different interventions: they must not give the same numbers
    assert np.abs(got - interpret.ablate_heads(encoder, ids, reference)).max() > 1e-3


def test_ablate_tokens_zero_and_mean_equal_single_runs(setup, means):
    minilm, encoder, batch, reference = setup
    m, _ = means
    ids = batch.input_ids
    zero, mean = interpret.ablate_tokens(encoder, ids, reference), interpret.ablate_tokens(encoder, ids, reference, m)
    assert zero.shape == mean.shape == (ids.shape[1],) and np.isfinite(zero).all() and np.isfinite(mean).all()
    base = _f(minilm, encoder, ids, reference)
    for j in (0, 3):
        for fill, got in ((torch.zeros(384), zero), (m.embedding, mean)):
            with torch.no_grad():
                x = encoder.embeddings(ids).clone()
                x[0, j] = fill
                hidden, _ = interpret.run_layers(encoder, x)
            want = float(interpret.sentence_embedding(hidden[-1])[0] @ reference) - base
            assert abs(got[j] - want) < 1e-5
    with pytest.raises(ValueError, match="replacement"):
        interpret.ablate_tokens(encoder, ids, reference, "mean")
    with pytest.raises(TypeError, match="DatasetMeans"):
        interpret.mean_ablate_heads(encoder, ids, reference, "zero")


def test_attention_rollout_with_residual_0_and_a_zero_row_raises_naming_residual():
    # Regression: with residual=0 a query row whose head-averaged weights sum to zero (e.g. a padded
    # query that sees nothing, a zero row by the package's mask convention) was renormalised as 0/0,
    # and the rollout came back with NaN rows. It now raises, naming residual, the layer and the row.
    w = np.array([[[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]])  # (1, 1, 3, 3): row 2 sees nothing
    with pytest.raises(ValueError, match=r"residual=0.*row 2 of layer 0"):
        interpret.attention_rollout(w, residual=0.0)
    with pytest.raises(ValueError, match=r"residual=0 leaves row 2 of layer 1"):
        interpret.attention_rollout(np.stack([np.eye(3)[None], w[0]]), residual=0)  # the second layer's row
    # any residual > 0 keeps such a row well defined: the identity keeps the token where it is
    got = interpret.attention_rollout(w, residual=0.5)
    np.testing.assert_allclose(got, [[0.75, 0.25, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], rtol=0, atol=1e-15)
    # a row whose sum overflows (finite weights near the float64 maximum) is refused, not 0 or NaN
    with pytest.raises(ValueError, match=r"weights.*layer 0.*row 0.*sum"):
        interpret.attention_rollout(np.full((1, 2, 2, 2), 1e308), residual=0.0)
