"""Hypothesis property tests of attention (claims 6 and 7, and issue 3's mask properties).

Small shapes, float64, 50 derandomized examples each (profile "selfattn" in tests/conftest.py).
Tolerance 1e-10 on sums and the convex hull, 1e-12 on equalities of float64 results.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from selfattn import AttentionConfig, SelfAttention, ref
from selfattn import scaled_dot_product_attention as sdpa

TOL = 1e-10

sizes = st.integers(min_value=1, max_value=5)
finite = st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def attention_inputs(draw, with_mask=True):
    """q (T, Dh), k (S, Dh), v (S, Dv) and a boolean keep-mask (T, S) that may blank whole rows."""
    T, S, Dh, Dv = draw(sizes), draw(sizes), draw(sizes), draw(sizes)
    q = draw(arrays(np.float64, (T, Dh), elements=finite))
    k = draw(arrays(np.float64, (S, Dh), elements=finite))
    v = draw(arrays(np.float64, (S, Dv), elements=finite))
    keep = draw(arrays(np.bool_, (T, S))) if with_mask else None
    return q, k, v, keep


def _t(x):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x))


@given(attention_inputs())
def test_weights_non_negative_and_rows_sum_to_one_or_zero(inputs):
    q, k, v, keep = inputs
    _, weights = sdpa(_t(q), _t(k), _t(v), _t(keep), return_weights=True)
    weights = weights.numpy()
    assert np.isfinite(weights).all()
    assert (weights >= 0).all()
    assert (weights[~keep] == 0).all()  # masked entries are exactly zero
    expected_sums = keep.any(-1).astype(np.float64)  # one, or zero when nothing is visible
    np.testing.assert_allclose(weights.sum(-1), expected_sums, rtol=0, atol=TOL)


@given(attention_inputs())
def test_output_is_weights_at_v_and_in_convex_hull_of_visible_values(inputs):
    q, k, v, keep = inputs
    context, weights = sdpa(_t(q), _t(k), _t(v), _t(keep), return_weights=True)
    context, weights = context.numpy(), weights.numpy()
    np.testing.assert_allclose(context, weights @ v, rtol=0, atol=1e-12)
    for i in range(q.shape[0]):
        visible = v[keep[i]]  # (S_visible, Dv)
        if len(visible) == 0:
            np.testing.assert_array_equal(context[i], 0.0)
            continue
        assert (context[i] >= visible.min(0) - TOL).all()
        assert (context[i] <= visible.max(0) + TOL).all()


@given(attention_inputs())
def test_torch_path_equals_numpy_reference(inputs):
    q, k, v, keep = inputs
    got = sdpa(_t(q), _t(k), _t(v), _t(keep)).numpy()
    np.testing.assert_allclose(
        got, ref.scaled_dot_product_attention(q, k, v, keep), rtol=0, atol=1e-12
    )


@given(attention_inputs(), st.randoms(use_true_random=False))
def test_permuting_keys_and_values_together_leaves_output_unchanged(inputs, random):
    q, k, v, keep = inputs
    perm = list(range(k.shape[0]))
    random.shuffle(perm)
    out = sdpa(_t(q), _t(k), _t(v), _t(keep))
    out_perm = sdpa(_t(q), _t(k[perm]), _t(v[perm]), _t(keep[:, perm]))
    torch.testing.assert_close(out_perm, out, rtol=0, atol=1e-12)


@given(
    T=sizes,
    d_model=st.integers(1, 6),
    d_head=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    random=st.randoms(use_true_random=False),
)
def test_self_attention_is_permutation_equivariant_without_positions(
    T, d_model, d_head, seed, random
):
    gen = torch.Generator().manual_seed(seed)
    layer = (
        SelfAttention(AttentionConfig(d_model=d_model, d_head=d_head), generator=gen)
        .double()
        .eval()
    )
    X = torch.randn(2, T, d_model, generator=gen, dtype=torch.float64)
    perm = list(range(T))
    random.shuffle(perm)
    with torch.no_grad():
        out = layer(X)
        out_perm = layer(X[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], rtol=0, atol=1e-12)


@given(attention_inputs(), st.integers(1, 5))
def test_padding_more_keys_changes_nothing(inputs, extra):
    """Appending masked keys (padding), whatever their values, leaves the output unchanged."""
    q, k, v, keep = inputs
    gen = torch.Generator().manual_seed(extra)
    k_pad = torch.cat(
        [_t(k), torch.randn(extra, k.shape[1], generator=gen, dtype=torch.float64) * 1e3]
    )
    v_pad = torch.cat([_t(v), torch.full((extra, v.shape[1]), float("nan"), dtype=torch.float64)])
    keep_pad = torch.cat([_t(keep), torch.zeros(q.shape[0], extra, dtype=torch.bool)], dim=1)
    out = sdpa(_t(q), _t(k), _t(v), _t(keep))
    torch.testing.assert_close(sdpa(_t(q), k_pad, v_pad, keep_pad), out, rtol=0, atol=1e-12)
