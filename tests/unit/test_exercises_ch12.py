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
