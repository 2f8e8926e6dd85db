"""DESIGN.md: a NaN or inf stored at a key, query or value position reaches no gradient of a row
that cannot see it, and no key/value gradient through a pair the mask hides, in every attention
path (dense, tiled with every block size, cached, sliding window; the Triton forward in
test_efficient_triton.py).

Each case stores NaN, +inf or -inf at one position that some rows may not see, runs forward and
backward with a fixed upstream gradient, and compares every output row, query gradient, key
gradient and value gradient that the bad position cannot reach with a float64 oracle written out
here (plain torch ops, not the package) and computed on the clean inputs: what those entries must
be. The entries the bad position may legitimately reach (rows that see it; keys and values those
rows see) are not compared.
"""

from __future__ import annotations

import math

import pytest
import torch

import selfattn
from selfattn.efficient import (
    KVCache,
    cached_attention,
    sliding_window_attention,
    sliding_window_mask,
    sliding_window_tiled_attention,
    tiled_attention,
)

T = 9
SCALE = 0.4
TOL = dict(rtol=1e-9, atol=1e-11, equal_nan=False)
BAD = [float("nan"), float("inf"), float("-inf")]


def _causal(T_, S_=None):
    S_ = T_ if S_ is None else S_
    return torch.ones(T_, S_, dtype=torch.bool).tril(S_ - T_)  # bottom-right alignment


def _masks():
    causal = _causal(T)
    valid = torch.arange(T) < T - 2  # the last two positions are padding, as queries and as keys
    segment = (torch.arange(T) >= 5).long()  # two packed sequences, positions 0-4 and 5-8
    return {
        "causal": causal,
        "causal+padding": causal & valid[:, None] & valid[None, :],
        "packed causal": causal & (segment[:, None] == segment[None, :]),
    }


# (mask name, which tensor holds the bad entry, its position): every case hides the position from
# some rows. Padded query rows see nothing (their output is zero and their gradients must be too).
CASES = [
    ("causal", "k", 4), ("causal", "v", 4), ("causal", "q", 3), ("causal", "k", 8),
    ("causal+padding", "q", 7), ("causal+padding", "k", 7), ("causal+padding", "v", 8),
    ("causal+padding", "k", 3), ("causal+padding", "q", 2),
    ("packed causal", "k", 2), ("packed causal", "v", 1), ("packed causal", "q", 3), ("packed causal", "k", 6),
]


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g = (torch.randn(2, 3, T, d, generator=gen, dtype=torch.float64) for d in (5, 5, 4, 4))
    return q, k, v, g


def _oracle(q, k, v, keep, g):
    """Float64 attention with autograd on clean inputs; rows with no visible key give zero."""
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * SCALE
    seen = keep.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~keep, -math.inf).masked_fill(~seen, 0.0)
    out = (torch.softmax(scores, dim=-1) * seen) @ v
    grads = torch.autograd.grad(out, (q, k, v), g)
    return (out.detach(), *grads)


def _reachable(keep, where, pos):
    """Rows that may see the bad position, and keys/values those rows may see."""
    if where == "q":
        rows = torch.zeros(T, dtype=torch.bool)
        rows[pos] = bool(keep[pos].any())
    else:
        rows = keep[:, pos].clone()
    keys = keep[rows].any(dim=0)
    return rows, keys


def _run(path, q, k, v, keep, g):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = path(q, k, v, keep)
    grads = torch.autograd.grad(out, (q, k, v), g)
    return (out, *grads)


def _check(path, mask_name, where, pos, bad):
    keep = _masks()[mask_name]
    q, k, v, g = _inputs()
    corrupted = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
    corrupted[where][..., pos, :] = bad
    out, dq, dk, dv = _run(path, corrupted["q"], corrupted["k"], corrupted["v"], keep, g)
    want_out, want_dq, want_dk, want_dv = _oracle(q, k, v, keep, g)
    rows, keys = _reachable(keep, where, pos)
    for name, got, want, clean in (("out", out, want_out, ~rows), ("dq", dq, want_dq, ~rows),
                                   ("dk", dk, want_dk, ~keys), ("dv", dv, want_dv, ~keys)):
        torch.testing.assert_close(got[..., clean, :], want[..., clean, :], **TOL,
                                   msg=lambda m, name=name: f"{name} of the positions {bad} at {where}[{pos}] "
                                                            f"must not reach ({mask_name}): {m}")


def _dense(q, k, v, keep):
    return selfattn.scaled_dot_product_attention(q, k, v, keep, scale=SCALE)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("mask_name,where,pos", CASES)
def test_dense_attention_keeps_hidden_nonfinite_out_of_gradients(mask_name, where, pos, bad):
    # Regression: a NaN key hidden by the causal mask made dq of the earlier rows NaN, and a NaN in
    # a padded query row (output correctly zero) made dk NaN for every key (autograd's dS k and
    # dS^T q compute 0 * NaN for the hidden pairs).
    _check(_dense, mask_name, where, pos, bad)


