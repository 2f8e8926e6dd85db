"""The recall task's data are what its docstring says, and its config refuses bad sizes."""

from __future__ import annotations

import pytest
import torch

from selfattn.experiments.tying import RecallConfig, RecallModel, RecallTask, TiedRecallModel


def test_sampled_sequences_encode_pairs_and_the_answer():
    c = RecallConfig(n_keys=6, n_values=5, n_pairs=4)
    X, y = RecallTask(c).sample(64, torch.Generator().manual_seed(0))
    assert X.shape == (64, 5, 11) and y.shape == (64,)
    pairs, query = X[:, :-1], X[:, -1]
    torch.testing.assert_close(pairs[..., :6].sum(-1), torch.ones(64, 4))  # one key per pair
    torch.testing.assert_close(pairs[..., 6:].sum(-1), torch.ones(64, 4))  # one value per pair
    assert (pairs[..., :6].sum(1) <= 1).all()  # keys distinct within a sequence
    torch.testing.assert_close(query.sum(-1), torch.ones(64))
    assert (query[:, 6:] == 0).all()  # the query holds a key only
    match = (pairs[..., :6] * query[:, None, :6]).sum(-1).argmax(1)  # the pair whose key is asked for
    torch.testing.assert_close(pairs[torch.arange(64), match, 6:].argmax(-1), y)


def test_tied_model_reads_keys_as_values_and_starts_like_the_untied_one():
    c = RecallConfig()
    untied = RecallModel(c, generator=torch.Generator().manual_seed(1))
    tied = TiedRecallModel(c, generator=torch.Generator().manual_seed(1))
    X, _ = RecallTask(c).sample(3, torch.Generator().manual_seed(2))
    Q, K, V = tied.project(X)
    torch.testing.assert_close(V, K, rtol=0, atol=0)
    torch.testing.assert_close(tied.attn.W_K, untied.attn.W_K, rtol=0, atol=0)
    assert not tied.attn.W_V.requires_grad


@pytest.mark.parametrize("kwargs", [{"n_pairs": 20}, {"d_head": 0}, {"lr": 0.0}])
def test_config_refuses_bad_sizes(kwargs):
    with pytest.raises((ValueError, TypeError)):
        RecallConfig(**kwargs)
