"""Claims 1, 2 and 10 of chapter 01 (tokens and embeddings), on the real all-MiniLM-L6-v2.

The output vectors are computed twice: by the package's encoder (``MiniLM.run``, what the chapter
uses) and by ``transformers.BertModel`` on the same weights (the independent reference). The
thresholds are the chapter's, set with a margin below the measured values, which were (last layer,
cosine of "bank"): river vs account 0.722, river vs thieves 0.739, account vs thieves 0.807; for the
six sentences with "bank" at position 4, river-money 0.728, river-river 0.894, money-money 0.768.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfattn.viz.embeddings import cosine_matrix, word_positions, word_vectors_by_layer

RIVER = "I sat on the river bank."
MONEY = "I opened a bank account."
THIEVES = "Thieves robbed the bank and took the cash."
SIX = [  # "bank" at position 4 in each: three river senses, then three money senses
    "The muddy river bank flooded after the storm.",
    "Fishermen lined the bank of the river.",
    "The steep grassy bank ran down to the water.",
    MONEY,
    THIEVES,
    "Yesterday the central bank raised interest rates.",
]
# our encoder vs transformers, per hidden-state value (as in tests/parity/test_parity_minilm.py)
AGREE = 1e-4


@pytest.fixture(scope="module")
def trio(minilm, hf_model):
    return _bank_vectors(minilm, hf_model, [RIVER, MONEY, THIEVES])


@pytest.fixture(scope="module")
def six(minilm, hf_model):
    return _bank_vectors(minilm, hf_model, SIX)


def _bank_vectors(minilm, hf_model, sentences):
    """The vectors of "bank" in every layer, from our encoder and from transformers: (L + 1, B, D) each."""
    ours = minilm.run(sentences, output_weights=True)
    with torch.no_grad():
        theirs = hf_model(
            input_ids=ours.batch.input_ids,
            attention_mask=ours.batch.attention_mask,
            output_hidden_states=True,
            output_attentions=True,
        )
    pos = word_positions(ours.batch.input_ids, minilm.token_id("bank"))
    v_ours = word_vectors_by_layer(ours.hidden_states, pos)
    v_theirs = word_vectors_by_layer(theirs.hidden_states, pos)
    torch.testing.assert_close(v_ours, v_theirs, rtol=0, atol=AGREE)
    return ours, theirs, pos, v_ours, v_theirs


def test_claim_01_embedding_lookup_is_context_free(minilm, hf_model):
    batch = minilm.tokenize([RIVER, MONEY])
    bank = minilm.token_id("bank")
    pos = word_positions(batch.input_ids, bank)
    assert pos == [6, 4]  # different positions, different neighbours
    ours = minilm.token_embeddings(batch.input_ids)  # (B, T, D)
    with torch.no_grad():
        theirs = hf_model.embeddings.word_embeddings(batch.input_ids)  # transformers' nn.Embedding
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    one_hot = torch.nn.functional.one_hot(batch.input_ids, minilm.config.vocab_size).float()
    product = one_hot @ minilm.embedding_table  # (B, T, V) @ (V, D) -> (B, T, D)
    torch.testing.assert_close(product, ours, rtol=0, atol=0)
    assert torch.isfinite(ours).all()
    assert torch.equal(ours[0, pos[0]], ours[1, pos[1]])  # the same vector, bit for bit
    assert torch.equal(ours[0, pos[0]], minilm.embedding_table[bank])


def test_claim_02_output_vector_depends_on_context(trio, six):
    *_, v_ours, v_theirs = trio
    for v in (v_ours, v_theirs):
        cos = cosine_matrix(v[-1])  # (3, 3), last layer
        assert np.isfinite(cos).all()
        # the text: 'below 0.75'; measured 0.722 and 0.739
        assert cos[0, 1] < 0.75 and cos[0, 2] < 0.75
    # with "bank" at the same position the input to layer 1 is identical, so any later difference
    # comes from the other words of the sentence
    *_, v_ours, v_theirs = six
    for v in (v_ours, v_theirs):
        cos = cosine_matrix(v)  # (L + 1, 6, 6)
        np.testing.assert_allclose(cos[0], np.ones((6, 6)), rtol=0, atol=1e-6)
        assert cos[-1][:3, 3:].mean() < 0.80  # measured 0.728
        # every layer moves them apart from their common start
        assert cos[1:].max(initial=-1.0, where=~np.eye(6, dtype=bool)) < 0.99


def test_claim_10_same_word_receives_different_context(trio, six):
    ours, theirs, pos, v_ours, v_theirs = trio
    for v in (v_ours, v_theirs):
        cos = cosine_matrix(v[-1])
        assert cos[1, 2] > 0.8  # the text: 'above 0.8'; measured 0.807
        assert cos[1, 2] - max(cos[0, 1], cos[0, 2]) > 0.04  # measured 0.807 - 0.739 = 0.068
    # the context read differs: in layer 1 (mean over heads), the content word "bank" reads most
    for weights in (ours.weights[0], theirs.attentions[0]):
        for b, expected in enumerate(["river", "account", "robbed"]):
            tokens, n = ours.batch.tokens[b], ours.lengths[b]
            row = weights[b, :, pos[b], :n].mean(dim=0)  # (H, T) -> (T,)
            torch.testing.assert_close(row.sum(), torch.tensor(1.0), rtol=0, atol=1e-5)
            content = [t for t in range(n) if tokens[t] not in ("[CLS]", "[SEP]", ".", "bank")]
            assert tokens[max(content, key=lambda t: float(row[t]))] == expected
    # like contexts give like vectors: within-sense pairs beat river-money pairs, by a margin
    *_, v_ours, v_theirs = six
    off = ~np.eye(3, dtype=bool)
    for v in (v_ours, v_theirs):
        cos = cosine_matrix(v[-1])  # (6, 6)
        river, money, across = cos[:3, :3][off].mean(), cos[3:, 3:][off].mean(), cos[:3, 3:].mean()
        assert (river + money) / 2 - across > 0.07  # measured 0.103
        assert min(river, money) - across > 0.02  # measured 0.040
        # the averages the text quotes: river-money 0.73, river-river 0.89, money-money 0.77
        np.testing.assert_allclose([across, river, money], [0.73, 0.89, 0.77], atol=0.01)


def test_claim_02_attention_reading_only_its_own_position_removes_context(minilm, six):
    from selfattn.experiments.context import run_reading_only_itself

    bank = minilm.token_id("bank")
    control = run_reading_only_itself(minilm, SIX)
    pos = word_positions(control.batch.input_ids, bank)
    assert pos == [4] * 6
    T = control.batch.input_ids.shape[1]
    for w in control.weights:  # the intervention: every head of every layer reads only its own position
        torch.testing.assert_close(w, torch.eye(T).expand_as(w), rtol=0, atol=0)
    v_control = word_vectors_by_layer(control.hidden_states, pos)  # (L + 1, 6, D)
    assert torch.isfinite(v_control).all()
    for layer in range(v_control.shape[0]):  # the same vector in all six sentences, at every layer
        torch.testing.assert_close(v_control[layer], v_control[layer][:1].expand(6, -1), rtol=0, atol=1e-6)
    # ... and in a sentence run on its own (other batch, other padding): nothing else reads across positions
    alone = run_reading_only_itself(minilm, SIX[1])
    torch.testing.assert_close(alone.hidden_states[-1][0, 4], v_control[-1][0], rtol=0, atol=1e-5)
    # the intervention changed only the attention: at layer 0 (before any attention) the vectors are the model's
    *_, v_model, _ = six
    torch.testing.assert_close(v_control[0], v_model[0], rtol=0, atol=0)
    # with attention, the six vectors differ from the first layer on (measured: at least 1.2 per layer)
    for layer in range(1, v_model.shape[0]):
        assert float((v_model[layer] - v_model[layer][:1]).abs().max()) > 0.5, layer
