"""The mean-pooled MiniLM is a checkpoint edit: the same pooling applied to the checkpoint's own tensors
(nn.Linear layout, heads along the output rows, pooled here with explicit loops) and loaded into
``transformers``' BertModel gives the embeddings of :func:`selfattn.inference.convert.convert_encoder_to_gqa`.

Tolerances as tests/parity/test_parity_minilm.py (float32, CPU, real token positions only): hidden
states of the last layer max abs diff <= 1e-4; sentence-embedding cosine >= 0.9999.
"""

from __future__ import annotations

import copy

import pytest
import torch

from selfattn.inference.convert import SENTENCES, convert_encoder_to_gqa, sentence_embeddings

H, DH = 12, 32


def _pooled_checkpoint(state: dict[str, torch.Tensor], n_kv_heads: int) -> dict[str, torch.Tensor]:
    """The checkpoint with every key/value weight and bias replaced by its group mean, repeated per head."""
    G = H // n_kv_heads
    out = dict(state)
    for name, tensor in state.items():
        if not (".attention.self.key." in name or ".attention.self.value." in name):
            continue
        heads = [tensor[h * DH:(h + 1) * DH] for h in range(H)]  # (Dh, D) rows of a weight, (Dh,) of a bias
        means = [torch.stack(heads[g * G:(g + 1) * G]).mean(dim=0) for g in range(n_kv_heads)]
        out[name] = torch.cat([means[h // G] for h in range(H)])
    return out


@pytest.mark.parametrize("n_kv_heads", [12, 4, 1])
def test_pooled_checkpoint_in_transformers_matches_convert_encoder(minilm, hf_model, n_kv_heads):
    batch = minilm.tokenize(list(SENTENCES), minilm.max_seq_length)
    model = copy.deepcopy(hf_model)
    state = {k: v for k, v in model.state_dict().items()}
    model.load_state_dict(_pooled_checkpoint(state, n_kv_heads), strict=True)
    with torch.no_grad():
        theirs = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    converted = convert_encoder_to_gqa(minilm.encoder(), n_kv_heads)
    with torch.no_grad():
        ours = converted(batch.input_ids, batch.attention_mask).last_hidden_state
    real = batch.attention_mask.bool()
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    diff = (ours - theirs).abs()[real].max().item()
    assert diff <= 1e-4, f"n_kv_heads={n_kv_heads}: last hidden state max abs diff {diff:.3e}"
    mask = batch.attention_mask[..., None].float()
    theirs_embedding = torch.nn.functional.normalize((theirs * mask).sum(1) / mask.sum(1), dim=-1)
    ours_embedding = sentence_embeddings(converted, batch.input_ids, batch.attention_mask)
    cosine = (theirs_embedding * ours_embedding).sum(-1)
    assert cosine.min().item() >= 0.9999
    print(f"\nn_kv_heads={n_kv_heads}: hidden max abs diff {diff:.2e}, embedding cosine min {cosine.min().item():.7f}")
