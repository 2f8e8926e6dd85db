"""Chapter 12's exercise checks (selfattn.exercises.ch12): the solutions pass, the usual mistakes
get the right words, stubs count as not attempted."""

from __future__ import annotations

import torch

from selfattn.exercises import ch12


def all_to_all(shards, rank, *, strided=False, reverse=False):
    P = len(shards)
    h = shards[0].shape[1] // P
    heads = slice(rank, None, P) if strided else slice(rank * h, (rank + 1) * h)
    pieces = [x[:, heads] for x in shards]
    return torch.cat(pieces[::-1] if reverse else pieces, dim=2)  # (B, H / P, T, Dh)


def unshard_zigzag(shards, *, late_in_rank_order=False):
    c = shards[0].shape[2] // 2
    late = [x[:, :, c:] for x in shards]
    return torch.cat([x[:, :, :c] for x in shards] + (late if late_in_rank_order else late[::-1]), dim=2)


def zigzag_positions(T, P, rank):
    c = T // (2 * P)
    late = 2 * P - 1 - rank
    return list(range(rank * c, (rank + 1) * c)) + list(range(late * c, (late + 1) * c))


def test_solutions_pass():
    assert ch12.check_all_to_all(all_to_all)
    assert ch12.check_unshard_zigzag(unshard_zigzag)
    assert ch12.check_zigzag_positions(zigzag_positions)
    assert ch12.check_zigzag_positions(lambda T, P, r: torch.tensor(zigzag_positions(T, P, r)).flip(0))  # any order, a tensor


def test_stubs_are_not_attempted():
    def stub(*args):
        pass

    def raises(*args):
        raise NotImplementedError

    for check in (ch12.check_all_to_all, ch12.check_zigzag_positions, ch12.check_ring_loop, ch12.check_unshard_zigzag):
        for fn in (stub, raises):
            feedback = check(fn)
            assert not feedback and "not attempted" in str(feedback).lower()


def test_the_usual_mistakes_are_named():
    def msg(check, fn):
        feedback = check(fn)
        assert not feedback
        return str(feedback)

    a2a = ch12.check_all_to_all
    assert "strided" in msg(a2a, lambda shards, r: all_to_all(shards, r, strided=True))
    assert "reverse order: concatenate" in msg(a2a, lambda shards, r: all_to_all(shards, r, reverse=True))
    assert "heads come out in reverse" in msg(a2a, lambda shards, r: all_to_all(shards, r).flip(1))
    assert "kept every head" in msg(a2a, lambda shards, r: torch.cat(shards, dim=2))
    assert "only this rank's own positions" in msg(a2a, lambda shards, r: shards[r][:, : shards[r].shape[1] // len(shards)])
    assert "along the heads" in msg(a2a, lambda shards, r: torch.cat([x[:, :2] for x in shards], dim=1))
    assert "wrong values" in msg(a2a, lambda shards, r: all_to_all(shards, r) + 1)
    un = ch12.check_unshard_zigzag
    assert "as they are" in msg(un, lambda shards: torch.cat(shards, dim=2))
    assert "reverse rank order" in msg(un, lambda shards: unshard_zigzag(shards, late_in_rank_order=True))
    assert "comes out reversed" in msg(un, lambda shards: unshard_zigzag(shards).flip(2))
    assert "should have shape" in msg(un, lambda shards: shards[0])
    zig = ch12.check_zigzag_positions
    assert "2P-1-r" in msg(zig, lambda T, P, r: zigzag_positions(T, P, r)[:T // (2 * P)]
                           + list(range((P - 1 - r) * (T // (2 * P)), (P - r) * (T // (2 * P)))))
    assert "striping" in msg(zig, lambda T, P, r: list(range(r, T, P)))
    assert "contiguous layout" in msg(zig, lambda T, P, r: list(range(r * T // P, (r + 1) * T // P)))
    assert "list of ints" in msg(zig, lambda T, P, r: "zigzag")


def ring_loop(rank, P, q, k, v, send_recv, *, direction=-1, mask=True, skip=True, rescale=True, hops=None,
              send_own=False):
    import numpy as np

    c = q.shape[0]
    own_k, own_v = k, v
    m, l, acc = np.full(c, -np.inf), np.zeros(c), np.zeros((c, v.shape[1]))
    for step in range(P):
        src = (rank + direction * step) % P  # whose block this rank holds now
        if not (skip and src > rank):
            s = q @ k.T / np.sqrt(q.shape[1])
            if mask and src == rank:
                s = np.where(np.tril(np.ones((c, c), bool)), s, -np.inf)
            m_new = np.maximum(m, s.max(-1))
            p = np.exp(s - m_new[:, None])
            corr = np.exp(m - m_new) if rescale else 1.0
            l, acc, m = l * corr + p.sum(-1), acc * np.atleast_1d(corr)[:, None] + p @ v, m_new
        if step < (P - 1 if hops is None else hops):
            k, v = send_recv(own_k, own_v) if send_own else send_recv(k, v)
    return acc / l[:, None]


def test_ring_loop_solution_passes_and_mistakes_are_named():
    assert ch12.check_ring_loop(ring_loop)
    cases = (
        (dict(direction=1), "(rank - s) % P"),
        (dict(mask=False), "needs the causal mask"),
        (dict(skip=False), "blocks of later positions"),
        (dict(rescale=False), "exp(m_old - m_new)"),
        (dict(hops=4), "called send_recv 4 times"),
        (dict(hops=2), "called send_recv 2 times"),
        (dict(send_own=True), "sent a block other than the one you hold"),
    )
    for kwargs, words in cases:
        fb = ch12.check_ring_loop(lambda *a, kw=kwargs: ring_loop(*a, **kw))
        assert not fb.ok and words in fb.message, (kwargs, fb.message)
    fb = ch12.check_ring_loop(lambda *a: ring_loop(*a)[:, :1])
    assert not fb.ok and "should have shape" in fb.message
    fb = ch12.check_ring_loop(lambda *a: ring_loop(*a) * float("nan"))
    assert not fb.ok and "NaN" in fb.message
