"""Chapter 14's claims: a GPT built from the course's blocks (with RoPE) learns real text (validation
loss below the unigram baseline within a fixed step budget), decodes with the KV cache exactly as
without it, runs past its training length (where its loss is measured higher), round-trips through
safetensors; attention learns to address (claim 20); and a two-layer attention-only model trained on
repeated random spans forms a previous-token head and induction heads whose ablation removes the
in-context drop in loss (claim 31); the live model in the page is the trained model, exported to ONNX."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn.checkpoint import load_checkpoint, save_checkpoint
from selfattn.data import CharTokenizer, load_corpus
from selfattn.experiments.induction import (
    InductionConfig,
    composition_baseline,
    composition_scores,
    repeated_spans,
    train_induction,
)
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


def test_the_live_model_is_the_trained_model(trained):
    """The live model section: the trained model exported to ONNX (the file the page runs) computes the
    torch model's logits and attention weights, run by Python's onnxruntime, within 1e-4 on prompts
    shorter and longer than block_size; the panel stores the torch model's values and greedy text.
    (The browser's side: tests/book/test_live.py.)"""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    from selfattn.live import LivePanel, decode_float32

    model, _, tokenizer, _, _ = trained
    panel = LivePanel(model, tokenizer, ["The value of ", "the object the obj"], max_new_tokens=32,
                      check_new_tokens=16)
    session = ort.InferenceSession(panel.onnx, providers=["CPUExecutionProvider"])
    for text in ("T", "The value of ", "The object is called with the arguments. " * 3):  # 1, 13, 123 > 32
        ids = tokenizer.encode(text)[None]
        with torch.no_grad():
            logits, weights = model(ids, return_weights=True)
        onnx_logits, onnx_weights = session.run(None, {"input_ids": ids.numpy()})
        d_logits = float(np.abs(onnx_logits - logits.numpy()).max())
        d_weights = float(np.abs(onnx_weights - torch.stack(weights)[:, 0].numpy()).max())
        assert d_logits < 1e-4 and d_weights < 1e-4, (text, d_logits, d_weights)  # NaN fails too
    for entry in panel.expected_payload():
        ids = torch.tensor(entry["ids"])[None]
        with torch.no_grad():
            logits = model(ids)[0]
            greedy = model.generate(ids, 16, greedy=True, use_cache=False)
        assert torch.equal(torch.from_numpy(decode_float32(entry["logits"], tuple(logits.shape))), logits)
        assert entry["greedy"]["text"] == tokenizer.decode(greedy[0, ids.shape[1]:])
    # The long probe the browser test runs past block_size: GPT.forward's values, which the ONNX file gives too.
    long = panel.long_payload()
    T, row0, V = long["T"], long["row0"], tokenizer.vocab_size
    assert model.config.block_size < T <= panel.max_positions and long["rows"] == T - row0 == 8
    onnx_logits, onnx_weights = session.run(None, {"input_ids": np.asarray([long["ids"]], dtype=np.int64)})
    stored_weights = decode_float32(long["weights"], (model.config.n_layers, model.config.n_heads, 8, T))
    d_logits = float(np.abs(decode_float32(long["logits"], (T, V)) - onnx_logits[0]).max())
    d_weights = float(np.abs(stored_weights - onnx_weights[:, :, row0:, :]).max())
    assert d_logits < 1e-4 and d_weights < 1e-4, (T, d_logits, d_weights)  # NaN fails too


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


@pytest.fixture(scope="module")
def induction():
    """The chapter's run: InductionConfig() (V = T = 32, span 12, D = 32, 2 layers x 4 heads, 1500 steps),
    seed 0, one thread; 40-60 s on a shared 2-core machine. Evaluated on 512 fresh sequences.

    Measured (seeds 0 / 1 / 2): loss on the first occurrence 3.60 / 3.59 / 3.59, second 0.63 / 0.62 / 0.55;
    best previous-token score 0.93 / 0.86 / 0.99 (layer 0, one head), induction scores of the four layer-1
    heads 0.64-0.77; ablating the previous-token head removes 77 % / 64 % / 76 % of the drop (the same from
    layer 1's keys alone, about 0 % from its queries or values), the induction heads 99 % / 100 % / 100 %,
    any other head at most 0 %; K-composition previous-token -> induction heads 0.35-0.39, other layer-0
    heads at most 0.11, random baseline 0.175."""
    config = InductionConfig()
    model = train_induction(config, seed=0).model
    batch = repeated_spans(512, config, torch.Generator().manual_seed(10_000))
    return model, config, batch


def _forward(model, ids, ablate=(), means=None, keys_only=False):
    """The model's logits with heads' contexts replaced by ``means`` (written out here, not
    selfattn's run_ablated): everywhere, or (``keys_only``) only in what layer 1 reads as keys."""
    with torch.no_grad():
        clean = model.embed(ids)
        patched = clean
        weights = []
        for layer in range(model.config.n_layers):
            if keys_only:
                contexts, w = model.head_contexts(layer, clean, patched, clean)
            else:
                contexts, w = model.head_contexts(layer, patched)
            out = model.write(layer, contexts)
            swapped = contexts.clone()
            for lay, h in ablate:
                if lay == layer:
                    swapped[:, h] = means[lay, h]
            patched = patched + model.write(layer, swapped)
            clean = clean + out
            weights.append(w)
        return model.unembed(clean if keys_only else patched), weights


def _span_loss(logits, batch):
    """Mean loss of predicting span tokens 1 .. S-1 of the first and of the second occurrence."""
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), batch.ids[:, 1:], reduction="none")
    result = []
    for start in (batch.first, batch.second):
        at = start[:, None] + torch.arange(batch.span - 1)  # (B, S - 1): positions predicting the next span token
        result.append(float(losses.gather(1, at).mean()))
    return result


