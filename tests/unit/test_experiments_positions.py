"""selfattn.experiments.positions: the comparison of position schemes past the training length, on a
tiny configuration (a few seconds): structure, determinism, None for a learned table past its rows,
losses recomputed by hand, the fixed windows, the RoPE rescalings and the argument errors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from selfattn.data import CharTokenizer, load_corpus
from selfattn.experiments.positions import (
    ROPE_SCALINGS,
    ExtrapolationResult,
    compare_position_schemes,
    evaluate_rope_scaling,
    position_losses,
    validation_windows,
)
from selfattn.models.gpt import GPT, GPTConfig, train_lm
from selfattn.positions import POSITION_SCHEMES, RotaryPositions

TINY = dict(train_length=8, eval_lengths=(8, 16), steps=6, batch_size=4, d_model=16, n_heads=2, n_layers=1,
            d_ff=32, eval_windows=5, seed=0, progress=False)


@pytest.fixture(scope="module")
def data():
    text = load_corpus()[:20000]
    tokenizer = CharTokenizer(text)
    ids = tokenizer.encode(text)
    split = int(0.9 * ids.numel())
    return ids[:split], ids[split:], tokenizer.vocab_size


@pytest.fixture(scope="module")
def tiny(data, one_thread):
    train_ids, val_ids, V = data
    return compare_position_schemes(train_ids, val_ids, V, **TINY), compare_position_schemes(
        train_ids, val_ids, V, **TINY
    )


def _finite(x):
    return x is not None and math.isfinite(x)


def test_structure_and_none_for_learned_past_its_table(tiny, data):
    result, _ = tiny
    assert isinstance(result, ExtrapolationResult)
    assert result.schemes == POSITION_SCHEMES and result.train_length == 8 and result.eval_lengths == (8, 16)
    for name in POSITION_SCHEMES:
        assert set(result.loss[name]) == {8, 16}
        assert len(result.train_loss[name]) == 6 and all(map(_finite, result.train_loss[name]))
        assert result.seconds[name] > 0
    assert result.loss["learned"][16] is None and _finite(result.loss["learned"][8])
    assert len(result.position_loss["learned"]) == 8  # only its table's positions
    for name in ("sinusoidal", "rope", "alibi", "none"):
        assert all(map(_finite, result.loss[name].values())), name
        assert len(result.position_loss[name]) == 16 and all(map(_finite, result.position_loss[name]))
        # The mean over the first L positions of the longest windows is the loss at length L (causal).
        for L in (8, 16):
            curve_mean = sum(result.position_loss[name][:L]) / L
            assert abs(result.loss[name][L] - curve_mean) < 1e-5, (name, L)
    assert tuple(result.rope_scaling) == ROPE_SCALINGS
    for method in ROPE_SCALINGS:
        assert set(result.rope_scaling[method]) == {16} and _finite(result.rope_scaling[method][16])
    assert result.uniform == pytest.approx(math.log(data[2]), abs=1e-12) and result.unigram < result.uniform
    # Six training steps barely move a model from the uniform guess log V.
    assert 0.5 * result.uniform < result.loss["rope"][8] < 1.2 * result.uniform
    assert result.settings["steps"] == 6 and result.settings["seed"] == 0
    learned_extra = result.settings["n_parameters"]["learned"] - result.settings["n_parameters"]["rope"]
    assert learned_extra == 8 * 16  # the table: train_length x d_model
    assert result.total_seconds == pytest.approx(sum(result.seconds.values()))


def test_two_runs_are_equal(tiny):
    a, b = tiny
    for field in dataclasses.fields(ExtrapolationResult):
        if field.name not in ("seconds", "models"):  # wall-clock time is the one thing that may differ
            assert getattr(a, field.name) == getattr(b, field.name), field.name
    assert list(a.models) == list(POSITION_SCHEMES)
    for name, model in a.models.items():  # and the trained weights are equal, bit for bit
        assert isinstance(model, GPT) and model.config.positions == name and not model.training
        other = b.models[name].state_dict()
        for key, t in model.state_dict().items():
            assert torch.equal(t, other[key]), (name, key)


def test_a_length_loss_recomputed_by_hand(data, tiny):
    # Rebuild the ALiBi model the way the comparison promises (seed, batches, steps) and compute
    # the loss on the fixed windows with cross_entropy directly.
    result, _ = tiny
    train_ids, val_ids, V = data
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, positions="alibi"))
    train_lm(model, train_ids, val_ids, steps=6, batch_size=4, lr=3e-3, eval_every=6, eval_batches=1, seed=0,
             progress=False)
    for key, t in model.state_dict().items():  # the same training run, bit for bit
        assert torch.equal(t, result.models["alibi"].state_dict()[key]), key
    inputs, targets = validation_windows(val_ids, 16, 5)
    with torch.no_grad():
        for L in (8, 16):
            logits = model(inputs[:, :L])  # (5, L, V)
            expected = F.cross_entropy(logits.reshape(-1, V), targets[:, :L].reshape(-1)).item()
            assert abs(result.loss["alibi"][L] - expected) < 1e-5, L


def test_table_and_rows(tiny):
    result, _ = tiny
    rows = dict(result.rows())
    assert list(rows) == [*POSITION_SCHEMES, "rope + interpolation", "rope + NTK base"]
    assert rows["learned"] == [result.loss["learned"][8], None]
    assert rows["rope + NTK base"] == [result.loss["rope"][8], result.rope_scaling["ntk"][16]]
    text = result.table()
    assert text.splitlines()[0].split()[-2:] == ["8", "16"] and len(text.splitlines()) == 9
    assert text.splitlines()[1].split()[-1] == "-"  # learned at 16


def test_validation_windows_are_fixed_and_evenly_spaced():
    ids = torch.arange(20)
    inputs, targets = validation_windows(ids, 4, 3)
    # starts 0, round(15 / 2) = 8, 15: the last start leaves one target after the window.
    assert inputs.tolist() == [[0, 1, 2, 3], [8, 9, 10, 11], [15, 16, 17, 18]]
    assert torch.equal(targets, inputs + 1) and inputs.dtype == torch.int64
    single, _ = validation_windows(ids, 19, 1)
    assert single.tolist() == [list(range(19))]
    with pytest.raises(ValueError, match=r"ids must hold more than length=20 tokens; got shape \(20,\)"):
        validation_windows(ids, 20, 1)
    with pytest.raises(TypeError, match="integer token ids"):
        validation_windows(ids.float(), 4, 3)
    with pytest.raises((TypeError, ValueError), match="n_windows"):
        validation_windows(ids, 4, 0)


def test_position_losses_of_a_uniform_model_are_log_v():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, block_size=4, d_model=8, n_heads=2, d_ff=16))
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()  # every logit 0: p = 1/7 everywhere
    inputs, targets = validation_windows(torch.arange(50) % 7, 12, 5)
    curve = position_losses(model, inputs, targets, batch_size=2)
    assert curve.shape == (12,) and curve.dtype == torch.float64
    torch.testing.assert_close(curve, torch.full((12,), math.log(7), dtype=torch.float64), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"one shape \(W, L\); got \(5, 12\) and \(5, 11\)"):
        position_losses(model, inputs, targets[:, :11])


def test_evaluate_rope_scaling_uses_the_rescaled_angles_and_restores_the_scheme(data):
    train_ids, val_ids, V = data
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, rope_base=100.0))
    own = model.positions
    inputs, targets = validation_windows(val_ids, 24, 3)
    scaled = evaluate_rope_scaling(model, inputs, targets, (8, 16, 24), train_length=8)
    assert model.positions is own  # restored
    assert tuple(scaled) == ROPE_SCALINGS and all(set(v) == {16, 24} for v in scaled.values())
    d_head = 8

    def loss_with(scheme, L):
        model.positions = scheme
        try:
            with torch.no_grad():
                return F.cross_entropy(model(inputs[:, :L]).reshape(-1, V), targets[:, :L].reshape(-1)).item()
        finally:
            model.positions = own

    for L in (16, 24):
        s = L / 8
        pi = loss_with(RotaryPositions(d_head, base=100.0, interpolation=s), L)
        ntk = loss_with(RotaryPositions(d_head, base=100.0 * s ** (d_head / (d_head - 2))), L)  # bloc97's formula
        assert abs(scaled["interpolation"][L] - pi) < 1e-5 and abs(scaled["ntk"][L] - ntk) < 1e-5
        plain = loss_with(own, L)
        assert abs(pi - plain) > 1e-4 and abs(ntk - plain) > 1e-4  # both change the model's output

    alibi = GPT(GPTConfig(vocab_size=V, block_size=8, d_model=16, n_heads=2, d_ff=32, positions="alibi"))
    with pytest.raises(TypeError, match="RotaryPositions.*got ALiBiPositions"):
        evaluate_rope_scaling(alibi, inputs, targets, (16,), train_length=8)
    with pytest.raises(ValueError, match="longer than the windows"):
        evaluate_rope_scaling(model, inputs, targets, (16, 32), train_length=8)
    with pytest.raises(ValueError, match="increasing"):
        evaluate_rope_scaling(model, inputs, targets, (16, 16), train_length=8)
    assert model.positions is own


def test_without_rope_there_is_no_scaling_row(data):
    train_ids, val_ids, V = data
    result = compare_position_schemes(train_ids, val_ids, V, **dict(TINY, steps=1), schemes=("alibi",))
    assert result.schemes == ("alibi",) and result.rope_scaling == {}
    assert [label for label, _ in result.rows()] == ["alibi"]


def test_argument_errors(data):
    train_ids, val_ids, V = data
    kw = dict(TINY, steps=1)

    def call(**over):
        args = dict(train_ids=train_ids, val_ids=val_ids, vocab_size=V)
        args.update({k: over.pop(k) for k in list(over) if k in args})
        return compare_position_schemes(args["train_ids"], args["val_ids"], args["vocab_size"], **dict(kw, **over))

    cases = [
        (dict(schemes=("rope", "xpos")), r"schemes must hold names from \('learned'.*got 'xpos'"),
        (dict(schemes=("rope", "rope")), "must not repeat"),
        (dict(schemes="rope"), "non-empty sequence"),
        (dict(schemes=()), "non-empty sequence"),
        (dict(eval_lengths=(16, 8)), "eval_lengths must be increasing"),
        (dict(eval_lengths=()), "eval_lengths must be a non-empty"),
        (dict(eval_lengths=(8, 10**6)), r"val_ids must hold more than max\(eval_lengths\)=1000000"),
        (dict(lr=0.0), "lr must be a finite number > 0"),
        (dict(lr=math.nan), "lr must be a finite number > 0"),
        (dict(vocab_size=5), r"train_ids must hold ids in \[0, vocab_size=5\)"),
        (dict(d_model=6, n_heads=2), r"positions='rope' does not fit d_model=6, n_heads=2"),
        (dict(seed=1.5), "seed must be an int"),
    ]
    for over, message in cases:
        with pytest.raises(ValueError, match=message):
            call(**over)
    with pytest.raises(TypeError, match="val_ids must hold integer token ids"):
        call(val_ids=val_ids.float())
    with pytest.raises((TypeError, ValueError), match="steps"):
        call(steps=0)
    with pytest.raises((TypeError, ValueError), match="eval_windows"):
        call(eval_windows=0)
    with pytest.raises((TypeError, ValueError), match="progress"):
        call(progress=1)
