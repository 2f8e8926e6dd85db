"""The two-lookup task (chapter 06): its data, its model's shapes and errors, its determinism."""

from __future__ import annotations

import pytest
import torch

from selfattn.experiments.two_lookups import (
    TwoLookupConfig,
    TwoLookupModel,
    sample_two_lookups,
    train_two_lookups,
)


def test_sampled_targets_are_the_values_under_keys_0_and_1():
    c = TwoLookupConfig(n_items=5, n_values=7)
    keys, values, a, b = sample_two_lookups(c, 200, torch.Generator().manual_seed(0))
    assert keys.shape == values.shape == (200, 5) and a.shape == b.shape == (200,)
    assert torch.equal(keys.sort(dim=1).values, torch.arange(5).expand(200, 5))  # a permutation per row
    assert int(values.min()) >= 0 and int(values.max()) < 7
    for row in range(200):  # the answers, found by a plain loop
        keys_row = keys[row].tolist()
        assert a[row] == values[row, keys_row.index(0)] and b[row] == values[row, keys_row.index(1)]


@pytest.mark.parametrize("n_heads", [1, 2, 4])
def test_model_shapes_and_equal_parameter_counts(n_heads):
    c = TwoLookupConfig()
    torch.manual_seed(0)
    model = TwoLookupModel(c, n_heads)
    keys, values, _, _ = sample_two_lookups(c, 3, torch.Generator().manual_seed(1))
    (logits_a, logits_b), weights = model(keys, values, return_weights=True)
    assert logits_a.shape == logits_b.shape == (3, c.n_values)
    assert weights.shape == (3, n_heads, 1, c.n_items)
    assert torch.isfinite(logits_a).all() and torch.isfinite(logits_b).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, n_heads, 1))
    reference = TwoLookupModel(c, 1)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())


def test_model_refuses_wrong_shapes_and_head_counts():
    c = TwoLookupConfig()
    model = TwoLookupModel(c, 2)
    with pytest.raises(ValueError, match="n_items"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="keys"):
        model(torch.zeros(2, 3, 4, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        TwoLookupModel(c, 3)


@pytest.mark.parametrize("kwargs", [{"n_items": 1}, {"n_values": 1}, {"lr": 0.0}, {"steps": 0}])
def test_config_refuses_bad_sizes(kwargs):
    with pytest.raises((ValueError, TypeError)):
        TwoLookupConfig(**kwargs)


def test_training_is_deterministic_and_restores_the_thread_count():
    c = TwoLookupConfig(steps=5, n_eval=64)
    threads = torch.get_num_threads()
    first, second = train_two_lookups(2, c, seed=3), train_two_lookups(2, c, seed=3)
    assert torch.get_num_threads() == threads
    assert first.losses == second.losses and first.accuracy == second.accuracy
    assert len(first.losses) == 5 and first.losses != train_two_lookups(2, c, seed=4).losses
