"""selfattn.models.tiny_lm: shapes, causality through the mask argument, the blind loss, training."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn import causal_mask
from selfattn.models import (
    TinyLM,
    TinyLMConfig,
    blind_next_token_loss,
    next_token_loss,
    train_next_token,
)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyLM(
        TinyLMConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, d_ff=32, **kw)
    ).eval()


def test_config_validates_sizes():
    with pytest.raises(ValueError, match="divisible"):
        TinyLMConfig(vocab_size=10, d_model=10, n_heads=3)
    with pytest.raises((TypeError, ValueError), match="vocab_size"):
        TinyLMConfig(vocab_size=0)
    with pytest.raises((TypeError, ValueError), match="n_layers"):
        TinyLMConfig(vocab_size=5, n_layers=0)
    with pytest.raises(TypeError, match="TinyLMConfig"):
        TinyLM({"vocab_size": 5})


def test_forward_shape_and_errors():
    model = _model()
    ids = torch.randint(0, 11, (3, 8))
    logits = model(ids, causal_mask(8))
    assert logits.shape == (3, 8, 11) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model(torch.zeros(8, dtype=torch.int64))


def test_with_the_causal_mask_logits_at_t_ignore_later_tokens():
    model = _model(n_layers=2)
    ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 3) % 11
    a, b = model(ids, causal_mask(8)), model(changed, causal_mask(8))
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-6)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3
    # Without the mask the earlier positions change too.
    a, b = model(ids), model(changed)
    assert (a[:, :5] - b[:, :5]).abs().max() > 1e-3


def test_next_token_loss_matches_the_formula():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0, 1, 2], [3, 4, 0]])
    log_probs = logits.log_softmax(-1)
    expected = -sum(log_probs[b, t, targets[b, t]] for b in range(2) for t in range(3)) / 6
    torch.testing.assert_close(next_token_loss(logits, targets), expected, rtol=1e-6, atol=1e-6)
    uniform = torch.zeros(2, 3, 5)
    torch.testing.assert_close(
        next_token_loss(uniform, targets), torch.tensor(math.log(5)), rtol=1e-6, atol=1e-6
    )


def test_blind_loss_equals_the_causal_loss_for_a_causal_model():
    model = _model(n_layers=2)
    ids = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(2))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    causal = next_token_loss(model(inputs, causal_mask(8)), targets).detach()
    blind = blind_next_token_loss(model, inputs, targets, causal=True)
    torch.testing.assert_close(blind, causal, rtol=1e-5, atol=1e-5)
    # Without the mask, the full-window loss (the model sees the target) differs from the blind one.
    unmasked = next_token_loss(model(inputs), targets).detach()
    blind_unmasked = blind_next_token_loss(model, inputs, targets, causal=False)
    assert abs(float(unmasked - blind_unmasked)) > 1e-3


def test_training_lowers_the_loss_and_is_reproducible():
    ids = torch.tensor(
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 30
    )  # a pattern a causal model can learn
    runs = []
    for _ in range(2):
        model = _model()
        runs.append(train_next_token(model, ids, causal=True, steps=60, batch_size=8, lr=1e-2))
        assert not model.training
    losses = runs[0]
    assert len(losses) == 60 and all(math.isfinite(x) for x in losses)
    assert losses[0] > 2.0 and sum(losses[-5:]) / 5 < 0.5
    assert losses == pytest.approx(runs[1], rel=1e-5, abs=1e-6)


def test_training_rejects_zero_steps():
    with pytest.raises((TypeError, ValueError), match="steps"):
        train_next_token(_model(), torch.arange(50) % 11, causal=True, steps=0)


def test_no_position_names_input_ids_with_its_shape():
    # Regression: T = 0 raised an error naming x_q (the attention layer's argument), not input_ids.
    with pytest.raises(ValueError, match=r"input_ids must hold at least one token \(T > 0\); got shape \(2, 0\)"):
        _model()(torch.zeros(2, 0, dtype=torch.long))


# position_ids (chapters 04 and 05: packed documents restart at 0, left-padded prompts start at their first token)


def test_position_ids_read_the_given_rows_of_the_position_table():
    model = _model(n_layers=2).double()
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = causal_mask(5)
    with torch.no_grad():
        default = model(ids, mask)
        assert torch.equal(model(ids, mask, position_ids=torch.arange(5)), default)
        assert torch.equal(model(ids, mask, position_ids=torch.arange(5).expand(2, 5)), default)
        # positions 3..7: the same as a model whose table is rolled by 3 rows, run at positions 0..4
        shifted = model(ids, mask, position_ids=torch.arange(3, 8))
        rolled = _model(n_layers=2).double()
        rolled.position_embedding.copy_(torch.roll(model.position_embedding, -3, dims=0))
        torch.testing.assert_close(shifted, rolled(ids, mask), rtol=0, atol=1e-12)
        assert (shifted - default).abs().max() > 1e-3
        # per row: row 1 at positions 2..6, row 0 at 0..4
        per_row = model(ids, mask, position_ids=torch.stack([torch.arange(5), torch.arange(2, 7)]))
        torch.testing.assert_close(per_row[0], default[0], rtol=0, atol=0)
        torch.testing.assert_close(per_row[1:], model(ids[1:], mask, position_ids=torch.arange(2, 7)), rtol=0, atol=1e-12)


def test_packed_documents_with_restarted_positions_equal_each_document_alone():
    from selfattn import masks

    model = _model(n_layers=2).double()
    docs = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])
    ids = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        packed = model(ids, masks.document_causal_mask(docs[None]), position_ids=masks.document_positions(docs[None]))
        for a, b in ((0, 3), (3, 7), (7, 8)):
            torch.testing.assert_close(packed[:, a:b], model(ids[:, a:b], causal_mask(b - a)), rtol=0, atol=1e-12)


def test_bad_position_ids_name_the_argument():
    model = _model()
    ids = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor; got dtype torch.float32"):
        model(ids, position_ids=torch.arange(4.0))
    with pytest.raises(TypeError, match="position_ids"):
        model(ids, position_ids=[0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"position_ids must have the shape of input_ids \(2, 4\)"):
        model(ids, position_ids=torch.arange(3))
    with pytest.raises(ValueError, match=r"block_size=8\); got values from 5 to 8"):
        model(ids, position_ids=torch.arange(5, 9))
    with pytest.raises(ValueError, match="got values from -1"):
        model(ids, position_ids=torch.arange(-1, 3))
