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
