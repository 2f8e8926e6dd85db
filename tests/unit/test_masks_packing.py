"""Packed-document, prefix-LM and mask_mod helpers of selfattn.masks (chapter 04).

Expected values come from explicit loops or index formulas written here, or from torch's own
``flex_attention.create_mask``, never from the function under test alone.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask

from selfattn import masks


def _loop_document_mask(doc):
    T = len(doc)
    return torch.tensor([[j <= i and doc[i] == doc[j] for j in range(T)] for i in range(T)])


def test_document_causal_mask_example():
    doc = torch.tensor([0, 0, 0, 1, 1, 2])
    keep = masks.document_causal_mask(doc)
    assert keep.dtype == torch.bool and keep.shape == (6, 6)
    assert torch.equal(keep, _loop_document_mask(doc.tolist()))
    # block diagonal: three lower triangles of sizes 3, 2, 1
    expected = torch.block_diag(*(torch.tril(torch.ones(n, n)) for n in (3, 2, 1))).bool()
    assert torch.equal(keep, expected)
    batched = masks.document_causal_mask(torch.stack([doc, torch.zeros(6, dtype=torch.long)]))
    assert batched.shape == (2, 1, 6, 6)
    assert torch.equal(batched[0, 0], expected) and torch.equal(batched[1, 0], torch.tril(torch.ones(6, 6)).bool())


def test_document_positions_restart():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert masks.document_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert masks.document_positions(torch.tensor([7])).tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_document_mask_is_causal_and_same_document(doc):
    # the AND of the causal mask and "same document", for any ids (also non-contiguous ones)
    ids = torch.tensor(doc)
    T = len(doc)
    same = torch.tensor([[a == b for b in doc] for a in doc])
    assert torch.equal(masks.document_causal_mask(ids), same & torch.tril(torch.ones(T, T, dtype=torch.bool)))
    # positions: the distance back to the start of the run of equal ids
    expected = []
    for t in range(T):
        s = t
        while s > 0 and doc[s - 1] == doc[t]:
            s -= 1
        expected.append(t - s)
    assert masks.document_positions(ids).tolist() == expected


def test_prefix_lm_mask_picture():
    keep = masks.prefix_lm_mask(5, 2)
    picture = ["".join("x" if v else "." for v in row) for row in keep.tolist()]
    assert picture == ["xx...", "xx...", "xxx..", "xxxx.", "xxxxx"]
    assert torch.equal(masks.prefix_lm_mask(4, 0), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert torch.equal(masks.prefix_lm_mask(4, 4), torch.ones(4, 4, dtype=torch.bool))


@pytest.mark.parametrize("bad, err", [
    ([0, 1], TypeError), (torch.tensor([0.0, 1.0]), TypeError), (torch.tensor([True]), TypeError),
    (torch.zeros(2, 2, 2, dtype=torch.long), ValueError), (torch.zeros(2, 0, dtype=torch.long), ValueError),
])
def test_document_mask_errors(bad, err):
    with pytest.raises(err, match="doc_ids"):
        masks.document_causal_mask(bad)
    with pytest.raises(err, match="doc_ids"):
        masks.document_positions(bad)


def test_prefix_lm_errors():
    with pytest.raises(ValueError, match="prefix_len"):
        masks.prefix_lm_mask(4, 5)
    with pytest.raises(ValueError, match="prefix_len"):
        masks.prefix_lm_mask(4, -1)
    with pytest.raises(TypeError, match="prefix_len"):
        masks.prefix_lm_mask(4, 1.5)
    with pytest.raises(ValueError, match="T"):
        masks.prefix_lm_mask(0, 0)


def _mods():
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 1, 1, 1]])
    return {
        "causal": (masks.causal_mask_mod, masks.causal_mask(8)),
        "document": (masks.document_mask_mod(doc), masks.document_causal_mask(doc)),
        "document_1d": (masks.document_mask_mod(doc[0]), masks.document_causal_mask(doc[0])),
        "prefix_lm": (masks.prefix_lm_mask_mod(3), masks.prefix_lm_mask(8, 3)),
        "sliding_window": (masks.sliding_window_mask_mod(3),
                           torch.tensor([[i - 3 < j <= i for j in range(8)] for i in range(8)])),
    }


@pytest.mark.parametrize("name", list(_mods()))
def test_mask_mods_match_masks_and_flex_create_mask(name):
    mod, dense = _mods()[name]
    keep = masks.materialize_mask_mod(mod, 2, 3, 8, 8)
    assert keep.shape == (2, 3, 8, 8) and keep.dtype == torch.bool
    assert torch.equal(keep, dense.expand(2, 3, 8, 8))
    # FlexAttention's own materialisation (vmap over scalar indices) agrees
    assert torch.equal(keep, create_mask(mod, 2, 3, 8, 8, device="cpu"))


def test_mask_mod_errors():
    with pytest.raises(TypeError, match="callable"):
        masks.materialize_mask_mod("causal", 1, 1, 4, 4)
    with pytest.raises(TypeError, match="boolean"):
        masks.materialize_mask_mod(lambda b, h, q, kv: (kv <= q).float(), 1, 1, 4, 4)
    with pytest.raises(TypeError, match="boolean"):
        masks.materialize_mask_mod(lambda b, h, q, kv: True, 1, 1, 4, 4)
    with pytest.raises(ValueError, match="broadcastable"):
        masks.materialize_mask_mod(lambda b, h, q, kv: torch.ones(3, 5, dtype=torch.bool), 1, 1, 4, 4)
    with pytest.raises(ValueError, match="window"):
        masks.sliding_window_mask_mod(0)
    with pytest.raises(ValueError, match="prefix_len"):
        masks.prefix_lm_mask_mod(-2)


def test_prefix_lm_mask_mod_errors_say_type_or_value():
    import pytest

    from selfattn.masks import prefix_lm_mask_mod

    with pytest.raises(TypeError, match=r"prefix_len must be an int >= 0; got '3' \(str\)"):
        prefix_lm_mask_mod("3")
    with pytest.raises(ValueError, match="prefix_len must be an int >= 0; got -1"):
        prefix_lm_mask_mod(-1)
