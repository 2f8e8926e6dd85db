"""Every statement of book/mask_conventions.md, checked against the installed libraries.

One test per row of the table (and its columns as separate assertions); expected values come from
an explicit softmax written here, from torch itself, or from the other library of the row, never
from the function under test alone. No book build needed.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import selfattn

TOL = {"atol": 1e-6, "rtol": 1e-5}


def _qkv(B=2, H=2, T=3, S=5, Dh=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, Dh, generator=g), torch.randn(B, H, S, Dh, generator=g),
            torch.randn(B, H, S, Dh, generator=g))


def _explicit(q, k, v, keep=None, add=None):
    """softmax(QK^T / sqrt(Dh) + add, masked by keep) @ V, written out; rows with no key -> 0."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
    if add is not None:
        scores = scores + add
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf only -> zeros
    return weights @ v  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)


def _keep(T=3, S=5, seed=1):
    keep = torch.rand(T, S, generator=torch.Generator().manual_seed(seed)) > 0.4
    keep[:, 0] = True  # every row sees a key
    return keep


def test_row_selfattn():
    q, k, v = _qkv()
    keep = _keep()
    # True = may attend; broadcastable to (B, H, T, S): (T, S) and (B, 1, 1, S) both accepted.
    torch.testing.assert_close(selfattn.scaled_dot_product_attention(q, k, v, keep), _explicit(q, k, v, keep), **TOL)
    pad = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]  # (B, 1, 1, S)
    torch.testing.assert_close(selfattn.scaled_dot_product_attention(q, k, v, pad), _explicit(q, k, v, pad), **TOL)
    # bool only: a float tensor is refused; an additive term goes to bias=.
    with pytest.raises(TypeError):
        selfattn.scaled_dot_product_attention(q, k, v, keep.float())
    bias = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(selfattn.scaled_dot_product_attention(q, k, v, bias=bias), _explicit(q, k, v, add=bias), **TOL)
    # causal_mask(T) is tril; alignment is required when T != S.
    assert torch.equal(selfattn.causal_mask(4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    with pytest.raises(ValueError):
        selfattn.causal_mask(3, 5)
    # a row with no visible key gives zeros.
    blind = keep.clone()
    blind[1] = False
    out = selfattn.scaled_dot_product_attention(q, k, v, blind)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1])) and torch.isfinite(out).all()


def test_row_torch_scaled_dot_product_attention():
    q, k, v = _qkv()
    keep = _keep()
    # bool: True = may attend, broadcastable to (B, H, T, S).
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=keep), _explicit(q, k, v, keep), **TOL)
    # float: added to the scores.
    bias = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=bias), _explicit(q, k, v, add=bias), **TOL)
    # is_causal=True with T != S: query i sees keys j <= i (top-left), i.e. causal_mask(..., "top_left").
    top_left = selfattn.causal_mask(3, 5, alignment="top_left")
    assert torch.equal(top_left, torch.tril(torch.ones(3, 5, dtype=torch.bool)))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), _explicit(q, k, v, top_left), **TOL)
    # a row with no visible key gives zeros (the installed version).
    blind = keep.clone()
    blind[1] = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=blind)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))


def _mha(seed=0):
    torch.manual_seed(seed)
    return torch.nn.MultiheadAttention(embed_dim=4, num_heads=2, batch_first=True).eval()


def test_row_multihead_attention_attn_mask():
    mha = _mha()
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[0, 2] = blocked[2, 1] = True
    # bool: True = blocked (weight exactly 0 there, positive elsewhere); shape (T, S).
    out, weights = mha(x, x, x, attn_mask=blocked, average_attn_weights=False)  # weights (B, H, T, S)
    assert torch.equal(weights[..., blocked], torch.zeros_like(weights[..., blocked]))
    assert (weights[..., ~blocked] > 0).all()
    # ... the same as this course's mask after from_blocked_mask (= ~blocked).
    keep = selfattn.from_blocked_mask(blocked)
    assert torch.equal(keep, ~blocked)
    # float: added to the scores (-inf where blocked gives the same result as the bool mask).
    additive = torch.zeros(3, 3).masked_fill(blocked, float("-inf"))
    torch.testing.assert_close(mha(x, x, x, attn_mask=additive)[0], out, **TOL)
    # shape (B * H, T, S) accepted.
    per_head = blocked.expand(2 * 2, 3, 3)
    torch.testing.assert_close(mha(x, x, x, attn_mask=per_head)[0], out, **TOL)
    # is_causal is only a hint that comes with a mask: alone it is refused.
    with pytest.raises(RuntimeError):
        mha(x, x, x, is_causal=True)
    # a fully blocked row gives NaN with need_weights=True (the default) and zeros without
    # (then nn.MultiheadAttention calls scaled_dot_product_attention).
    row = torch.zeros(3, 3, dtype=torch.bool)
    row[1] = True
    assert torch.isnan(mha(x, x, x, attn_mask=row)[0][:, 1]).all()
    without_weights = mha(x, x, x, attn_mask=row, need_weights=False)[0]
    assert torch.equal(without_weights[:, 1], torch.zeros_like(without_weights[:, 1]))
    assert torch.isfinite(without_weights).all()


