"""Ring attention and all-to-all (Ulysses) attention on 2 and 4 real gloo processes equal
single-process attention (``selfattn.scaled_dot_product_attention`` with the full mask, float64
autograd): outputs and dq, dk, dv to 1e-12, causal and not, both layouts, with padding masks; float32,
float16 and bfloat16 to their rounding; NaN or inf stored where the mask hides it reaches nothing it
may not; the bytes each rank sends equal the formulas, written out here, both as the module counts them
and as torch.distributed's wrapped send and all-to-all functions saw them; bad shards get clear errors.

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
    """One spawn for all: the cases (with the bytes counted at torch.distributed's entry points), the error messages, the rank
    (results must come back in rank order) and, with 4 processes, ring and all-to-all attention inside
    the subgroup of ranks 1-3."""
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
HALF = [dict(c, dtype=dt) for dt in (torch.float16, torch.bfloat16)
        for c in _cases(16, [("ring", "zigzag", True, True), ("ulysses", "zigzag", True, True),
                             ("ring", "contiguous", False, False)])]
NAN, INF = float("nan"), float("inf")
# Non-finite values at positions the mask hides from some pairs (T = 16): padded keys and values
# (position 0 and T - 1, hidden from every query), keys/values/queries the causal mask hides from others.
NONFINITE = [dict(c, nonfinite=bad, **extra) for bad, combo, extra in [
    ([("k", 0, NAN), ("v", 15, NAN)], (True, True), {}),
    ([("k", 0, NAN), ("v", 15, NAN)], (True, True), {"dtype": torch.float32}),
    ([("k", 0, INF), ("v", 14, -INF)], (False, True), {}),
    ([("k", 11, NAN), ("v", 13, INF)], (True, False), {}),
    ([("q", 5, NAN), ("k", 14, -INF)], (True, False), {}),
] for m in ("ring", "ulysses") for c in _cases(16, [(m, "zigzag", *combo)])]
RUNS = {2: _cases(16, ALL) + FLOAT32 + HALF + NONFINITE, 4: _cases(32, FOUR)}


@pytest.fixture(scope="module")
def results():
    return {P: run_distributed(cases_and_errors, P, RUNS[P], timeout=120) for P in (2, 4)}


def _reference(case, rounded_to=None):
    """Single-process attention over the whole sequence with the full mask, float64 autograd; with
    ``rounded_to``, on the inputs rounded to that dtype (what the processes got), then float64."""
    q, k, v, dout, kpm = make_inputs(dict(case, nonfinite=()))  # the clean inputs
    if rounded_to is not None:
        q, k, v, dout = (x.to(rounded_to).double() for x in (q, k, v, dout))
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
            + (f"-{str(c['dtype'])[6:]}" if "dtype" in c else "")
            + ("-" + "-".join(f"{n}{p}{v}" for n, p, v in c["nonfinite"]) if "nonfinite" in c else "")
            for P in (2, 4) for c in RUNS[P]]


def _full_mask(case):
    """The (B, T, T) keep-mask of a case: causal and key padding."""
    T = case["T"]
    keep = torch.ones(case["B"], T, T, dtype=torch.bool)
    if case["causal"]:
        keep &= torch.ones(T, T, dtype=torch.bool).tril()
    _, _, _, _, kpm = make_inputs(dict(case, nonfinite=()))
    if kpm is not None:
        keep &= kpm[:, None, :]
    return keep


def _unreached(case):
    """(rows, keys), (B, T) bool each: the query rows whose out and dq, and the keys whose dk and dv,
    the case's non-finite entries may not reach. A bad key or value at j reaches the rows that see j;
    a bad query at i reaches row i if it sees any key; the keys those rows see may get it through dS."""
    keep = _full_mask(case)  # (B, T, T)
    reached = torch.zeros(keep.shape[:2], dtype=torch.bool)  # (B, T): rows that see a bad entry
    for name, position, _ in case["nonfinite"]:
        if name == "q":
            reached[:, position] |= keep[:, position].any(dim=-1)
        else:
            reached |= keep[:, :, position]
    keys = (keep & reached[:, :, None]).any(dim=1)  # (B, T): keys a reached row sees
    return ~reached, ~keys


PLAIN = [(P, i) for P in (2, 4) for i, c in enumerate(RUNS[P]) if "nonfinite" not in c]


@pytest.mark.parametrize("P, index", PLAIN, ids=[_ids()[(0 if P == 2 else len(RUNS[2])) + i] for P, i in PLAIN])
def test_output_and_gradients_equal_single_process_attention(results, P, index):
    case = RUNS[P][index]
    dtype = case.get("dtype", torch.float64)
    if dtype in (torch.float16, torch.bfloat16):
        # against float64 autograd on the same (rounded) inputs: the package computes in float32 and
        # rounds each result once (eps/2 of its size), and the backward reads the rounded output in
        # rowsum(dO * O); measured up to 0.65 eps x max|entry| (float16 dk); allow 2 eps x max|entry|
        want = _reference(dict(case, dtype=torch.float64), rounded_to=dtype)
    else:
        want = _reference(dict(case, dtype=torch.float64))  # float32 cases: against float64, to float32 rounding
    for name in ("out", "dq", "dk", "dv"):
        got = unshard_sequence([results[P][r][0][index][name] for r in range(P)], case["layout"])
        assert got.dtype == dtype and torch.isfinite(got).all()
        if dtype in (torch.float16, torch.bfloat16):
            atol = 2 * torch.finfo(dtype).eps * want[name].abs().max().item()
        else:
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
        acc = block * 4 // e if e == 2 else block  # half inputs: dK, dV travel in float32
        want = {"forward": (P - 1) * (2 * block + mask), "backward": (P - 1) * (2 * block + mask) + P * 2 * acc}
    else:  # four all-to-alls each way, (P - 1)/P of each tensor leaves; the mask goes to P - 1 ranks
        want = {"forward": 4 * (P - 1) * block // P + (P - 1) * mask, "backward": 4 * (P - 1) * block // P}
    for r in range(P):
        traffic = results[P][r][0][index]["traffic"]
        assert traffic["bytes_sent"] == want, f"rank {r}"
        for phase in ("forward", "backward"):  # the per-step records add up to the totals
            assert sum(s["bytes_sent"] for s in traffic["steps"] if s["phase"] == phase) == want[phase]
            # counted independently: the tensors handed to torch.distributed's send and all-to-all functions
            assert results[P][r][0][index]["wire"][phase][0] == want[phase], f"rank {r} {phase} on the wire"
    for phase in ("forward", "backward"):  # what all ranks sent, all ranks received
        assert (sum(results[P][r][0][index]["wire"][phase][0] for r in range(P))
                == sum(results[P][r][0][index]["wire"][phase][1] for r in range(P)))


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


NONFINITE_RUNS = [i for i, c in enumerate(RUNS[2]) if "nonfinite" in c]


@pytest.mark.parametrize("index", NONFINITE_RUNS, ids=[_ids()[i] for i in NONFINITE_RUNS])
def test_a_nonfinite_value_the_mask_hides_reaches_no_output_or_gradient(results, index):
    """House rule (DESIGN.md): NaN or inf stored where the mask hides it reaches no output row or
    gradient that cannot see it; those entries are finite and equal the clean inputs' reference."""
    case = RUNS[2][index]
    want = _reference(dict(case, dtype=torch.float64))  # clean inputs, float64 autograd
    rows, keys = _unreached(case)  # (B, T) each
    assert rows.any()  # each case leaves rows to compare (a causally seen bad key reaches every key through dS)
    atol = 1e-12 if case.get("dtype", torch.float64) == torch.float64 else 1e-5
    for name, where in (("out", rows), ("dq", rows), ("dk", keys), ("dv", keys)):
        got = unshard_sequence([results[2][r][0][index][name] for r in range(2)], case["layout"])
        got, ref = got.double().permute(0, 2, 1, 3)[where], want[name].permute(0, 2, 1, 3)[where]  # (positions, H, Dh)
        assert torch.isfinite(got).all(), f"{name}: non-finite at a position the bad entries cannot reach"
        torch.testing.assert_close(got, ref, rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_the_wire_count_restores_torch_distributed_on_exit():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from selfattn.distributed.wire import WireCount

    before = (dist.isend, dist.batch_isend_irecv, dist.all_to_all, c10d.isend)
    with WireCount():
        assert dist.isend is c10d.isend and dist.isend is not before[0]  # wrapped, the same in both modules
    assert (dist.isend, dist.batch_isend_irecv, dist.all_to_all, c10d.isend) == before
