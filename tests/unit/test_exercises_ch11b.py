"""Chapter 11b's exercise checks: the reference solutions pass, typical mistakes get the right words."""

import torch

from selfattn.exercises import ch11b


def test_mla_bytes_solution_passes_and_mistakes_are_named():
    assert ch11b.check_mla_bytes_per_token(lambda r, dr, H, L, b: (r + dr) * L * b)
    no_rope = ch11b.check_mla_bytes_per_token(lambda r, dr, H, L, b: r * L * b)
    assert not no_rope and "RoPE key" in no_rope.message
    per_head = ch11b.check_mla_bytes_per_token(lambda r, dr, H, L, b: (r + dr) * H * L * b)
    assert not per_head and "every head" in per_head.message
    doubled = ch11b.check_mla_bytes_per_token(lambda r, dr, H, L, b: 2 * (r + dr) * L * b)
    assert not doubled and "No factor 2" in doubled.message


def test_sliding_keep_solution_passes_and_off_by_one_is_named():
    def keep(T, w, extra=0):
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return (j <= i) & (j > i - w - extra)

    assert ch11b.check_sliding_keep(keep)
    wide = ch11b.check_sliding_keep(lambda T, w: keep(T, w, 1))
    assert not wide and "too many" in wide.message
    narrow = ch11b.check_sliding_keep(lambda T, w: keep(T, w, -1))
    assert not narrow and "too few" in narrow.message
    both_sides = ch11b.check_sliding_keep(lambda T, w: (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs() < w)
    assert not both_sides and "causal" in both_sides.message


def test_empty_stubs_are_not_attempted():
    def stub(*args):
        pass

    assert not ch11b.check_mla_bytes_per_token(stub).attempted
    assert not ch11b.check_sliding_keep(stub).attempted
