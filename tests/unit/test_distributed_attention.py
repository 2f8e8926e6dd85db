"""Ring attention and all-to-all (Ulysses) attention on 2 and 4 real gloo processes equal
single-process attention (``selfattn.scaled_dot_product_attention`` with the full mask, float64
autograd): outputs and dq, dk, dv to 1e-12, causal and not, both layouts, with padding masks; the bytes
each rank sends equal the formulas, written out here; bad shards get clear errors.

One process group per world size (module-scoped fixtures): every case runs inside one spawn."""

from __future__ import annotations

import itertools

import pytest
import torch

import selfattn
from selfattn.distributed import run_distributed, unshard_sequence
from selfattn.distributed.workers import (
    attention_cases,
    bad_input_messages,
    make_inputs,
    subgroup_ring,
)

H, DH = 4, 8


SUBGROUP_CASE = {"layout": "zigzag", "causal": True, "padding": True, "B": 2, "H": 6, "T": 24, "Dh": 8, "seed": 5}


def cases_and_errors(rank, world_size, cases):
    """One spawn for all: the cases, the error messages, the rank (results must come back in rank order)
    and, with 4 processes, ring and all-to-all attention inside the subgroup of ranks 1-3."""
    sub = subgroup_ring(rank, world_size, SUBGROUP_CASE) if world_size == 4 else None
    return attention_cases(rank, world_size, cases), bad_input_messages(rank, world_size), rank, sub


def _cases(T, combos):
    return [{"method": m, "layout": lay, "causal": c, "padding": p, "B": 2 if p else 1, "H": H, "T": T, "Dh": DH,
             "seed": 7} for m, lay, c, p in combos]


ALL = list(itertools.product(("ring", "ulysses"), ("contiguous", "zigzag"), (False, True), (False, True)))
FOUR = [("ring", "contiguous", True, False), ("ring", "zigzag", True, False), ("ring", "contiguous", True, True),
        ("ring", "zigzag", True, True), ("ring", "zigzag", False, True), ("ulysses", "zigzag", True, True),
        ("ulysses", "contiguous", False, True), ("ulysses", "contiguous", True, False)]
FLOAT32 = [dict(c, dtype=torch.float32) for c in _cases(16, [("ring", "zigzag", True, True), ("ulysses", "zigzag", True, True)])]
RUNS = {2: _cases(16, ALL) + FLOAT32, 4: _cases(32, FOUR)}


@pytest.fixture(scope="module")
def results():
    return {P: run_distributed(cases_and_errors, P, RUNS[P], timeout=120) for P in (2, 4)}


def _reference(case):
    """Single-process attention over the whole sequence with the full mask, float64 autograd."""
    q, k, v, dout, kpm = make_inputs(case)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    T = case["T"]
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None] if case["causal"] else None  # (1, 1, T, T)
    if kpm is not None:
        mask = kpm[:, None, None, :] if mask is None else mask & kpm[:, None, None, :]
    out = selfattn.scaled_dot_product_attention(q, k, v, mask)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _ids():
    return [f"P{P}-" + "-".join(str(c[k]) for k in ("method", "layout", "causal", "padding"))
            + ("-float32" if "dtype" in c else "") for P in (2, 4) for c in RUNS[P]]


