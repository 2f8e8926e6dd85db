"""Chapter 14's claims: a GPT built from the course's blocks (with RoPE) learns real text (validation
loss below the unigram baseline within a fixed step budget), decodes with the KV cache exactly as
without it, runs past its training length (where its loss is measured higher), round-trips through
safetensors; and attention learns to address (claim 20)."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn.checkpoint import load_checkpoint, save_checkpoint
from selfattn.data import CharTokenizer, load_corpus
from selfattn.experiments.positions import position_losses, validation_windows
from selfattn.experiments.retrieval import (
    RetrievalConfig,
    RetrievalModel,
    addressing_accuracy,
    make_retrieval_batch,
    retrieval_accuracy,
    train_retrieval,
)
from selfattn.models.gpt import GPT, GPTConfig, train_lm, unigram_cross_entropy


@pytest.fixture(scope="module")
def trained(one_thread):
    """The test's budget (smaller than the chapter's): 250 steps of 16 windows of 32 characters, RoPE.

    Measured (seed 0, CPU): 5-15 s, validation loss 2.18 nats/char (2.16 with seed 1; 2.49 with the
    learned table the chapter used before); unigram baseline 3.19, uniform 4.54."""
    text = load_corpus()
    tokenizer = CharTokenizer(text)
    ids = tokenizer.encode(text)
    split = int(0.9 * ids.numel())
    train_ids, val_ids = ids[:split], ids[split:]
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=32, d_model=48, n_heads=4, n_layers=2, d_ff=192,
        positions="rope",
    )
    model = GPT(config)
    log = train_lm(
        model, train_ids, val_ids, steps=250, batch_size=16, lr=5e-3, eval_every=125, progress=False
    )
    return model, log, tokenizer, train_ids, val_ids


def test_training_brings_validation_loss_below_the_baselines(trained):
    model, log, tokenizer, train_ids, val_ids = trained
    unigram = unigram_cross_entropy(train_ids, val_ids, tokenizer.vocab_size)
    uniform = math.log(tokenizer.vocab_size)
    assert all(math.isfinite(v) for v in log.train_loss + log.val_loss)
    assert unigram == pytest.approx(3.19, abs=0.05) and uniform == pytest.approx(
        math.log(94), abs=1e-9
    )
    # Threshold 2.75: the measured 2.18 plus a wide margin; 0.44 nats below the unigram baseline.
    assert log.val_loss[-1] < 2.75, log.val_loss
    assert log.val_loss[-1] < unigram - 0.4 and log.val_loss[0] > log.val_loss[-1]


def test_sampling_with_the_cache_equals_sampling_without(trained):
    model, _, tokenizer, _, _ = trained
    prompt = tokenizer.encode("The value of ").repeat(3, 1)
    for kw in ({"greedy": True}, {"temperature": 0.8}):
        a = model.generate(
            prompt, 19, generator=torch.Generator().manual_seed(7), use_cache=True, **kw
        )
        b = model.generate(
            prompt, 19, generator=torch.Generator().manual_seed(7), use_cache=False, **kw
        )
        assert torch.equal(a, b), (tokenizer.decode(a[0]), tokenizer.decode(b[0]))


def test_rope_gpt_runs_past_its_training_length(trained):
    """Measured (seeds 0 and 1): loss on 32 fixed validation windows 2.11 / 2.06 at 32 characters (the
    training length), 2.21 / 2.18 at 64, 2.48 / 2.52 at 128: a rise of 0.37 / 0.46 at four times the
    training length. The chapter's model (64 characters, 800 steps) measures 1.52 at 64 and 2.88 at 256."""
    model, _, tokenizer, _, val_ids = trained
    prompt = tokenizer.encode("The value of ").repeat(2, 1)
    a = model.generate(prompt, 90, temperature=0.8, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 90, temperature=0.8, generator=torch.Generator().manual_seed(3), use_cache=False)
    assert a.shape == (2, 103) and torch.equal(a, b)  # 103 > block_size = 32, with and without the cache
    windows, targets = validation_windows(val_ids, 128, 32)
    loss = {L: float(position_losses(model, windows[:, :L], targets[:, :L]).mean()) for L in (32, 128)}
    assert all(math.isfinite(v) for v in loss.values())
    # Running is not predicting well: at four times the training length the loss is higher
    # (threshold 0.2, well under the smaller measured rise, 0.37).
    assert loss[128] > loss[32] + 0.2, loss


def test_trained_checkpoint_round_trips(trained, tmp_path):
    model, log, tokenizer, _, val_ids = trained
    path = save_checkpoint(
        model, tmp_path / "gpt.safetensors", extra={"val_loss": f"{log.val_loss[-1]:.4f}"}
    )
    loaded = load_checkpoint(path, GPT, GPTConfig)
    ids = val_ids[:32][None]
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_claim_20_attention_learns_to_address(one_thread):
    """Measured (seed 0, 300 steps, about 1 s single-threaded): accuracy 1.00, top-1 addressing 1.00,
    mean weight on the matching pair 0.91; with W_Q and W_K frozen at zero (no addressing possible)
    the same training stays far below."""
    torch.manual_seed(0)
    model = RetrievalModel(RetrievalConfig())
    log = train_retrieval(model, steps=300, lr=3e-3, seed=0, snapshot_every=10)
    test = make_retrieval_batch(model.config, 2000, torch.Generator().manual_seed(99))
    assert retrieval_accuracy(model, test) >= 0.95
    top, mean_weight = addressing_accuracy(model, test)
    assert top >= 0.95 and mean_weight >= 0.75
    where = log.example.where.item()
    assert abs(log.snapshots[0][where] - 1 / 8) < 0.05  # uniform over 8 pairs before training
    assert log.snapshots[-1][where] > 0.6
    # Every key, used as the query, scores highest against itself as a key (measured margin 12.6).
    with torch.no_grad():
        E = model.key_embedding.weight  # (16, D)
        scores = ((E + model.no_value) @ model.attn.W_Q) @ (E @ model.attn.W_K).T  # (16, 16)
    assert torch.equal(scores.argmax(dim=1), torch.arange(16))

    torch.manual_seed(0)
    frozen = RetrievalModel(RetrievalConfig())
    with torch.no_grad():
        frozen.attn.W_Q.zero_()
        frozen.attn.W_K.zero_()
    frozen.attn.W_Q.requires_grad_(False)
    frozen.attn.W_K.requires_grad_(False)
    train_retrieval(frozen, steps=300, lr=3e-3, seed=0)
    assert retrieval_accuracy(frozen, test) < 0.5
