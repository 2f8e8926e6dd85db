"""The checks of chapter 08 accept correct solutions and name each classic mistake.

The learner's solutions here are written out independently (loops and NumPy), not calls of the
package function the check compares with, except where noted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import selfattn
from selfattn import positions as P
from selfattn.exercises import ch08

# --- 8.1 RoPE, interleaved ------------------------------------------------------------------------


def _rope(x, positions, base, *, layout="interleaved", sign=1.0, exponent=lambda i, Dh: -2 * i / Dh, values_dtype=None):
    """A learner's RoPE written with a loop over pairs; the keyword arguments make the classic mistakes."""
    x = x.clone() if values_dtype is None else x.to(values_dtype)
    T, Dh = x.shape
    out = x.clone()
    pos = torch.as_tensor(positions).to(x.dtype)
    for i in range(Dh // 2):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + Dh // 2)
        t = sign * pos * base ** exponent(i, Dh)
        out[:, a] = x[:, a] * torch.cos(t) - x[:, b] * torch.sin(t)
        out[:, b] = x[:, a] * torch.sin(t) + x[:, b] * torch.cos(t)
    return out


def test_apply_rope_solutions_pass():
    assert ch08.check_apply_rope(_rope)
    assert ch08.check_apply_rope(lambda x, p, base: _rope(x, p, base, values_dtype=torch.float32))  # float32 is fine
    assert ch08.check_apply_rope(lambda x, p, base: P.apply_rope(x, p, base=base, layout="interleaved"))
    fb = ch08.check_apply_rope(_rope)
    assert "apply_rope" in fb.message and fb.attempted


def test_apply_rope_stubs_are_not_attempted():
    def raises(x, positions, base):
        raise NotImplementedError

    def empty(x, positions, base):
        """Your code here."""

    def dots(x, positions, base): ...

    for stub in (raises, empty, dots):
        fb = ch08.check_apply_rope(stub)
        assert not fb and not fb.attempted, stub.__name__


def test_a_body_that_forgets_return_is_told_so():
    def forgot(x, positions, base):
        _rope(x, positions, base)

    fb = ch08.check_apply_rope(forgot)
    assert not fb and fb.attempted and "forget `return`" in fb.message


@pytest.mark.parametrize(
    ("mistake", "words"),
    [
        (lambda x, p, b: _rope(x, p, b, layout="half"), "half layout"),
        (lambda x, p, b: _rope(x, p, b, sign=-1.0), "wrong way"),
        (lambda x, p, b: _rope(x, p, b, exponent=lambda i, Dh: 2 * i / Dh), "frequencies grow with i"),
        (lambda x, p, b: _rope(x, p, b, exponent=lambda i, Dh: -i / Dh), "Using i instead of 2i"),
        (lambda x, p, b: _rope(x, p, b, exponent=lambda i, Dh: -2 * (i + 1) / Dh), "off by one"),
        (lambda x, p, b: x.clone(), "as if every row sat at position 0"),
        (lambda x, p, b: _rope(x, torch.zeros(len(p)), b), "as if every row sat at position 0"),
        (lambda x, p, b: _rope(x, torch.arange(len(p)), b), "ignoring the positions argument"),
    ],
    ids=["half", "direction", "plus-exponent", "i-not-2i", "from-1", "unchanged", "all-at-0", "arange"],
)
def test_apply_rope_names_each_classic_mistake(mistake, words):
    fb = ch08.check_apply_rope(mistake)
    assert not fb and fb.attempted
    assert words in fb.message, fb.message


def test_apply_rope_other_errors_are_reported_not_raised():
    fb = ch08.check_apply_rope(lambda x, p, b: _rope(x, p, b)[:, :-1])
    assert not fb and "shape" in fb.message
    fb = ch08.check_apply_rope(lambda x, p, b: _rope(x, p, b) * float("nan"))
    assert not fb and "NaN" in fb.message
    fb = ch08.check_apply_rope(lambda x, p, b: _rope(x, p, b) + 0.5)
    assert not fb and "wrong values" in fb.message
    fb = ch08.check_apply_rope(lambda x, p, b: 1 / 0)
    assert not fb and "ZeroDivisionError" in fb.message


def test_apply_rope_frequency_bug_is_located_by_pair():
    # Pair 0 right, the others with a made-up frequency: the check says where to look.
    fb = ch08.check_apply_rope(lambda x, p, b: _rope(x, p, b, exponent=lambda i, Dh: -3 * i / Dh))
    assert not fb and "Pair 0 is right but pairs [1, 2, 3] are not" in fb.message


# --- 8.2 ALiBi slopes -----------------------------------------------------------------------------


def _slopes(H):
    """The paper's recipe, written out."""
    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    n = 1
    while 2 * n <= H:
        n *= 2
    return geometric(n) + geometric(2 * n)[0::2][: H - n]


def test_alibi_slopes_solutions_pass():
    assert ch08.check_alibi_slopes(_slopes)
    assert ch08.check_alibi_slopes(lambda H: torch.tensor(_slopes(H), dtype=torch.float32))
    assert ch08.check_alibi_slopes(lambda H: np.array(_slopes(H)))


def test_alibi_slopes_stub_is_not_attempted():
    def stub(n_heads):
        raise NotImplementedError

    def empty(n_heads):
        pass

    for s in (stub, empty):
        fb = ch08.check_alibi_slopes(s)
        assert not fb and not fb.attempted


@pytest.mark.parametrize(
    ("mistake", "words"),
    [
        (lambda H: [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], "not a power of two, you used the geometric"),
        (lambda H: [2.0 ** (-8.0 * h / H) for h in range(H)], "first slope is 2^0 = 1"),
        (lambda H: [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)][::-1], "reverse order"),
        (lambda H: _slopes(H)[: H - (H - 2 ** int(math.log2(H)))] + [2.0 ** (-8.0 * (h + 1) / (2 * 2 ** int(math.log2(H))))
                                                                    for h in range(2 * 2 ** int(math.log2(H)))][1::2][: H - 2 ** int(math.log2(H))],
         "repeat the first ones"),
    ],
    ids=["geometric-for-all", "off-by-one", "reversed", "even-not-odd"],
)
def test_alibi_slopes_names_each_classic_mistake(mistake, words):
    fb = ch08.check_alibi_slopes(mistake)
    assert not fb and fb.attempted and words in fb.message, fb.message