@pytest.mark.parametrize("P, index", [(P, i) for P in (2, 4) for i in range(len(RUNS[P]))], ids=_ids())
def test_output_and_gradients_equal_single_process_attention(results, P, index):
    case = RUNS[P][index]
    want = _reference(dict(case, dtype=torch.float64))  # float32 cases: against float64, to float32 rounding
    dtype = case.get("dtype", torch.float64)
    for name in ("out", "dq", "dk", "dv"):
        got = unshard_sequence([results[P][r][0][index][name] for r in range(P)], case["layout"])
        assert got.dtype == dtype and torch.isfinite(got).all()
        atol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(got.double(), want[name], rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    if case["padding"] and case["causal"]:  # query 0 sees only key 0, which is padding: a zero row, zero dq
        got = unshard_sequence([results[P][r][0][index]["out"] for r in range(P)], case["layout"])
        assert torch.equal(got[:, :, 0], torch.zeros_like(got[:, :, 0])) and torch.equal(got[1], torch.zeros_like(got[1]))


@pytest.mark.parametrize("P, index", [(P, i) for P in (2, 4) for i in range(len(RUNS[P]))], ids=_ids())
def test_bytes_sent_per_rank_equal_the_formula(results, P, index):
    case = RUNS[P][index]
    B, T, e = case["B"], case["T"], case.get("dtype", torch.float64).itemsize
    n = T // P
    block = B * H * n * DH * e  # one of K, V, dK, dV on one rank
    mask = B * n if case["padding"] else 0  # one byte per position of the key-padding shard
    if case["method"] == "ring":  # K, V (and the mask) P - 1 hops; backward adds dK, dV for P hops
        want = {"forward": (P - 1) * (2 * block + mask), "backward": (P - 1) * (2 * block + mask) + P * 2 * block}
    else:  # four all-to-alls each way, (P - 1)/P of each tensor leaves; the mask goes to P - 1 ranks
        want = {"forward": 4 * (P - 1) * block // P + (P - 1) * mask, "backward": 4 * (P - 1) * block // P}
    for r in range(P):
        traffic = results[P][r][0][index]["traffic"]
        assert traffic["bytes_sent"] == want, f"rank {r}"
        for phase in ("forward", "backward"):  # the per-step records add up to the totals
            assert sum(s["bytes_sent"] for s in traffic["steps"] if s["phase"] == phase) == want[phase]


@pytest.mark.parametrize("P", [2, 4])
def test_the_ring_computes_each_visible_pair_once_and_skips_hidden_blocks(results, P):
    for index, case in enumerate(RUNS[P]):
        if case["method"] != "ring" or case["padding"] or not case["causal"]:
            continue
        T = case["T"]
        for r in range(P):
            steps = [s for s in results[P][r][0][index]["traffic"]["steps"] if s["phase"] == "forward"]
            assert len(steps) == P
            positions = selfattn.distributed.shard_positions(T, P, case["layout"], r)
            assert sum(s["pairs"] for s in steps) == sum(int(i) + 1 for i in positions)  # query i sees i + 1 keys
            computed = sum(s["pairs"] > 0 for s in steps)
            assert computed == (r + 1 if case["layout"] == "contiguous" else P)


def test_bad_shards_get_clear_errors_and_results_come_back_in_rank_order(results):
    for P in (2, 4):
        assert [res[2] for res in results[P]] == list(range(P))
        messages = results[P][0][1]
        assert f"T must be divisible by 2P={2 * P}; got T={3 * P}" in messages["zigzag odd shard"]
        assert messages["ulysses heads"].startswith("ValueError") and "H must be divisible by P; got H=3" in messages["ulysses heads"]
        assert "layout must be one of" in messages["bad layout"]
        assert "key_padding_mask must have shape (B, T/P) = (1, 3)" in messages["mask shape"]


def test_a_subgroup_addresses_its_neighbours_by_group_rank(results):
    """Ranks 1-3 of 4 form a group of 3: group rank r is global rank r + 1."""
    assert results[4][0][3] == {}  # rank 0 is not in the group
    want = _reference(SUBGROUP_CASE)
    for method in ("ring", "ulysses"):
        for name in ("out", "dq", "dk", "dv"):
            got = unshard_sequence([results[4][r][3][method][name] for r in (1, 2, 3)], "zigzag")
            torch.testing.assert_close(got, want[name], rtol=0, atol=1e-12, msg=lambda m, n=name, a=method: f"{a} {n}: {m}")


def test_outside_a_process_group_the_error_says_how_to_start_one():
    x = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised.*run_distributed"):
        selfattn.distributed.ring_attention(x, x, x)
    with pytest.raises(RuntimeError, match="not initialised"):
        selfattn.distributed.ulysses_attention(x, x, x)
