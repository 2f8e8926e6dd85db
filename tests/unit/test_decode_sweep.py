"""The roofline experiment of claim 25 (selfattn.inference.decode_timing): counted FLOPs and bytes of
one decode step, the sweep's structure, and the text that follows a sweep (never a conclusion from a
difference smaller than the repeats' spread). No timing is asserted."""

from __future__ import annotations

import math

import pytest

from selfattn.inference.decode_timing import (
    DecodeStepPoint,
    DecodeSweep,
    decode_step_counts,
    decode_sweep_text,
    time_decode_step_sweep,
)


def test_counts_by_hand():
    # 2 KV heads, group 4, batch 3, 10 positions, width 8: FLOPs 4 * 3 * 2 * 4 * 10 * 8 = 7680;
    # numbers: K and V 2 * 2 * 10 * 8 = 320, queries and outputs 2 * 3 * 2 * 4 * 8 = 384; float32: 4 bytes each
    assert decode_step_counts(2, 4, 3, 10, 8) == (7680, 4 * 704)
    assert decode_step_counts(2, 4, 3, 10, 8, bytes_per_number=2) == (7680, 2 * 704)


def test_intensity_rises_with_group_and_batch_on_the_same_cache():
    def intensity(G, B):
        flops, nbytes = decode_step_counts(8, G, B, 32768, 64)
        return flops / nbytes

    groups = [intensity(G, 1) for G in (1, 2, 4, 8)]
    batches = [intensity(8, B) for B in (1, 2, 4, 8, 16)]
    assert all(b > a for a, b in zip(groups, groups[1:], strict=False))
    assert all(b > a for a, b in zip(batches, batches[1:], strict=False))
    # by hand: 4 B G S Dh / (4 (2 S Dh + 2 B G Dh)) = B G S / (2 (S + B G)), about B G / 2 in float32
    assert groups[0] == pytest.approx(32768 / (2 * 32769), rel=1e-12)
    assert batches[-1] == pytest.approx(128 * 32768 / (2 * (32768 + 128)), rel=1e-12)
    # the bytes are the same cache: K and V dominate, whatever the group
    assert decode_step_counts(8, 8, 16, 32768, 64)[1] < 1.01 * decode_step_counts(8, 1, 1, 32768, 64)[1]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_counts_reject_bad_sizes(bad):
    with pytest.raises((TypeError, ValueError), match="group_size"):
        decode_step_counts(8, bad, 1, 16, 8)


def _point(G, B, seconds, spread=0.02):
    flops, nbytes = decode_step_counts(8, G, B, 32768, 64)
    return DecodeStepPoint(G, B, flops, nbytes, seconds, (seconds, seconds * (1 + spread)))


def _sweep(group_s, batch_s, overhead=1e-5, spread=0.02):
    groups = [_point(G, 1, s, spread) for G, s in zip((1, 2, 4, 8), group_s, strict=True)]
    batches = [groups[-1]] + [_point(8, B, s, spread) for B, s in zip((2, 4, 8, 16), batch_s, strict=True)]
    return DecodeSweep(groups, batches, overhead, 8, 32768, 64, 2)


def test_text_flat_time_is_memory_traffic():
    main, notes = decode_sweep_text(_sweep([0.010, 0.0101, 0.0102, 0.0103], [0.0104, 0.0105, 0.0106, 0.011]), 4.7)
    assert "memory traffic, not arithmetic" in main and "stayed nearly flat" in main
    assert "cannot tell" not in main and "spread" in notes


def test_text_per_operation_costs():
    main, _ = decode_sweep_text(_sweep([0.010] * 4, [0.010] * 4, overhead=0.008), 4.7)
    assert "per-operation costs dominate" in main


def test_text_never_concludes_from_a_difference_inside_the_noise():
    # 24 % more time, with repeats that spread by 40 %: the run cannot tell
    main, _ = decode_sweep_text(_sweep([0.010, 0.011, 0.0115, 0.0124], [0.0124] * 4, spread=0.4), 4.7)
    assert main.count("cannot tell") == 2, main
    assert "grew" not in main and "flat" not in main


def test_text_growth_below_the_balance_is_said():
    main, _ = decode_sweep_text(_sweep([0.018, 0.021, 0.030, 0.037], [0.046, 0.067, 0.14, 0.26]), 4.7,
                                gpu_balance=989e12 / 3.35e12)
    assert "not purely limited by memory traffic" in main
    assert "balance of 295" in main and "37 sequences" in main  # ceil(295.2 / 8)
    for paragraph in main.split("\n\n"):
        assert len(paragraph.split()) <= 120, paragraph


def test_text_rejects_bad_input():
    with pytest.raises(TypeError, match="DecodeSweep"):
        decode_sweep_text("sweep", 4.7)
    with pytest.raises(ValueError, match="balance"):
        decode_sweep_text(_sweep([0.01] * 4, [0.01] * 4), math.nan)


def test_sweep_structure_on_a_small_cache():
    sweep = time_decode_step_sweep((1, 2), (1, 3), n_kv_heads=2, context_len=64, d_head=8, repeats=2)
    assert [(p.group_size, p.batch) for p in sweep.groups] == [(1, 1), (2, 1)]
    assert [(p.group_size, p.batch) for p in sweep.batches] == [(2, 1), (2, 3)]
    for p in sweep.groups + sweep.batches:
        assert (p.flops, p.bytes) == decode_step_counts(2, p.group_size, p.batch, 64, 8)
        assert len(p.samples) == 2 and all(math.isfinite(s) and s > 0 for s in p.samples)
    assert math.isfinite(sweep.overhead_seconds) and sweep.overhead_seconds > 0


@pytest.mark.parametrize("kwargs, match", [({"group_sizes": (2, 1)}, "group_sizes"), ({"batches": (1,)}, "batches"),
                                           ({"context_len": 0}, "context_len"), ({"repeats": 0}, "repeats")])
def test_sweep_rejects_bad_sizes(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        time_decode_step_sweep(**kwargs)


def test_sweep_keeps_each_call_to_one_pass_over_the_cache():
    # PyTorch's CPU kernel reads K and V once per block of 32 queries: 8 x 4 = 32 queries per key/value
    # head is one pass (allowed), 8 x 8 = 64 would be two passes, which the counted bytes would miss
    with pytest.raises(ValueError, match="at most 32 queries"):
        time_decode_step_sweep((1, 8), (1, 8), n_kv_heads=1, context_len=16, d_head=4, repeats=1)
    sweep = time_decode_step_sweep((1, 8), (1, 4), n_kv_heads=1, context_len=16, d_head=4, repeats=1)
    assert max(p.group_size * p.batch for p in sweep.batches) == 32


def test_text_says_where_the_intensity_reaches_the_balance():
    # intensity ~ B G / 2: a balance of 4.7 is reached at about 9.4 queries; the first measured point is 16
    _, notes = decode_sweep_text(_sweep([0.010] * 4, [0.010] * 4), 4.7)
    assert "about 9.4 queries" in notes and "first measured point above it has 16" in notes