def test_alibi_slopes_geometric_for_all_passes_powers_of_two_then_fails_on_12():
    fb = ch08.check_alibi_slopes(lambda H: [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    assert "H = 12" in fb.message and "8 slopes of the closest power of two below" in fb.message


def test_alibi_slopes_off_by_one_only_in_the_non_power_part():
    def bad(H):
        n = 2 ** int(math.log2(H))
        return [2.0 ** (-8.0 * h / n) for h in range(n)] + [2.0 ** (-8.0 * h / (2 * n)) for h in range(2 * n)][0::2][: H - n] \
            if n < H else _slopes(H)

    fb = ch08.check_alibi_slopes(bad)
    assert not fb and "off by one" in fb.message


def test_alibi_slopes_wrong_count_and_values():
    fb = ch08.check_alibi_slopes(lambda H: _slopes(H)[:-1] if H > 1 else _slopes(H))
    assert not fb and "shape (8,)" in fb.message
    fb = ch08.check_alibi_slopes(lambda H: [s * 1.1 for s in _slopes(H)])
    assert not fb and "wrong values" in fb.message


# --- 8.3 attention with RoPE ----------------------------------------------------------------------


def _attention(q, k, v, *, rope_q=True, rope_k=True, rope_v=False, layout="interleaved", causal=True, scale=True):
    T, Dh = q.shape
    p = torch.arange(T)
    rot = lambda x: _rope(x, p, 10000.0, layout=layout)  # noqa: E731
    q = rot(q) if rope_q else q
    k = rot(k) if rope_k else k
    v = rot(v) if rope_v else v
    scores = q @ k.T / (math.sqrt(Dh) if scale else 1.0)  # (T, Dh) @ (Dh, T) -> (T, T)
    if causal:
        scores = scores.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def test_rope_attention_solutions_pass():
    assert ch08.check_rope_attention(_attention)

    def with_package(q, k, v):
        rope = P.RotaryPositions(q.shape[-1], layout="interleaved")
        mask = selfattn.causal_mask(q.shape[0])
        return selfattn.scaled_dot_product_attention(rope.rotate(q[None, None]), rope.rotate(k[None, None]),
                                                     v[None, None], mask)[0, 0]

    assert ch08.check_rope_attention(with_package)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rope_v": True}, "rotated the values too"),
        ({"rope_k": False}, "queries but not the keys"),
        ({"rope_q": False}, "keys but not the queries"),
        ({"rope_q": False, "rope_k": False}, "RoPE was not applied"),
        ({"layout": "half"}, "half layout"),
        ({"causal": False}, "causal mask"),
        ({"scale": False}, "not scaled"),
    ],
    ids=["values", "only-q", "only-k", "none", "half", "no-mask", "no-scale"],
)
def test_rope_attention_names_each_classic_mistake(kwargs, words):
    fb = ch08.check_rope_attention(lambda q, k, v: _attention(q, k, v, **kwargs))
    assert not fb and fb.attempted and words in fb.message, fb.message