def test_row_multihead_attention_key_padding_mask():
    mha = _mha()
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))
    padding = torch.tensor([[False, False, True], [False, False, False]])  # (B, S), True = padding
    out, weights = mha(x, x, x, key_padding_mask=padding, average_attn_weights=False)
    assert torch.equal(weights[0, :, :, 2], torch.zeros(2, 3))
    assert (weights[1] > 0).all()
    additive = torch.zeros(2, 3).masked_fill(padding, float("-inf"))
    torch.testing.assert_close(mha(x, x, x, key_padding_mask=additive)[0], out, **TOL)
    all_padding = torch.tensor([[True, True, True], [False, False, False]])
    assert torch.isnan(mha(x, x, x, key_padding_mask=all_padding)[0][0]).all()
    no_weights = mha(x, x, x, key_padding_mask=all_padding, need_weights=False)[0]
    assert torch.equal(no_weights[0], torch.zeros_like(no_weights[0]))
    # Into this course's convention: ~padding as (B, 1, 1, S).
    assert torch.equal(selfattn.from_blocked_mask(padding)[:, None, None, :], (~padding)[:, None, None, :])


def test_row_hugging_face_attention_mask():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    attention_mask = torch.tensor([[1, 1, 1, 0]])  # int64, 1 = real token, 0 = padding
    assert attention_mask.dtype == torch.int64
    with torch.no_grad():
        run = model(input_ids=ids, attention_mask=attention_mask, output_attentions=True)
        other = model(input_ids=torch.tensor([[5, 6, 7, 20]]), attention_mask=attention_mask)
    # 0 = ignored: no weight on the padded key, and changing it does not change the real tokens.
    assert torch.equal(run.attentions[0][..., 3], torch.zeros_like(run.attentions[0][..., 3]))
    torch.testing.assert_close(run.last_hidden_state[:, :3], other.last_hidden_state[:, :3], **TOL)
    # 1 = may attend: every real key gets weight.
    assert (run.attentions[0][..., :3] > 0).all()
    # A float (B, S) mask is not added to the scores but read as real token / padding, like the int
    # one: added, 2.0 / 0.0 would leave the padded key visible and change the real tokens' outputs.
    with torch.no_grad():
        as_float = model(input_ids=ids, attention_mask=torch.tensor([[2.0, 2.0, 2.0, 0.0]]))
        as_bool = model(input_ids=ids, attention_mask=attention_mask.bool())
    torch.testing.assert_close(as_float.last_hidden_state, run.last_hidden_state, **TOL)
    torch.testing.assert_close(as_bool.last_hidden_state, run.last_hidden_state, **TOL)
    keep = selfattn.from_hf_attention_mask(attention_mask)
    assert keep.shape == (1, 1, 1, 4) and keep.dtype == torch.bool
    assert torch.equal(keep[0, 0, 0], torch.tensor([True, True, True, False]))


def test_row_hugging_face_decoders_add_their_own_causal_mask():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=30, n_embd=8, n_layer=1, n_head=2, n_positions=16,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():
        run = model(input_ids=torch.tensor([[5, 6, 7, 8]]), attention_mask=torch.ones(1, 4, dtype=torch.int64),
                    output_attentions=True)
    weights = run.attentions[0][0]  # (H, T, S)
    future = ~torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(weights[:, future], torch.zeros_like(weights[:, future]))
    assert (weights[:, ~future] > 0).all()


