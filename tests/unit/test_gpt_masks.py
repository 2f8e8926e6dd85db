"""GPT with an attention_mask and position_ids: packed documents and left-padded batched generation
(chapters 04 and 05). Oracles: each document or prompt run alone through the same model."""

from __future__ import annotations

import pytest
import torch

from selfattn import masks
from selfattn.models.gpt import GPT, GPTConfig

PROMPTS = [[3, 4, 5, 6, 7], [9, 2], [1, 1, 2, 3]]


def _model(positions, seed=0):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=20, block_size=32, d_model=16, n_heads=2, n_layers=2, d_ff=32, positions=positions)
    return GPT(config).double().eval()


def _left_padded(prompts):
    T0 = max(map(len, prompts))
    ids = torch.zeros(len(prompts), T0, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), T0, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, T0 - len(p):] = torch.tensor(p)
        attention_mask[b, T0 - len(p):] = 1
    return ids, attention_mask


@pytest.mark.parametrize("positions", ["rope", "learned", "sinusoidal", "alibi", "none"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_generates_what_each_prompt_generates_alone(positions, use_cache):
    model = _model(positions)
    ids, attention_mask = _left_padded(PROMPTS)
    n_new, T0 = 6, ids.shape[1]
    out = model.generate(ids, n_new, greedy=True, attention_mask=attention_mask, use_cache=use_cache)
    offsets = T0 - torch.tensor(list(map(len, PROMPTS)))
    full_mask = torch.cat([attention_mask, torch.ones(len(PROMPTS), n_new, dtype=torch.long)], dim=1)
    position_ids = (torch.arange(T0 + n_new)[None, :] - offsets[:, None]).clamp(min=0)
    with torch.no_grad():
        logits = model(out, attention_mask=full_mask, position_ids=position_ids)
        for b, p in enumerate(PROMPTS):
            alone = model.generate(torch.tensor([p]), n_new, greedy=True)
            assert torch.equal(out[b, offsets[b]:], alone[0])
            torch.testing.assert_close(logits[b, offsets[b]:], model(alone)[0], rtol=0, atol=1e-10)
    assert torch.isfinite(logits).all()  # padding queries see no key: zero attention output, not NaN


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_left_padding_without_position_offsets_changes_absolute_positions(positions):
    model = _model(positions)
    ids, attention_mask = _left_padded(PROMPTS)
    with torch.no_grad():
        shifted = model(ids, attention_mask=attention_mask)  # masked, but positions 0 .. T0-1
        alone = model(torch.tensor([PROMPTS[1]]))
    assert (shifted[1, -2:] - alone[0]).abs().max() > 1e-2


def test_packed_documents_with_document_mask_and_restarted_positions():
    doc = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3])
    x = torch.randint(0, 20, (1, 12), generator=torch.Generator().manual_seed(0))
    for positions in ("learned", "rope"):
        model = _model(positions)
        with torch.no_grad():
            packed = model(x, attention_mask=masks.document_causal_mask(doc), position_ids=masks.document_positions(doc))
            for a, b in ((0, 5), (5, 9), (9, 12)):
                torch.testing.assert_close(packed[:, a:b], model(x[:, a:b]), rtol=0, atol=1e-12)


def test_all_ones_mask_and_default_positions_change_nothing():
    model = _model("learned")
    x = torch.randint(0, 20, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(x)
        torch.testing.assert_close(model(x, attention_mask=torch.ones(2, 7, dtype=torch.long),
                                         position_ids=torch.arange(7).expand(2, 7)), plain, rtol=0, atol=0)
        ids = model.generate(x, 3, greedy=True)
        assert torch.equal(model.generate(x, 3, greedy=True, attention_mask=torch.ones(2, 7, dtype=torch.long)), ids)


def test_mask_and_position_errors():
    model = _model("learned")
    ids, attention_mask = _left_padded(PROMPTS)
    with pytest.raises(ValueError, match="left padding"):
        model.generate(ids, 2, greedy=True, attention_mask=attention_mask.flip(1))
    no_real = attention_mask.clone()
    no_real[1] = 0
    with pytest.raises(ValueError, match="real token"):
        model.generate(ids, 2, greedy=True, attention_mask=no_real)
    with pytest.raises(ValueError, match="shape"):
        model.generate(ids, 2, greedy=True, attention_mask=attention_mask[:, 1:])
    with pytest.raises(ValueError, match="0 and 1"):
        model.generate(ids, 2, greedy=True, attention_mask=attention_mask * 2)
    with pytest.raises(ValueError, match="make_cache"):
        model.generate(ids, 2, greedy=True, attention_mask=attention_mask, make_cache=lambda: None)
    with pytest.raises(ValueError, match="position_ids"):
        model(ids, position_ids=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="position_ids"):
        model(ids, position_ids=torch.zeros(ids.shape))
    with pytest.raises(ValueError, match="position_ids"):
        model(ids, position_ids=-torch.ones(ids.shape, dtype=torch.long))
    with pytest.raises(ValueError, match="exceed"):
        model(ids, position_ids=torch.full(ids.shape, 40))
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(3, 1, 5, 5))


def test_four_dimensional_mask_must_broadcast_to_batch_heads_queries_keys():
    model = _model("rope")  # n_heads = 2
    ids = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(1, 3, 5, 5, dtype=torch.bool))  # 3 heads for a 2-head model
    per_head = torch.ones(1, 2, 5, 5, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=per_head), model(ids), rtol=0, atol=0)


def test_generate_refuses_a_float_mask_that_is_not_zero_or_one_and_restores_the_mode_on_error():
    # Regressions from a new user's trial: 0.5 was truncated to 0 (silently padding), a NaN became
    # -2**63 in the message; and a generate that raised left a training model in eval mode.
    import math

    from selfattn.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    g = GPT(GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, block_size=8, positions="rope"))
    ids = torch.tensor([[1, 2, 3]])
    for bad in (0.5, math.nan):
        with pytest.raises(ValueError, match="only 0 .padding. and 1"):
            g.generate(ids, 2, attention_mask=torch.tensor([[bad, 1.0, 1.0]]))
    ok = g.generate(ids, 2, attention_mask=torch.tensor([[0.0, 1.0, 1.0]]))  # float 0/1 is fine
    assert ok.shape == (1, 5)
    g.train()
    with pytest.raises(ValueError):
        g.generate(ids, 2, attention_mask=torch.tensor([[0.5, 1.0, 1.0]]))
    assert g.training
    g.generate(ids, 2)
    assert g.training