# Block sizes that put the bad position alone in a tile, with visible positions, or all in one tile.
BLOCKS = [(1, 1), (2, 2), (3, 3), (4, 4), (2, 5), (5, 3), (16, 16)]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("mask_name,where,pos", CASES)
def test_tiled_attention_with_a_mask_keeps_hidden_nonfinite_out_of_gradients(mask_name, where, pos, bad, blocks):
    def path(q, k, v, keep):
        return tiled_attention(q, k, v, keep, scale=SCALE, block_q=blocks[0], block_k=blocks[1])

    _check(path, mask_name, where, pos, bad)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("mask_name,where,pos", [c for c in CASES if c[0] != "causal"])
def test_tiled_attention_causal_flag_and_a_mask_keeps_hidden_nonfinite_out_of_gradients(
        mask_name, where, pos, bad, blocks):
    # the causal structure from the flag (tiles skipped or cut by the diagonal), the rest as a mask
    def path(q, k, v, keep):
        return tiled_attention(q, k, v, keep | ~_causal(T), causal=True, scale=SCALE,
                               block_q=blocks[0], block_k=blocks[1])

    _check(path, mask_name, where, pos, bad)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("where,pos", [(w, p) for name, w, p in CASES if name == "causal"])
def test_tiled_attention_causal_only_keeps_hidden_nonfinite_out_of_gradients(where, pos, bad, blocks):
    def path(q, k, v, keep):
        return tiled_attention(q, k, v, causal=True, scale=SCALE, block_q=blocks[0], block_k=blocks[1])

    _check(path, "causal", where, pos, bad)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("cached", [0, 3])
@pytest.mark.parametrize("where,pos", [(w, p) for name, w, p in CASES if name == "causal"])
def test_cached_attention_keeps_hidden_nonfinite_out_of_gradients(where, pos, bad, cached):
    # The new positions come after `cached` positions already in the cache; the last T - cached
    # rows are compared (the earlier ones are not computed by this call).
    if where == "q" and pos < cached:
        pytest.skip("that query is not a new position")

    def path(q, k, v, keep):
        cache = KVCache()
        if cached:
            cache.append(k[..., :cached, :], v[..., :cached, :])
        new = cached_attention(q[..., cached:, :], k[..., cached:, :], v[..., cached:, :], cache, scale=SCALE)
        return torch.cat([torch.zeros_like(q[..., :cached, :1]).expand(*q.shape[:-2], cached, v.shape[-1]), new],
                         dim=-2)  # the rows before `cached` are zero here: not compared, see below

    keep = _masks()["causal"]
    q, k, v, g = _inputs()
    g = g.clone()
    g[..., :cached, :] = 0.0  # the cached rows are not part of this call
    corrupted = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
    corrupted[where][..., pos, :] = bad
    out, dq, dk, dv = _run(path, corrupted["q"], corrupted["k"], corrupted["v"], keep, g)
    want_out, want_dq, want_dk, want_dv = _oracle(q, k, v, keep, g)
    rows, keys = _reachable(keep, where, pos)
    new_rows = torch.arange(T) >= cached
    rows_clean, keys_clean = ~rows & new_rows, ~keep[rows & new_rows].any(dim=0)
    for name, got, want, clean in (("out", out, want_out, rows_clean), ("dq", dq, want_dq, rows_clean),
                                   ("dk", dk, want_dk, keys_clean), ("dv", dv, want_dv, keys_clean)):
        torch.testing.assert_close(got[..., clean, :], want[..., clean, :], **TOL, msg=name)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("where,pos", [("k", 4), ("q", 4), ("v", 4), ("k", 0), ("q", 8)])
def test_sliding_window_paths_keep_hidden_nonfinite_out_of_gradients(where, pos, bad, blocks, causal):
    # the banded structure of chapter 09: tiles outside the band skipped, the band's edges cut
    keep = sliding_window_mask(T, 3, causal=causal)
    q, k, v, g = _inputs()
    corrupted = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
    corrupted[where][..., pos, :] = bad
    want_out, want_dq, want_dk, want_dv = _oracle(q, k, v, keep, g)
    rows, keys = _reachable(keep, where, pos)
    paths = {
        "tiled": lambda q, k, v, keep: sliding_window_tiled_attention(q, k, v, 3, causal, scale=SCALE,
                                                                      block_q=blocks[0], block_k=blocks[1]),
        "dense": lambda q, k, v, keep: sliding_window_attention(q, k, v, 3, causal, scale=SCALE),
    }
    for path_name, path in paths.items():
        out, dq, dk, dv = _run(path, corrupted["q"], corrupted["k"], corrupted["v"], keep, g)
        for name, got, want, clean in (("out", out, want_out, ~rows), ("dq", dq, want_dq, ~rows),
                                       ("dk", dk, want_dk, ~keys), ("dv", dv, want_dv, ~keys)):
            torch.testing.assert_close(got[..., clean, :], want[..., clean, :], **TOL, msg=f"{path_name} {name}")
