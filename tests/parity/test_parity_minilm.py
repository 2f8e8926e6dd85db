"""The package's encoder, loaded with all-MiniLM-L6-v2's weights, against the reference
implementation of the same model in ``transformers`` (and sentence-transformers' embeddings).

Tolerances (float32, CPU), compared at real token positions only (padding rows are not defined
the same way by every implementation): hidden states of every layer max abs diff <= 1e-4;
attention weights of every layer <= 1e-5; sentence-embedding cosine >= 0.9999. The measured
figures are printed (run with ``-s``) and quoted in chapter 07.
"""

import os

import pytest
import torch

from selfattn.pretrained import load_minilm, model_dir

os.environ["HF_HUB_OFFLINE"] = "1"  # also set in conftest.py, before any import of transformers

SENTENCES = [
    "The chef added salt because the soup tasted bland.",
    "The animal didn't cross the street because it was too tired.",
    "Attention is all you need.",
    "She sat on the river bank and watched the boats.",
]
HIDDEN_TOL = 1e-4
WEIGHTS_TOL = 1e-5


@pytest.fixture(scope="module")
def both(hf_model):
    minilm = load_minilm()
    ours = minilm.run(SENTENCES, output_weights=True)
    batch = ours.batch
    with torch.no_grad():
        theirs = hf_model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            output_hidden_states=True,
            output_attentions=True,
        )
    return ours, theirs


def test_batch_really_has_padding(both):
    ours, _ = both
    lengths = ours.lengths
    assert min(lengths) < max(lengths) == ours.batch.input_ids.shape[1]


def test_hidden_states_of_every_layer_match_transformers(both):
    ours, theirs = both
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 7
    real = ours.batch.attention_mask.bool()  # (B, T)
    diffs = []
    for layer, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        diff = (a - b).abs()[real].max().item()  # (B, T, D) -> (N_real, D) -> scalar
        diffs.append(diff)
        assert diff <= HIDDEN_TOL, f"layer {layer}: max abs diff {diff:.3e} > {HIDDEN_TOL}"
    print("\nhidden states max abs diff per layer (0 = embeddings):", [f"{d:.2e}" for d in diffs])
    print(f"hidden states max abs diff overall: {max(diffs):.3e}")


def test_attention_weights_of_every_layer_match_transformers(both):
    ours, theirs = both
    assert len(ours.weights) == len(theirs.attentions) == 6
    real = ours.batch.attention_mask.bool()  # (B, T)
    diffs = []
    for layer, (a, b) in enumerate(zip(ours.weights, theirs.attentions, strict=True)):
        assert a.shape == b.shape
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        # Real queries (rows) over all keys: padding keys must be ~0 in both.
        a_real = a.permute(0, 2, 1, 3)[real]  # (B, H, T, T) -> (B, T, H, T) -> (N_real, H, T)
        b_real = b.permute(0, 2, 1, 3)[real]
        diff = (a_real - b_real).abs().max().item()
        diffs.append(diff)
        assert diff <= WEIGHTS_TOL, f"layer {layer}: max abs diff {diff:.3e} > {WEIGHTS_TOL}"
    print("\nattention weights max abs diff per layer:", [f"{d:.2e}" for d in diffs])
    print(f"attention weights max abs diff overall: {max(diffs):.3e}")


def test_sentence_embeddings_match_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    try:
        model = st.SentenceTransformer(str(model_dir()), device="cpu")
    except Exception as err:  # offline loading can fail on a missing optional file
        pytest.skip(f"sentence-transformers could not load the model offline: {err}")
    theirs = torch.as_tensor(model.encode(SENTENCES, convert_to_numpy=True))
    ours = load_minilm().sentence_embedding(SENTENCES)
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    cos = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    max_abs = (ours - theirs).abs().max().item()
    print(f"\nsentence embeddings: min cosine {cos.min().item():.7f}, max abs diff {max_abs:.3e}")
    assert cos.min().item() >= 0.9999
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_long_sentences_are_cut_where_sentence_transformers_cuts_them():
    # Regression: sentence_embedding read up to 512 word pieces, sentence-transformers 256
    # (max_seq_length in the package's sentence_bert_config.json): past 256 the embeddings differed
    # by up to 0.07 on unit vectors.
    st = pytest.importorskip("sentence_transformers")
    try:
        model = st.SentenceTransformer(str(model_dir()), device="cpu")
    except Exception as err:  # offline loading can fail on a missing optional file
        pytest.skip(f"sentence-transformers could not load the model offline: {err}")
    long = ["The cat sat.", "word " * 300, " ".join(f"tok{i}" for i in range(400))]
    minilm = load_minilm()
    assert minilm.max_seq_length == model.max_seq_length == 256
    assert minilm.tokenize(long[1]).input_ids.shape[1] > 256  # run() still reads the encoder's full 512
    theirs = torch.as_tensor(model.encode(long, convert_to_numpy=True))
    torch.testing.assert_close(minilm.sentence_embedding(long), theirs, rtol=0, atol=1e-4)
