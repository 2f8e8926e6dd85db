"""Chapter 12's exercise checks (selfattn.exercises.ch12): the solutions pass, the usual mistakes
get the right words, stubs count as not attempted."""

from __future__ import annotations

import torch

from selfattn.exercises import ch12


def ring_forward_bytes(B, H, T, Dh, P, element_size, *, hops=None, tensors=2, length=None):
    return (P - 1 if hops is None else hops) * tensors * B * H * (T // P if length is None else length) * Dh * element_size


def zigzag_positions(T, P, rank):
    c = T // (2 * P)
    late = 2 * P - 1 - rank
    return list(range(rank * c, (rank + 1) * c)) + list(range(late * c, (late + 1) * c))


def test_solutions_pass():
    assert ch12.check_ring_forward_bytes(ring_forward_bytes)
    assert ch12.check_zigzag_positions(zigzag_positions)
    assert ch12.check_zigzag_positions(lambda T, P, r: torch.tensor(zigzag_positions(T, P, r)).flip(0))  # any order, a tensor


def test_stubs_are_not_attempted():
    def stub(*args):
        pass

    def raises(*args):
        raise NotImplementedError

    for check in (ch12.check_ring_forward_bytes, ch12.check_zigzag_positions):
        for fn in (stub, raises):
            feedback = check(fn)
            assert not feedback and "not attempted" in str(feedback).lower()


def test_the_usual_mistakes_are_named():
    def msg(check, fn):
        feedback = check(fn)
        assert not feedback
        return str(feedback)

    ring = ch12.check_ring_forward_bytes
    assert "P - 1 blocks arrive" in msg(ring, lambda B, H, T, Dh, P, e: ring_forward_bytes(B, H, T, Dh, P, e, hops=P))
    assert "both K and V" in msg(ring, lambda B, H, T, Dh, P, e: ring_forward_bytes(B, H, T, Dh, P, e, tensors=1))
    assert "not the whole sequence" in msg(ring, lambda B, H, T, Dh, P, e: ring_forward_bytes(B, H, T, Dh, P, e, length=T))
    assert "all-to-all formula" in msg(ring, lambda B, H, T, Dh, P, e: 4 * (P - 1) * B * H * (T // P) * Dh * e // P)
    assert "you returned 7" in msg(ring, lambda *a: 7)
    assert "one number of bytes" in msg(ring, lambda *a: [1])
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


def ring_work(T, P):
    c = T // P
    return [r * c * c + c * (c + 1) // 2 for r in range(P)]


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


def test_ring_work_solution_passes_and_mistakes_are_named():
    assert ch12.check_ring_work(ring_work)
    cases = (
        (lambda T, P: [(r + 1) * (T // P) ** 2 for r in range(P)], "diagonal block whole"),
        (lambda T, P: [r * (T // P) ** 2 + (T // P) * (T // P - 1) // 2 for r in range(P)], "Off by one"),
        (lambda T, P: [T * (T + 1) // 2 // P] * P, "even share"),
        (lambda T, P: ring_work(T, P)[::-1], "Reversed"),
        (lambda T, P: 5, "list of P"),
        (lambda T, P: [1] * P, "you returned"),
    )
    for fn, words in cases:
        fb = ch12.check_ring_work(fn)
        assert not fb.ok and words in fb.message, fb.message
    for check in (ch12.check_ring_loop, ch12.check_ring_work):
        def stub(*args):
            raise NotImplementedError

        assert not check(stub).attempted
