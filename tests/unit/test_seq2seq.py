"""The encoder-decoder of chapter 05: shapes, causality, errors, the reversal task, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn.block import BlockConfig
from selfattn.models.seq2seq import (
    BOS,
    DecoderBlock,
    Seq2Seq,
    Seq2SeqConfig,
    alignment_score,
    greedy_decode,
    held_out_reversal,
    sample_reversal,
    teacher_forcing_input,
    train_reversal,
    training_batch,
)


def _model(**kwargs):
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(**kwargs)).eval()


def test_shapes_of_logits_and_cross_weights():
    model = _model(length=6, n_dec_layers=2)
    src, tgt = sample_reversal(3, 6, torch.Generator().manual_seed(0))
    logits, cross = model(src, teacher_forcing_input(tgt))
    assert logits.shape == (3, 6, 10) and torch.isfinite(logits).all()
    assert len(cross) == 2 and all(w.shape == (3, 2, 6, 6) for w in cross)
    torch.testing.assert_close(cross[0].sum(-1), torch.ones(3, 2, 6))  # each query row is a softmax over S
    assert greedy_decode(model, src).shape == (3, 6)


def test_decoder_is_causal_and_reads_the_source():
    model = _model(length=6)
    src, tgt = sample_reversal(2, 6, torch.Generator().manual_seed(1))
    tgt_in = teacher_forcing_input(tgt)
    with torch.no_grad():
        logits, _ = model(src, tgt_in)
        changed = tgt_in.clone()
        changed[:, 4] = (changed[:, 4] + 1) % 10
        moved = (model(src, changed)[0] - logits).abs().amax(dim=(0, 2))  # (T,)
        assert moved[:4].max() == 0 and moved[4:].min() > 0  # later inputs never reach earlier outputs
        other_src = (src + 1) % 10
        assert (model(other_src, tgt_in)[0] - logits).abs().amax(dim=(0, 2)).min() > 0  # every row reads the source


def test_decoder_block_cross_attention_reads_memory_of_another_length():
    torch.manual_seed(0)
    block = DecoderBlock(BlockConfig(16, 2, 32)).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    out, w = block(x, memory)
    assert out.shape == (2, 3, 16) and w.shape == (2, 2, 3, 5)
    with pytest.raises(TypeError, match="BlockConfig"):
        DecoderBlock(16)


def test_teacher_forcing_and_reversal_data():
    src, tgt = sample_reversal(4, 5, torch.Generator().manual_seed(0))
    assert torch.equal(tgt, src.flip(1)) and src.dtype == torch.int64
    tgt_in = teacher_forcing_input(tgt)
    assert (tgt_in[:, 0] == BOS).all() and torch.equal(tgt_in[:, 1:], tgt[:, :-1])


def test_training_batches_never_contain_a_held_out_string():
    config = Seq2SeqConfig(length=2, batch=200, n_eval=50)  # 100 strings: collisions are certain
    held_src, _ = held_out_reversal(config)
    gen = torch.Generator().manual_seed(0)
    held = {tuple(s) for s in held_src.tolist()}
    for _ in range(5):
        src, tgt = training_batch(config, gen, held_src)
        assert not held & {tuple(s) for s in src.tolist()} and torch.equal(tgt, src.flip(1))


def test_alignment_score_of_perfect_and_uniform_weights():
    n = 5
    perfect = torch.eye(n).flip(1).expand(3, 2, n, n)  # row i on column n - 1 - i
    assert alignment_score(perfect) == (1.0, 1.0)
    uniform = torch.full((3, 2, n, n), 1 / n)
    assert alignment_score(uniform)[1] == pytest.approx(1 / n)
    with pytest.raises(ValueError, match="T == S"):
        alignment_score(torch.ones(1, 1, 3, 4))
    with pytest.raises(ValueError, match="cross_weights"):
        alignment_score(torch.ones(3, 4))


def test_errors_name_the_argument():
    model = _model(length=4)
    good = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(TypeError, match="src"):
        model(good.float(), good)
    with pytest.raises(ValueError, match="src"):
        model(torch.full((2, 4), 10), good)  # BOS is not a source digit
    with pytest.raises(ValueError, match="tgt_in"):
        model(good, torch.zeros(2, 5, dtype=torch.long))  # longer than length
    with pytest.raises(ValueError, match="batch size"):
        model(good, torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="Seq2SeqConfig"):
        Seq2Seq(BlockConfig(16, 2, 32))


@pytest.mark.parametrize("kwargs", [{"length": 1}, {"d_model": 30, "n_heads": 4}, {"lr": 0.0}, {"steps": 0}])
def test_config_refuses_bad_sizes(kwargs):
    with pytest.raises((ValueError, TypeError)):
        Seq2SeqConfig(**kwargs)


def test_training_is_deterministic_and_restores_the_thread_count():
    config = Seq2SeqConfig(steps=4, n_eval=32)
    threads = torch.get_num_threads()
    first, second = train_reversal(config, seed=1), train_reversal(config, seed=1)
    assert torch.get_num_threads() == threads
    assert len(first.losses) == 4 and all(math.isfinite(v) for v in first.losses)
    assert first.losses == second.losses and first.exact_match == second.exact_match
    assert train_reversal(config, seed=1, steps=2).losses == first.losses[:2]


def test_config_refuses_more_held_out_strings_than_half_of_all():
    """Length 2 has 100 strings: holding out 1000 (or all 100) left none to train on, and the sampler,
    which redraws held-out strings, looped for ever."""
    from selfattn.models.seq2seq import Seq2SeqConfig

    with pytest.raises(ValueError, match="n_eval must be at most half of the 100 strings of length 2"):
        Seq2SeqConfig(length=2, n_eval=1000)
    Seq2SeqConfig(length=2, n_eval=50)