def _scores(weights, batch):
    """(previous-token, induction) scores, (L, H) each, by direct indexing."""
    prev = torch.stack([w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)) for w in weights])
    S = batch.span
    ind = []
    for w in weights:
        total = torch.zeros(w.shape[1])
        for b in range(w.shape[0]):
            f, s = int(batch.first[b]), int(batch.second[b])
            total += sum(w[b, :, s + i, f + i + 1] for i in range(S - 1))
        ind.append(total / (w.shape[0] * (S - 1)))
    return prev, torch.stack(ind)


def _means(model, batch):
    """Each head's context averaged over all positions of the batch: (L, H, Dh)."""
    with torch.no_grad():
        x = model.embed(batch.ids)
        means = []
        for layer in range(model.config.n_layers):
            contexts, _ = model.head_contexts(layer, x)
            means.append(contexts.mean(dim=(0, 2)))
            x = x + model.write(layer, contexts)
    return torch.stack(means)


def test_claim_31_the_second_occurrence_of_a_random_span_costs_far_less(induction):
    model, config, batch = induction
    logits, _ = _forward(model, batch.ids)
    assert torch.isfinite(logits).all()
    first, second = _span_loss(logits, batch)
    assert abs(first - math.log(32)) < 0.3  # measured 3.60: a random token cannot be predicted
    assert second < 1.2 and first - second > 2.0  # measured 0.63: copied from the context


def test_claim_31_a_previous_token_head_forms_in_layer_0_and_induction_heads_in_layer_1(induction):
    model, config, batch = induction
    _, weights = _forward(model, batch.ids)
    prev, ind = _scores(weights, batch)
    # a uniform causal head scores about 0.12 (previous-token) and 0.05 (induction) here
    assert int(prev.argmax()) // config.n_heads == 0 and float(prev.max()) > 0.6  # measured 0.93
    assert int(ind.argmax()) // config.n_heads == 1 and float(ind.max()) > 0.5  # measured 0.75
    assert float(prev[1].max()) < 0.3 and float(ind[0].max()) < 0.3


def test_claim_31_ablating_the_circuit_removes_the_in_context_drop(induction):
    model, config, batch = induction
    _, weights = _forward(model, batch.ids)
    prev, ind = _scores(weights, batch)
    first, second = _span_loss(_forward(model, batch.ids)[0], batch)
    drop = first - second
    means = _means(model, batch)
    prev_heads = [(0, h) for h in range(config.n_heads) if prev[0, h] > 0.3]
    ind_heads = [(1, h) for h in range(config.n_heads) if ind[1, h] > 0.3]
    others = [(lay, h) for lay in range(2) for h in range(config.n_heads) if (lay, h) not in prev_heads + ind_heads]
    assert prev_heads and ind_heads and others

    def removed(heads, keys_only=False):
        f, s = _span_loss(_forward(model, batch.ids, heads, means, keys_only)[0], batch)
        return 1 - (f - s) / drop

    assert removed(prev_heads) > 0.5  # measured 0.77 (0.64 with seed 1)
    assert removed(ind_heads) > 0.7  # measured 0.99
    assert max(removed([head]) for head in others) < 0.2  # measured below 0
    # K-composition: removing the previous-token head from layer 1's keys alone does it
    assert removed(prev_heads, keys_only=True) > 0.5  # measured 0.77


def test_claim_31_the_induction_heads_keys_read_the_previous_token_head(induction):
    """Elhage et al.'s K-composition score of (previous-token head, induction head) pairs, against
    random matrices of the same shapes (measured: 0.35 against 0.175; other layer-0 heads <= 0.11)."""
    model, config, batch = induction
    _, weights = _forward(model, batch.ids)
    prev, ind = _scores(weights, batch)
    p = [h for h in range(config.n_heads) if prev[0, h] > 0.3]
    i = [h for h in range(config.n_heads) if ind[1, h] > 0.3]
    rest = [h for h in range(config.n_heads) if h not in p]
    k = composition_scores(model)["keys"]
    base = composition_baseline(config.d_model, config.d_head, n=200)["keys"]
    assert torch.isfinite(k).all() and 0.1 < base < 0.3
    assert float(k[p][:, i].min()) > base + 0.05 and float(k[p][:, i].min()) > float(k[rest][:, i].max()) + 0.05
