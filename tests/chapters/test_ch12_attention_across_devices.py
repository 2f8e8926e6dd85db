"""Claims of chapter 12 (attention across devices), against independent oracles.

Claim 32: ring attention over P processes equals single-device attention, forward and backward.
Claim 33: the bytes each process sends match the formula for ring and all-to-all attention (counted by
the module and, apart from it, at torch.distributed's send and all-to-all functions); a balanced layout
evens the causal work across processes (measured as the visible pairs each rank's ring computed).

The distributed checks run in one group of 4 gloo processes on 127.0.0.1 (a module fixture); the
oracle is one process: the NumPy float64 reference for the in-process merge, float64 autograd through
``selfattn.scaled_dot_product_attention`` with the full mask for the processes.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import selfattn
from selfattn import ref
from selfattn.distributed import run_distributed, shard_positions, unshard_sequence
from selfattn.distributed.workers import attention_cases, make_inputs
from selfattn.inference.split_kv import finalize, merge_partials, partial_attention

P, T, H, DH = 4, 32, 4, 8
CASES = [{"method": m, "layout": lay, "causal": c, "padding": pad, "B": 2 if pad else 1, "H": H, "T": T, "Dh": DH,
          "seed": 32}
         for m, lay, c, pad in [("ring", "contiguous", True, False), ("ring", "zigzag", True, False),
                                ("ring", "zigzag", True, True), ("ring", "contiguous", False, True),
                                ("ulysses", "zigzag", True, True), ("ulysses", "contiguous", False, False)]]


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(attention_cases, P, CASES, timeout=120)


def test_claim_32_p_partials_merged_in_ring_order_equal_full_attention():
    """The merge behind the ring, in one process: rank r meets blocks r, r-1, ..., as they arrive."""
    rng = np.random.default_rng(32)
    q, k, v = (rng.normal(size=(2, 24, 8)) for _ in range(3))  # (H, T, Dh), float64
    want = ref.scaled_dot_product_attention(q, k, v, ref.causal_mask(24))
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    for n_ranks in (2, 3, 4):
        for layout in ("contiguous", "zigzag"):
            pos = [shard_positions(24, n_ranks, layout, r) for r in range(n_ranks)]
            out = torch.empty_like(qt)
            for r in range(n_ranks):
                running = None
                for step in range(n_ranks):
                    s = (r - step) % n_ranks
                    keep = pos[r][:, None] >= pos[s][None, :]  # causal, positions in the whole sequence
                    part = partial_attention(qt[:, pos[r]], kt[:, pos[s]], vt[:, pos[s]], mask=keep)
                    running = part if running is None else merge_partials(running, part)
                out[:, pos[r]] = finalize(running)[0]
            np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-13)


def _reference(case):
    q, k, v, dout, kpm = make_inputs(case)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None] if case["causal"] else None  # (1, 1, T, T)
    if kpm is not None:
        mask = kpm[:, None, None, :] if mask is None else mask & kpm[:, None, None, :]
    out = selfattn.scaled_dot_product_attention(q, k, v, mask)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def test_claim_32_ring_attention_over_p_processes_equals_single_device_attention_forward_and_backward(ranks):
    for i, case in enumerate(CASES):
        want = _reference(case)
        for name in ("out", "dq", "dk", "dv"):
            got = unshard_sequence([rk[i][name] for rk in ranks], case["layout"])
            torch.testing.assert_close(got, want[name], rtol=0, atol=1e-12,
                                       msg=lambda m, n=name, c=case: f"{c['method']} {c['layout']} {n}: {m}")
        if case["padding"] and case["causal"]:  # query 0 sees only padding, batch row 1 sees nothing: zero rows
            out = unshard_sequence([rk[i]["out"] for rk in ranks], case["layout"])
            assert not out[0, :, 0].any() and not out[1].any() and out[0, :, 1].abs().sum() > 0


def test_claim_33_bytes_sent_match_the_formula_and_zigzag_balances_causal_work(ranks):
    n, e = T // P, 8  # positions per process, bytes per float64
    for i, case in enumerate(CASES):
        block = case["B"] * H * n * DH * e
        mask = case["B"] * n if case["padding"] else 0
        if case["method"] == "ring":  # (P - 1) x 2 x B H n Dh e forward; dK, dV add P hops backward
            want = {"forward": (P - 1) * (2 * block + mask), "backward": (P - 1) * (2 * block + mask) + P * 2 * block}
        else:  # 4 x (P - 1)/P x B H n Dh e each way
            want = {"forward": 4 * (P - 1) * block // P + (P - 1) * mask, "backward": 4 * (P - 1) * block // P}
        assert [rk[i]["traffic"]["bytes_sent"] for rk in ranks] == [want] * P, case
        # counted apart from the module: the tensors handed to torch.distributed's send and all-to-all functions
        assert [{ph: rk[i]["wire"][ph][0] for ph in want} for rk in ranks] == [want] * P, case
        for ph in want:  # what the ranks sent, the ranks received
            assert sum(rk[i]["wire"][ph][0] for rk in ranks) == sum(rk[i]["wire"][ph][1] for rk in ranks)
    assert {"forward": 3 * 2 * 2048, "backward": 3 * 2 * 2048 + 4 * 2 * 2048} == ranks[0][0]["traffic"]["bytes_sent"]
    measured = {}
    for i, case in enumerate(CASES[:2]):  # ring, causal, no padding: contiguous, then zigzag
        pairs = [sum(s["pairs"] for s in rk[i]["traffic"]["steps"] if s["phase"] == "forward") for rk in ranks]
        hand = [sum(int(p) + 1 for p in shard_positions(T, P, case["layout"], r)) for r in range(P)]  # i sees i + 1 keys
        assert pairs == hand and sum(pairs) == T * (T + 1) // 2
        measured[case["layout"]] = Fraction(max(pairs) * P, sum(pairs))
    assert measured["zigzag"] == 1
    assert measured["contiguous"] == Fraction(2 * T - n + 1, T + 1) == Fraction(57, 33)  # -> (2P - 1)/P = 7/4
