"""run_reading_only_itself: every head's weights are the identity, and each position's vector is
what the model computes for that token and position alone."""

from __future__ import annotations

import pytest
import torch

from selfattn.experiments.context import run_reading_only_itself


def test_reading_only_itself_is_the_identity_intervention(minilm):
    run = run_reading_only_itself(minilm, "the bank")
    L, T = minilm.config.n_layers, run.batch.input_ids.shape[1]
    assert len(run.hidden_states) == L + 1 and len(run.weights) == L
    for w in run.weights:
        assert w.shape == (1, minilm.config.n_heads, T, T)
        torch.testing.assert_close(w, torch.eye(T).expand_as(w), rtol=0, atol=0)
    # each position computed alone (a sequence of one key needs no mask) gives the same vectors
    encoder = minilm.encoder()
    with torch.no_grad():
        x = encoder.embeddings(run.batch.input_ids)  # (1, T, D)
        for p in range(T):
            xp = x[:, p : p + 1]  # (1, 1, D): position p on its own
            for block in encoder.blocks:
                xp = block(xp)
            torch.testing.assert_close(run.hidden_states[-1][:, p : p + 1], xp, rtol=0, atol=1e-5)
    # positions are kept: the same token at two positions gets two different vectors
    two = run_reading_only_itself(minilm, "bank bank")
    assert not torch.allclose(two.hidden_states[-1][0, 1], two.hidden_states[-1][0, 2], atol=1e-3)


def test_reading_only_itself_refuses_bad_sentences(minilm):
    with pytest.raises(TypeError, match="sentences"):
        run_reading_only_itself(minilm, [1, 2])
