"""selfattn.experiments.sinks on a tiny model: the training windows' layout (chapter 11c's text) and the
window caches compared at equal size, as StreamingLLM compares them (review finding 13)."""

import numpy as np
import pytest
import torch

from selfattn.experiments.sinks import bos_batch, stream_losses
from selfattn.inference.streaming import _streamed_losses, make_caches
from selfattn.models.gpt import GPT, GPTConfig


def test_bos_batch_layout_bos_a_stretch_and_its_copy_cut_to_the_window():
    ids = torch.arange(100, 400)
    x, y = bos_batch(ids, 4, 8, bos=999, generator=torch.Generator().manual_seed(0), repeat_share=0.5)
    assert x.shape == y.shape == (4, 8)
    for r in range(4):
        assert int(x[r, 0]) == 999  # BOS, then 7 tokens
        start = int(x[r, 1])
        if r < 2:  # a stretch of 4 and the first 3 of its copy; the targets hold the 4th
            assert x[r, 1:].tolist() == list(range(start, start + 4)) + list(range(start, start + 3))
            assert y[r].tolist() == list(range(start, start + 4)) + list(range(start, start + 4))
        else:  # plain text
            assert x[r, 1:].tolist() == list(range(start, start + 7))
            assert y[r].tolist() == list(range(start, start + 8))


def test_stream_losses_compares_caches_of_equal_size_and_one_slot_more():
    torch.manual_seed(0)
    vocab = 11
    model = GPT(GPTConfig(vocab_size=vocab + 1, block_size=16, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                          positions="rope")).eval()
    ids = torch.randint(0, vocab, (400,), generator=torch.Generator().manual_seed(1))
    out = stream_losses(model, ids, vocab, window=4, n_streams=2, length=24, stretches=((0, 4), (4, 16), (16, 24)))
    assert set(out) == {"full cache (first 16)", "window 4, no sink", "BOS + window 3", "BOS + window 4"}
    no_sink, kept, wider = out["window 4, no sink"], out["BOS + window 3"], out["BOS + window 4"]
    assert abs(wider[(0, 4)] - kept[(0, 4)]) < 1e-6  # 5 slots: nothing evicted before position 4 either
    assert all(np.isfinite(list(d.values())).all() for d in out.values())
    # 4 slots each: the same cache until the BOS is evicted, then different ones
    assert abs(no_sink[(0, 4)] - kept[(0, 4)]) < 1e-6 and abs(no_sink[(4, 16)] - kept[(4, 16)]) > 1e-4
    # the BOS + window 3 row is a cache of 1 sink and a window of 3: 4 slots, the no-sink window's size
    starts = torch.linspace(0, ids.numel() - 24 - 1, 2).long().tolist()
    text = torch.stack([ids[i:i + 24] for i in starts])
    inputs = torch.cat([torch.full((2, 1), vocab), text[:, :-1]], 1)
    caches = make_caches(model, 3, 1)
    curve = _streamed_losses(model, inputs, text, caches)
    assert abs(float(curve[:, 4:16].mean()) - kept[(4, 16)]) < 1e-9
    assert all(c.capacity == 4 for c in caches)
    assert all(c.capacity == 5 for c in make_caches(model, 4, 1))  # the wider row: one slot more
    with pytest.raises(ValueError, match="window"):
        stream_losses(model, ids, vocab, window=1, n_streams=2, length=24, stretches=((0, 4),))
