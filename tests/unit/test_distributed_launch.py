"""selfattn.distributed.run_distributed (results in rank order: test_distributed_attention.py): a rank that raises or dies mid-run, or a
run that never ends, fails with an error naming the rank and why, within the timeout, never a hang."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from selfattn.distributed import DistributedRunError, run_distributed
from selfattn.distributed.workers import die_after_first_ring


def rank_sum_or_raise(rank, world_size, bad_rank):
    """All-reduce the ranks; then rank ``bad_rank`` raises (the others return)."""
    import torch

    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    if rank == bad_rank:
        raise ArithmeticError(f"rank {rank} was told to fail")
    return rank, world_size, float(total)


def sleep_forever(rank, world_size):
    time.sleep(3600)


def test_a_raising_rank_is_named_with_its_traceback():
    with pytest.raises(DistributedRunError, match=r"rank 1 raised ArithmeticError: rank 1 was told to fail") as info:
        run_distributed(rank_sum_or_raise, 2, 1, timeout=60)  # rank 0 returns (1.0), rank 1 raises
    assert "Traceback" in str(info.value) and "rank_sum_or_raise" in str(info.value)


def test_a_rank_that_dies_mid_run_makes_the_launcher_fail_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(DistributedRunError, match=r"rank 1 died with exit code 1"):
        run_distributed(die_after_first_ring, 2, timeout=60)
    assert time.monotonic() - start < 60  # the hang timeout; the failure itself is noticed at once


def test_a_run_that_never_ends_is_stopped_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(DistributedRunError, match=r"timed out after 4 s waiting for rank\(s\) \[0, 1\]"):
        run_distributed(sleep_forever, 2, timeout=4)
    assert time.monotonic() - start < 30


def test_bad_arguments_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="world_size must be > 0"):
        run_distributed(sleep_forever, 0)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        run_distributed(sleep_forever, 2, timeout=0)