def test_row_flex_attention_mask_mod():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    import warnings

    q, k, v = _qkv()  # T = 3 queries, S = 5 keys
    keep = _keep()

    def from_table(b, h, q_idx, kv_idx):  # an arbitrary mask as a mask_mod: True = keep
        return keep[q_idx, kv_idx]

    # True = keep: create_mask gives the boolean (B, H, T, S) tensor, flex_attention attends where True.
    materialised = flex.create_mask(from_table, 2, 2, 3, 5, device="cpu")
    assert materialised.dtype == torch.bool and torch.equal(materialised, keep.expand(2, 2, 3, 5))
    assert torch.equal(selfattn.masks.materialize_mask_mod(from_table, 2, 2, 3, 5), materialised)
    with warnings.catch_warnings():  # eager flex_attention warns that it is not compiled
        warnings.simplefilter("ignore", UserWarning)
        out = flex.flex_attention(q, k, v, block_mask=flex.create_block_mask(from_table, 2, 2, 3, 5, device="cpu"))
        torch.testing.assert_close(out, _explicit(q, k, v, keep), **TOL)
        # the same function through this course's tiled attention
        torch.testing.assert_close(selfattn.efficient.tiled_attention(q, k, v, mask_mod=from_table), out, **TOL)
        # a non-boolean mask_mod is refused
        with pytest.raises(Exception, match="bool"):
            flex.create_block_mask(lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx).float(), 1, 1, 3, 5, device="cpu")
        # causal q_idx >= kv_idx is top-left when T != S; it is selfattn.masks.causal_mask_mod
        causal = flex.create_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, 1, 3, 5, device="cpu")[0, 0]
        assert torch.equal(causal, selfattn.causal_mask(3, 5, alignment="top_left"))
        assert torch.equal(flex.create_mask(selfattn.masks.causal_mask_mod, 1, 1, 3, 5, device="cpu")[0, 0], causal)
        # a row that sees no key gives zeros, log-sum-exp -inf
        blind = keep.clone()
        blind[1] = False
        blind_mask = flex.create_block_mask(lambda b, h, q_idx, kv_idx: blind[q_idx, kv_idx], 2, 2, 3, 5, device="cpu")
        if hasattr(flex, "AuxRequest"):  # torch >= 2.9; return_lse before (deprecated since)
            out, aux = flex.flex_attention(q, k, v, block_mask=blind_mask, return_aux=flex.AuxRequest(lse=True))
            lse = aux.lse
        else:
            out, lse = flex.flex_attention(q, k, v, block_mask=blind_mask, return_lse=True)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1])) and torch.isfinite(out).all()
    assert torch.isinf(lse[:, :, 1]).all() and (lse[:, :, 1] < 0).all()


def _picture(rows):
    return torch.tensor([[c == "1" for c in row.split()] for row in rows])


def test_row_flash_attn_causal_is_bottom_right():
    # flash-attn's documentation (flash_attn_func's docstring, v2.1+; 1 = keep):
    doc_2x5 = _picture(["1 1 1 1 0", "1 1 1 1 1"])
    doc_5x2 = _picture(["0 0", "0 0", "0 0", "1 0", "1 1"])
    assert torch.equal(selfattn.causal_mask(2, 5, alignment="bottom_right"), doc_2x5)
    assert torch.equal(selfattn.causal_mask(5, 2, alignment="bottom_right"), doc_5x2)
    # ... and not PyTorch's top-left is_causal
    assert not torch.equal(selfattn.causal_mask(2, 5, alignment="top_left"), doc_2x5)
    # the rows with no key (T > S) give zeros, as its documentation says; here, this course's attention
    q, k, v = _qkv(T=5, S=2)
    out = selfattn.scaled_dot_product_attention(q, k, v, doc_5x2)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))


def test_row_flash_attn_installed():
    flash_attn = pytest.importorskip("flash_attn")  # not installed for this course: needs a CUDA GPU
    if not torch.cuda.is_available():
        pytest.skip("flash-attn needs a CUDA GPU")
    q, k, v = (x.transpose(1, 2).contiguous().cuda().half() for x in _qkv(T=2, S=5))  # (B, T, H, Dh) layout
    out = flash_attn.flash_attn_func(q, k, v, causal=True).transpose(1, 2).float()
    keep = selfattn.causal_mask(2, 5, alignment="bottom_right").cuda()
    expected = _explicit(*(x.transpose(1, 2).float() for x in (q, k, v)), keep)
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)
