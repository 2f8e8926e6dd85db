"""Chapter 14's exercise checks: the reference solutions pass, typical mistakes get the right words."""

from __future__ import annotations

import torch

from selfattn.exercises import ch14


def next_token_distribution(logits, temperature):
    return torch.softmax(logits / temperature, dim=-1)


def append_to_cache(K_cache, V_cache, k_new, v_new):
    return torch.cat([K_cache, k_new], dim=-2), torch.cat([V_cache, v_new], dim=-2)


def test_reference_solutions_pass():
    assert ch14.check_next_token_distribution(next_token_distribution)
    assert ch14.check_append_to_cache(append_to_cache)


def test_not_attempted_is_not_a_failure():
    def stub(*args):
        raise NotImplementedError

    for check in (ch14.check_next_token_distribution, ch14.check_append_to_cache):
        feedback = check(stub)
        assert not feedback and not feedback.attempted


def test_next_token_distribution_mistakes():
    times = ch14.check_next_token_distribution(lambda x, t: torch.softmax(x * t, dim=-1))
    assert not times and "multiplied" in times.message
    raw = ch14.check_next_token_distribution(lambda x, t: x / t)
    assert not raw and "apply softmax" in raw.message
    axis = ch14.check_next_token_distribution(lambda x, t: torch.softmax(x / t, dim=0))
    assert not axis and "vocabulary" in axis.message


def test_append_to_cache_mistakes():
    only_new = ch14.check_append_to_cache(lambda K, V, k, v: (k, v))
    assert not only_new and "only the new position" in only_new.message
    reversed_order = ch14.check_append_to_cache(
        lambda K, V, k, v: (torch.cat([k, K], dim=-2), torch.cat([v, V], dim=-2))
    )
    assert not reversed_order and "comes first" in reversed_order.message
    swapped = ch14.check_append_to_cache(
        lambda K, V, k, v: (torch.cat([V, v], dim=-2), torch.cat([K, k], dim=-2))
    )
    assert not swapped and "values" in swapped.message
    single = ch14.check_append_to_cache(lambda K, V, k, v: torch.cat([K, k], dim=-2))
    assert not single and "pair" in single.message


def test_append_to_cache_wrong_values_are_named():
    stale = ch14.check_append_to_cache(
        lambda K, V, k, v: (torch.cat([K, k], dim=-2), torch.cat([V, V[..., :1, :]], dim=-2))
    )
    assert not stale and "V has the right shape but wrong values" in stale.message


def test_append_to_cache_accepts_a_list_pair():
    # the same rule as exercise 6.2: any 2-sequence (tuple or list) is a pair
    assert ch14.check_append_to_cache(lambda *args: list(append_to_cache(*args)))