def test_rope_attention_stub_and_wrong_values():
    def stub(q, k, v):
        raise NotImplementedError

    assert not ch08.check_rope_attention(stub).attempted
    fb = ch08.check_rope_attention(lambda q, k, v: _attention(q, k, v) + 0.5)
    assert not fb and "wrong values" in fb.message


# --- 8.4 relative scores --------------------------------------------------------------------------


def _score(q, k, m, n, *, swap=False, exponent=lambda i, Dh: -2 * i / Dh, k_exponent=None):
    rq = _rope(q[None], [n if swap else m], 10000.0, exponent=exponent)[0]
    rk = _rope(k[None], [m if swap else n], 10000.0, exponent=k_exponent or exponent)[0]
    return float(rq @ rk)


def test_relative_score_solution_passes():
    fb = ch08.check_relative_score(_score)
    assert fb and "depends on m - n only" in fb.message
    assert ch08.check_relative_score(lambda q, k, m, n: torch.tensor(_score(q, k, m, n)))


def test_relative_score_names_the_mistakes():
    fb = ch08.check_relative_score(lambda q, k, m, n: float(q @ k))
    assert not fb and "as if both sat at position 0" in fb.message
    fb = ch08.check_relative_score(lambda q, k, m, n: _score(q, k, m, n, swap=True))
    assert not fb and "rotated q by n and k by m" in fb.message
    fb = ch08.check_relative_score(lambda q, k, m, n: torch.ones(2))
    assert not fb and "one number" in fb.message
    fb = ch08.check_relative_score(lambda q, k, m, n: _score(q, k, m, n) + 1.0)
    assert not fb and "should be" in fb.message


def test_relative_score_stub_is_not_attempted():
    def stub(q, k, m, n):
        ...

    assert not ch08.check_relative_score(stub).attempted


def test_relative_score_catches_a_score_that_moves_with_both_positions():
    # A cos/sin table of 32 positions, clipped past its end: right for short positions only.
    fb = ch08.check_relative_score(lambda q, k, m, n: _score(q, k, min(m, 31), min(n, 31)))
    assert not fb and "Shifting both positions changed your score" in fb.message


def test_rope_check_names_an_ignored_base_argument():
    """A solution that always uses base 10000 was told its frequencies were squared (10000^(-2i/d) is
    100^(-4i/d), and one case passes base 100): the ignored base is named first."""
    from selfattn import positions as P

    feedback = ch08.check_apply_rope(lambda x, p, base: P.apply_rope(x, p, layout="interleaved"))
    assert not feedback and "base 10000 instead of the base argument" in feedback.message
    assert "squared" not in feedback.message
