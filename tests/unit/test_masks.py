"""Boolean keep-masks (True = may attend) and the converters from other conventions.

Expected masks are built here with ``torch.tril`` and comparisons, independently of ``masks.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from selfattn import causal_mask, from_blocked_mask, from_hf_attention_mask, padding_mask, ref
from selfattn.masks import ALIGNMENTS

# --- causal_mask -------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 7])
def test_causal_square_is_tril_with_diagonal(T):
    got = causal_mask(T)
    assert got.dtype == torch.bool and got.shape == (T, T)
    assert torch.equal(got, torch.tril(torch.ones(T, T, dtype=torch.bool)))
    # A causal diagonal off by one is a known bug: every token must see itself.
    assert got.diagonal().all()


@pytest.mark.parametrize("alignment", [None, "top_left", "bottom_right"])
def test_causal_square_alignment_does_not_matter(alignment):
    assert torch.equal(
        causal_mask(5, 5, alignment=alignment), torch.tril(torch.ones(5, 5, dtype=torch.bool))
    )


@pytest.mark.parametrize(("T", "S"), [(3, 7), (7, 3), (1, 5), (5, 1)])
def test_causal_top_left_is_tril(T, S):
    assert torch.equal(
        causal_mask(T, S, alignment="top_left"), torch.tril(torch.ones(T, S, dtype=torch.bool))
    )


@pytest.mark.parametrize(("T", "S"), [(3, 7), (7, 3), (1, 5), (5, 1)])
def test_causal_bottom_right_is_tril_shifted_by_S_minus_T(T, S):
    expected = torch.tril(torch.ones(T, S, dtype=torch.bool), diagonal=S - T)
    got = causal_mask(T, S, alignment="bottom_right")
    assert torch.equal(got, expected)
    assert got[-1].all()  # the newest query sees every key


@pytest.mark.parametrize(
    ("T", "S", "alignment"), [(3, 7, "top_left"), (3, 7, "bottom_right"), (6, 6, None)]
)
def test_causal_equals_numpy_reference(T, S, alignment):
    np.testing.assert_array_equal(
        causal_mask(T, S, alignment=alignment).numpy(), ref.causal_mask(T, S, alignment=alignment)
    )


def test_causal_missing_alignment_when_T_differs_from_S():
    with pytest.raises(
        ValueError,
        match=r"T=1 queries and S=5 keys needs an explicit alignment: 'top_left'.*'bottom_right'",
    ):
        causal_mask(1, 5)


@pytest.mark.parametrize("alignment", ["bottom-right", "left", "BOTTOM_RIGHT", ""])
def test_causal_unknown_alignment(alignment):
    msg = re.escape(f"alignment must be one of {ALIGNMENTS} or None; got {alignment!r}")
    with pytest.raises(ValueError, match=msg):
        causal_mask(3, 5, alignment=alignment)


def test_causal_bad_sizes():
    with pytest.raises(ValueError, match=r"T must be > 0; got 0"):
        causal_mask(0)
    with pytest.raises(ValueError, match=r"S must be > 0; got -2"):
        causal_mask(3, -2, alignment="top_left")
    with pytest.raises(TypeError, match=r"T must be a positive int; got 3\.0"):
        causal_mask(3.0)
    with pytest.raises(TypeError, match=r"T must be a positive int; got tensor"):
        causal_mask(torch.tensor(3))


def test_causal_device_argument():
    assert causal_mask(3, device="cpu").device.type == "cpu"


# --- padding_mask ------------------------------------------------------------------------------


def test_padding_mask_shape_and_values():
    got = padding_mask([2, 4, 0], 5)
    assert got.dtype == torch.bool and got.shape == (3, 1, 1, 5)
    expected = torch.tensor(
        [[True, True, False, False, False], [True, True, True, True, False], [False] * 5]
    )
    assert torch.equal(got[:, 0, 0], expected)


def test_padding_mask_default_S_is_longest():
    got = padding_mask(torch.tensor([1, 3]))
    assert got.shape == (2, 1, 1, 3)
    assert torch.equal(got[1, 0, 0], torch.ones(3, dtype=torch.bool))


def test_padding_mask_bad_inputs():
    with pytest.raises(TypeError, match=r"lengths must hold integers; got dtype torch\.float32"):
        padding_mask([1.0, 2.0])
    with pytest.raises(TypeError, match=r"lengths must hold integers; got dtype torch\.bool"):
        padding_mask([True, False])
    with pytest.raises(
        ValueError, match=re.escape("lengths must have shape (B,) (1 dims); got shape (2, 2)")
    ):
        padding_mask([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=re.escape("lengths must be >= 0; got [2, -1]")):
        padding_mask([2, -1])
    with pytest.raises(
        ValueError, match=re.escape("every length must be <= S=3; got lengths [2, 4]")
    ):
        padding_mask([2, 4], 3)
    with pytest.raises(ValueError, match=r"S must be > 0; got 0"):
        padding_mask([0], 0)


def test_padding_mask_broadcasts_over_heads_and_queries():
    from selfattn import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    _, weights = scaled_dot_product_attention(q, k, v, padding_mask([2, 5], 5), return_weights=True)
    assert torch.equal(weights[0, :, :, 2:], torch.zeros(3, 4, 3, dtype=torch.float64))
    torch.testing.assert_close(
        weights.sum(-1), torch.ones(2, 3, 4, dtype=torch.float64), rtol=0, atol=1e-12
    )


# --- converters --------------------------------------------------------------------------------


def test_from_blocked_mask_inverts_polarity():
    # nn.MultiheadAttention's causal attn_mask: True above the diagonal means "blocked".
    blocked = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    assert torch.equal(from_blocked_mask(blocked), causal_mask(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_from_blocked_mask_refuses_non_boolean(dtype):
    with pytest.raises(
        TypeError,
        match=rf"blocked must be a boolean tensor \(True = blocked\); got dtype {dtype}.*bias=",
    ):
        from_blocked_mask(torch.zeros(3, 3, dtype=dtype))


def test_from_blocked_mask_refuses_numpy():
    with pytest.raises(TypeError, match=r"blocked must be a torch\.Tensor; got ndarray"):
        from_blocked_mask(np.zeros((2, 2), dtype=bool))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_from_hf_attention_mask(dtype):
    hf = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).to(dtype)
    got = from_hf_attention_mask(hf)
    assert got.dtype == torch.bool and got.shape == (2, 1, 1, 4)
    assert torch.equal(got, padding_mask([3, 4], 4))


def test_from_hf_attention_mask_bad_inputs():
    with pytest.raises(
        TypeError,
        match=r"attention_mask must be an integer or boolean \(B, S\) tensor of 0/1; got dtype torch\.float32",
    ):
        from_hf_attention_mask(torch.ones(2, 3))
    with pytest.raises(
        ValueError,
        match=re.escape("attention_mask must have shape (B, S) (2 dims); got shape (3,)"),
    ):
        from_hf_attention_mask(torch.ones(3, dtype=torch.int64))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "attention_mask must hold only 0 and 1; got values [0, 1, 2] in a tensor of shape (1, 3)"
        ),
    ):
        from_hf_attention_mask(torch.tensor([[0, 1, 2]]))
    with pytest.raises(TypeError, match=r"attention_mask must be a torch\.Tensor; got list"):
        from_hf_attention_mask([[1, 0]])


def test_padding_mask_empty_or_non_sequence_lengths_are_refused_by_name():
    # Regression: [] said "got dtype torch.float32", "12" gave torch's "new(): invalid data type
    # 'str'", and None a RuntimeError.
    with pytest.raises(ValueError, match=r"lengths must not be empty.*got shape \(0,\)"):
        padding_mask([])
    with pytest.raises(ValueError, match="lengths must not be empty"):
        padding_mask([], 3)
    for bad, shown in (("12", "'12' (str)"), (None, "None (NoneType)"), ([[1], [2, 3]], "(list)")):
        with pytest.raises(TypeError, match=r"lengths must be a 1-D integer tensor or sequence.*got .*"
                           + re.escape(shown)):
            padding_mask(bad)
    assert padding_mask([1, 3]).tolist() == [[[[True, False, False]]], [[[True, True, True]]]]


def test_padding_mask_of_all_zero_lengths_needs_s():
    # Regression: padding_mask([0, 0]) returned a (2, 1, 1, 0) mask that fits no keys.
    with pytest.raises(ValueError, match=r"lengths are all 0.*pass S"):
        padding_mask([0, 0])
    keep = padding_mask([0, 2], S=3)
    assert keep.shape == (2, 1, 1, 3) and keep[0].sum() == 0 and keep[1, 0, 0].tolist() == [True, True, False]
