"""Split-KV decoding (claim 27, second half): partials of key chunks merged in any order give full
attention. float64 throughout; equalities to 1e-12 (max abs diff), which fails on NaN
(``_max_diff`` asserts both sides are NaN-free first). The NumPy reference ``selfattn.ref`` is the
independent oracle; hypothesis settings come from the "selfattn" profile (tests/conftest.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from selfattn import causal_mask, ref
from selfattn import scaled_dot_product_attention as sdpa
from selfattn.efficient import tiled_attention
from selfattn.inference.split_kv import (
    Partial,
    chunk_boundaries,
    finalize,
    merge_partials,
    partial_attention,
    reduce_partials,
    split_kv_attention,
)

TOL = 1e-12
f64 = torch.float64


def _max_diff(a: torch.Tensor, b) -> float:
    b = torch.as_tensor(b, dtype=a.dtype)
    assert not torch.isnan(a).any() and not torch.isnan(b).any(), "a NaN where none may be"
    both_inf = torch.isinf(a) & (a == b)  # -inf log-sum-exp of a fully masked row on both sides
    return float(torch.where(both_inf, 0.0, (a - b).abs()).max())


def _qkv(seed, lead=(2, 3), T=1, S=23, Dh=8, Dv=5, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, T, Dh, generator=g, dtype=dtype), torch.randn(*lead, S, Dh, generator=g, dtype=dtype),
            torch.randn(*lead, S, Dv, generator=g, dtype=dtype))


def _lse(q, k, mask=None):
    """The log-sum-exp oracle, in NumPy (selfattn.ref.logsumexp of the masked scaled scores)."""
    scores = q.numpy() @ np.swapaxes(k.numpy(), -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(np.broadcast_to(mask.numpy(), scores.shape), scores, -np.inf)
    return ref.logsumexp(scores)


# --- one chunk ---------------------------------------------------------------------------------

def test_one_partial_finalized_is_attention_and_its_fields_are_what_they_say():
    q, k, v = _qkv(0, T=4)
    p = partial_attention(q, k, v)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(8))  # (2, 3, 4, 23), as the function scales
    assert p.m.shape == p.l.shape == (2, 3, 4) and p.acc.shape == (2, 3, 4, 5)
    assert torch.equal(p.m, scores.amax(-1))
    assert _max_diff(p.l, torch.exp(scores - p.m[..., None]).sum(-1)) <= TOL
    context, lse = finalize(p)
    assert _max_diff(context, ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())) <= TOL
    assert _max_diff(lse, _lse(q, k)) <= TOL


def test_a_chunk_that_a_row_cannot_see_gives_an_empty_partial_not_nan():
    q, k, v = _qkv(1, T=3, S=6)
    keep = torch.ones(3, 6, dtype=torch.bool)
    keep[1] = False
    v[..., 0, :] = float("nan")  # stored at a key that row 1 cannot see...
    keep[:, 0] = False  # ...nor any row
    p = partial_attention(q, k, v, mask=keep)
    assert torch.isneginf(p.m[..., 1]).all() and (p.l[..., 1] == 0).all() and (p.acc[..., 1, :] == 0).all()
    assert not torch.isnan(p.acc).any()
    context, lse = finalize(p)
    assert (context[..., 1, :] == 0).all() and torch.isneginf(lse[..., 1]).all()


# --- the merge ---------------------------------------------------------------------------------

finite = st.floats(-30, 30, allow_nan=False, width=64)


@st.composite
def three_partials(draw):
    """Three partials of one query row set (T rows) over disjoint random key chunks, some rows of some
    chunks fully masked."""
    T, Dh, Dv = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([1.0, 4.0]))  # 4: larger logits, so the maxima differ a lot
    q = torch.randn(T, Dh, generator=gen, dtype=f64) * scale
    out = []
    for _ in range(3):
        n = draw(st.integers(1, 4))
        k, v = torch.randn(n, Dh, generator=gen, dtype=f64) * scale, torch.randn(n, Dv, generator=gen, dtype=f64)
        keep = torch.rand(T, n, generator=gen) < draw(st.sampled_from([0.0, 0.5, 1.0]))
        out.append(partial_attention(q, k, v, mask=keep))
    return out


def _partial_diff(a: Partial, b: Partial) -> float:
    return max(_max_diff(a.m, b.m), _max_diff(a.l, b.l), _max_diff(a.acc, b.acc))


@given(three_partials())
def test_merge_is_commutative_bit_for_bit_and_associative_to_1e_12(ps):
    a, b, c = ps
    ab, ba = merge_partials(a, b), merge_partials(b, a)
    assert all(torch.equal(x, y) for x, y in zip(ab, ba, strict=True))
    left, right = merge_partials(ab, c), merge_partials(a, merge_partials(b, c))
    # the merged quantities are sums of exponentials <= 1 per key: compare finalized results and raw sums
    assert _partial_diff(left, right) <= TOL
    for x, y in zip(finalize(left), finalize(right), strict=True):
        assert _max_diff(x, y) <= TOL


def test_merging_two_empty_partials_stays_empty_and_finite():
    q, k, v = _qkv(2, T=2, S=4)
    none = torch.zeros(2, 4, dtype=torch.bool)
    e = partial_attention(q, k, v, mask=none)
    both = merge_partials(e, e)
    assert torch.isneginf(both.m).all() and (both.l == 0).all() and (both.acc == 0).all()
    full = partial_attention(q, k, v)
    assert all(torch.equal(x, y) for x, y in zip(merge_partials(e, full), full, strict=True))  # e is an identity


# --- split_kv_attention --------------------------------------------------------------------------

@st.composite
def chunked_problem(draw):
    S = draw(st.integers(1, 12))
    cuts = sorted(draw(st.sets(st.integers(1, S - 1), max_size=min(S - 1, 5)))) if S > 1 else []
    edges = [0, *cuts, S]
    n = len(edges) - 1
    order = draw(st.one_of(st.just("tree"), st.just(None), st.permutations(list(range(n)))))
    T = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    mask_kind = draw(st.sampled_from(["none", "random", "chunk_hidden", "bottom_right"]))
    return S, edges, order, T, seed, mask_kind


def _mask(kind, T, S, edges, gen):
    if kind == "none":
        return None
    if kind == "bottom_right":
        return causal_mask(T, S, alignment="bottom_right") if T <= S else None
    keep = torch.rand(2, 1, T, S, generator=gen) < 0.6  # broadcast over heads; some rows see nothing
    if kind == "chunk_hidden":
        keep[..., edges[0]:edges[1]] = False  # a chunk that no row can see
    return keep


@given(chunked_problem())
def test_split_kv_equals_full_attention_for_any_chunking_and_order(problem):
    S, edges, order, T, seed, kind = problem
    q, k, v = _qkv(seed, T=T, S=S, Dh=4, Dv=3)
    keep = _mask(kind, T, S, edges, torch.Generator().manual_seed(seed))
    out, lse = split_kv_attention(q, k, v, boundaries=edges, order=order, mask=keep, return_lse=True)
    np_mask = None if keep is None else keep.numpy()
    assert _max_diff(out, ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), np_mask)) <= TOL
    assert _max_diff(out, sdpa(q, k, v, keep)) <= TOL
    assert _max_diff(lse, _lse(q, k, keep)) <= TOL


def test_every_permutation_of_five_chunks_gives_the_same_decode_step():
    q, k, v = _qkv(3, T=1, S=41)  # decode: one query per head, (B, H, 1, Dh)
    expected = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())
    worst = max(_max_diff(split_kv_attention(q, k, v, n_splits=5, order=list(p)), expected)
                for p in itertools.permutations(range(5)))
    assert worst <= TOL
    assert _max_diff(split_kv_attention(q, k, v, n_splits=5, order="tree"), expected) <= TOL


def test_fully_masked_rows_follow_the_package_convention_zero_row_and_minus_inf_lse():
    q, k, v = _qkv(4, T=3, S=10)
    keep = torch.ones(3, 10, dtype=torch.bool)
    keep[1] = False
    out, lse = split_kv_attention(q, k, v, n_splits=3, mask=keep, return_lse=True)
    tiled_out, tiled_lse = tiled_attention(q, k, v, keep, block_k=4, return_lse=True)
    assert (out[..., 1, :] == 0).all() and torch.isneginf(lse[..., 1]).all()
    assert _max_diff(out, tiled_out) <= TOL and _max_diff(lse, tiled_lse) <= TOL
    assert _max_diff(out, sdpa(q, k, v, keep)) <= TOL


def test_a_nan_stored_at_a_masked_key_does_not_reach_the_output():
    q, k, v = _qkv(5, T=2, S=9)
    k[..., 7, :], v[..., 8, :] = float("nan"), float("inf")
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[:, 7:] = False
    assert _max_diff(split_kv_attention(q, k, v, n_splits=3, mask=keep), sdpa(q, k, v, keep)) <= TOL


def test_gradients_flow_and_equal_those_of_dense_attention():
    q, k, v = (x.requires_grad_() for x in _qkv(6, T=3, S=11))
    keep = causal_mask(3, 11, alignment="bottom_right")
    g = torch.randn(2, 3, 3, 5, generator=torch.Generator().manual_seed(0), dtype=f64)
    grads = torch.autograd.grad((split_kv_attention(q, k, v, n_splits=4, order=[2, 0, 3, 1], mask=keep) * g).sum(),
                                (q, k, v))
    expected = torch.autograd.grad((sdpa(q, k, v, keep) * g).sum(), (q, k, v))
    assert max(_max_diff(a, b) for a, b in zip(grads, expected, strict=True)) <= TOL


def test_half_precision_keeps_the_dtype_and_is_close_to_float64():
    q, k, v = _qkv(7, T=1, S=64, dtype=torch.bfloat16)
    out, lse = split_kv_attention(q, k, v, n_splits=4, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    expected = sdpa(q.double(), k.double(), v.double())
    assert float((out.double() - expected).abs().max()) < 2e-2


def test_chunk_boundaries_are_near_equal():
    assert chunk_boundaries(10, 3) == [0, 3, 6, 10]
    assert chunk_boundaries(4, 4) == [0, 1, 2, 3, 4]


# --- bad input -----------------------------------------------------------------------------------

def test_bad_input_is_refused_with_the_argument_named():
    q, k, v = _qkv(8, T=1, S=6)
    with pytest.raises(ValueError, match="exactly one of n_splits"):
        split_kv_attention(q, k, v)
    with pytest.raises(ValueError, match="exactly one of n_splits"):
        split_kv_attention(q, k, v, n_splits=2, boundaries=[0, 6])
    with pytest.raises(ValueError, match=r"n_splits must be <= S.*n_splits=7, S=6"):
        split_kv_attention(q, k, v, n_splits=7)
    with pytest.raises(ValueError, match=r"boundaries must increase strictly from 0 to S=6.*\[0, 3, 3, 6\]"):
        split_kv_attention(q, k, v, boundaries=[0, 3, 3, 6])
    with pytest.raises(ValueError, match=r"boundaries must increase strictly from 0 to S=6"):
        split_kv_attention(q, k, v, boundaries=[0, 5])
    with pytest.raises(ValueError, match=r"order must be a permutation of range\(3\)"):
        split_kv_attention(q, k, v, n_splits=3, order=[0, 0, 1])
    with pytest.raises(ValueError, match="order must be 'sequential', 'tree'"):
        split_kv_attention(q, k, v, n_splits=3, order="random")
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        split_kv_attention(q, k, v, n_splits=2, mask=torch.ones(1, 6, dtype=f64))
    with pytest.raises(ValueError, match=r"mask must broadcast to \(\.\.\., T, S\) = \(2, 3, 1, 6\); got shape \(1, 5\)"):
        split_kv_attention(q, k, v, n_splits=2, mask=torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="q and k must have the same last dim d_head"):
        partial_attention(q, k[..., :3], v)
    with pytest.raises(TypeError, match="return_lse must be True or False"):
        split_kv_attention(q, k, v, n_splits=2, return_lse="yes")
    p = partial_attention(q, k, v)
    with pytest.raises(TypeError, match="b must be a selfattn.inference.split_kv.Partial"):
        merge_partials(p, (p.m, p.l, p.acc))
    with pytest.raises(ValueError, match="a and b must cover the same query rows"):
        merge_partials(p, partial_attention(q[:1], k[:1], v[:1]))
    with pytest.raises(ValueError, match="partials must hold at least one Partial"):
        reduce_partials([])


# --- bad input found by the new-user probe (chapter 11) ---


def _qkv16():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 4, T, 8, dtype=torch.float64, generator=g) for T in (1, 16, 16))


@pytest.mark.parametrize("bad", [[0, 8.9, 16], [0, True, 16], [0, "8", 16], {0, 8, 16}, "0,16",
                                 torch.tensor([0.0, 8.0, 16.0]), np.array([0.0, 16.0])])
def test_boundaries_must_be_ints(bad):
    """[0, 8.9, 16] silently used 8; [0, True, 16] was taken as [0, 1, 16]."""
    q, k, v = _qkv16()
    with pytest.raises(TypeError, match="boundaries"):
        split_kv_attention(q, k, v, boundaries=bad)


def test_boundaries_accept_numpy_ints_and_integer_tensors():
    q, k, v = _qkv16()
    want = split_kv_attention(q, k, v, boundaries=[0, 8, 16])
    for b in ([0, np.int64(8), 16], np.array([0, 8, 16]), torch.tensor([0, 8, 16]), range(0, 17, 8)):
        assert torch.equal(split_kv_attention(q, k, v, boundaries=b), want)


@pytest.mark.parametrize("bad", [[0.4, 1.6], [True, False], {1: 0, 0: 1}, {0, 1}, 5])
def test_order_must_be_a_sequence_of_ints(bad):
    """order=[0.4, 1.6] was truncated to [0, 1]; [True, False] and a dict's keys were accepted."""
    q, k, v = _qkv16()
    with pytest.raises(TypeError, match="order"):
        split_kv_attention(q, k, v, n_splits=2, order=bad)


def test_order_accepts_numpy_ints():
    q, k, v = _qkv16()
    want = split_kv_attention(q, k, v, n_splits=2, order=[1, 0])
    for order in ([np.int64(1), np.int64(0)], np.array([1, 0]), (1, 0)):
        assert torch.equal(split_kv_attention(q, k, v, n_splits=2, order=order), want)
