"""selfattn.live: the export twin equals GPT.forward (float32 and float64, RoPE and no positions, past
block_size), the ONNX file run by Python's onnxruntime equals the torch model (both exporters), bad
input is refused with clear errors, and the panel's HTML carries exactly what the page's script reads
(the expected values are the torch model's own, recomputed here)."""

from __future__ import annotations

import base64
import html.parser
import json

import numpy as np
import pytest
import torch

from selfattn.data import CharTokenizer
from selfattn.live import GPTExport, LivePanel, decode_float32, export_onnx
from selfattn.models.gpt import GPT, GPTConfig

TEXT = "The value of an object is its state; a class </script> holds methods.\n"
TOKENIZER = CharTokenizer(TEXT)


def _model(positions="rope", dtype=torch.float32, block_size=12, seed=0):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=TOKENIZER.vocab_size, block_size=block_size, d_model=24, n_heads=3,
                       n_layers=2, d_ff=48, positions=positions)
    model = GPT(config).eval()
    with torch.no_grad():  # trained-looking weights: larger than the init, so heads differ
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.to(dtype)


def _ids(T, seed=1):
    return torch.randint(0, TOKENIZER.vocab_size, (1, T), generator=torch.Generator().manual_seed(seed))


def _max_diff(a, b) -> float:
    d = float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())
    assert np.isfinite(d), "NaN or inf in a compared value"
    return d


@pytest.mark.parametrize("positions", ["rope", "none"])
# float32: logits of size up to ~6 through two layers, each op rounding at ~1e-7 relative, in another
# order (softmax of masked scores vs the package's masked softmax); float64 shows the arithmetic is the same.
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("T", [1, 5, 12, 37])  # 37 > block_size 12: RoPE past the training length
def test_twin_equals_gpt_forward(positions, dtype, atol, T):
    model = _model(positions, dtype)
    ids = _ids(T)
    with torch.no_grad():
        logits, weights = model(ids, return_weights=True)
        twin_logits, twin_weights = GPTExport(model)(ids)
    assert twin_logits.shape == logits.shape and twin_logits.dtype == dtype
    assert twin_weights.shape == (2, 3, T, T)
    assert _max_diff(twin_logits, logits) < atol
    assert _max_diff(twin_weights, torch.stack([w[0] for w in weights])) < atol


def test_twin_shares_the_model_parameters():
    model = _model()
    twin = GPTExport(model)
    with torch.no_grad():
        model.lm_head.bias.add_(1.0)
        assert _max_diff(twin(_ids(4))[0], model(_ids(4))) < 2e-6


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_onnx_equals_torch(dynamo):
    ort = pytest.importorskip("onnxruntime")
    model = _model()
    data = export_onnx(model, max_positions=48, dynamo=dynamo)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids"]
    assert [o.name for o in session.get_outputs()] == ["logits", "weights"]
    for T in (1, 2, 12, 48):  # up to max_positions = 4 * block_size
        ids = _ids(T, seed=T)
        with torch.no_grad():
            logits, weights = model(ids, return_weights=True)
        onnx_logits, onnx_weights = session.run(None, {"input_ids": ids.numpy()})
        assert onnx_logits.shape == (1, T, TOKENIZER.vocab_size) and onnx_weights.shape == (2, 3, T, T)
        assert onnx_logits.dtype == np.float32
        assert _max_diff(onnx_logits, logits) < 1e-5, T
        assert _max_diff(onnx_weights, torch.stack([w[0] for w in weights])) < 1e-5, T


def test_export_writes_the_file_and_exports_a_float64_model_in_float32(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model = _model(dtype=torch.float64)
    data = export_onnx(model, tmp_path / "gpt.onnx", max_positions=16)
    assert (tmp_path / "gpt.onnx").read_bytes() == data
    assert model.lm_head.weight.dtype == torch.float64  # the caller's model is untouched
    ids = _ids(9)
    onnx_logits, _ = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids.numpy()})
    with torch.no_grad():
        assert _max_diff(onnx_logits, model(ids)) < 1e-5


def test_bad_models_and_sizes_are_refused():
    with pytest.raises(TypeError, match="model must be a selfattn.models.gpt.GPT; got Linear"):
        GPTExport(torch.nn.Linear(2, 2))
    for scheme in ("learned", "sinusoidal", "alibi"):
        with pytest.raises(ValueError, match=rf"positions must be one of \('rope', 'none'\) to export; got '{scheme}'"):
            export_onnx(_model(scheme))
    with pytest.raises(ValueError, match="max_positions"):
        GPTExport(_model(), max_positions=0)
    with pytest.raises(TypeError, match="dynamo must be a bool"):
        export_onnx(_model(), dynamo="yes")
    with pytest.raises(TypeError, match=r"path must be None, a str or a path-like object; got int 123"):
        export_onnx(_model(), path=123)


def test_twin_keeps_its_rope_table_on_the_models_device():
    """The cos/sin table is a buffer on the model's device (it was always made on the CPU, so a model on a
    GPU failed at its first call); a model on the meta device shows it without a GPU."""
    model = _model().to("meta")
    twin = GPTExport(model)
    assert twin.cos.device.type == twin.sin.device.type == "meta"
    assert twin.cos.shape == (4 * model.config.block_size, model.config.d_head // 2)
    logits, weights = twin(torch.zeros(1, 5, dtype=torch.int64, device="meta"))
    assert logits.shape == (1, 5, TOKENIZER.vocab_size) and weights.shape == (2, 3, 5, 5)


@pytest.fixture(scope="module")
def panel():
    return LivePanel(_model(), TOKENIZER, ["The value", "a class a cl"], max_new_tokens=20, check_new_tokens=9)


def test_panel_refuses_bad_input():
    model = _model()
    with pytest.raises(TypeError, match="tokenizer must be a selfattn.data.CharTokenizer"):
        LivePanel(model, "abc", ["The"])
    with pytest.raises(ValueError, match=r"tokenizer.vocab_size \(3\) must equal the model's vocab_size"):
        LivePanel(model, CharTokenizer("abc"), ["a"])
    with pytest.raises(TypeError, match="prompts must be a list of 1 to 8 strings; got 'The'"):
        LivePanel(model, TOKENIZER, "The")
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a string of 1 to block_size=12 characters; got ''"):
        LivePanel(model, TOKENIZER, ["The", ""])
    with pytest.raises(ValueError, match="block_size=12"):
        LivePanel(model, TOKENIZER, ["The value of an"])
    with pytest.raises(ValueError, match=r"prompts\[1\] = 'Zebra': .*outside the vocabulary"):
        LivePanel(model, TOKENIZER, ["The", "Zebra"])
    with pytest.raises(ValueError, match="check_new_tokens"):
        LivePanel(model, TOKENIZER, ["The"], max_new_tokens=4, check_new_tokens=5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        LivePanel(model, TOKENIZER, ["The"], max_new_tokens=0)


class _Scripts(html.parser.HTMLParser):
    """The JSON blocks (by class) and the form controls of the panel's HTML."""

    def __init__(self):
        super().__init__()
        self.blocks, self.controls, self._cls = {}, [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("type") == "application/json":
            self._cls = a["class"]
        elif tag == "script":  # the one-line call that lets the page's script find the panel early
            self._cls = "inline"
        elif tag in ("input", "select", "button"):
            self.controls.append((tag, a))

    def handle_data(self, data):
        if self._cls:
            self.blocks[self._cls] = self.blocks.get(self._cls, "") + data

    def handle_endtag(self, tag):
        if tag == "script":
            self._cls = None


def test_panel_html_carries_what_the_page_reads(panel):
    text = panel._repr_html_()
    parser = _Scripts()
    parser.feed(text)
    assert parser.blocks.pop("inline") == "window.selfattnLive && window.selfattnLive.init();"
    blocks = {k: json.loads(v) for k, v in parser.blocks.items()}
    assert set(blocks) == {"selfattn-livemodel-config", "selfattn-livemodel-onnx", "selfattn-livemodel-expected",
                           "selfattn-livemodel-long"}
    config = blocks["selfattn-livemodel-config"]
    assert config["vocab"] == TOKENIZER.chars and "<" in config["vocab"]  # "</script>" in the corpus: escaped
    assert (config["block_size"], config["n_layers"], config["n_heads"], config["max_positions"]) == (12, 2, 3, 48)
    assert (config["max_prompt"], config["max_new_tokens"], config["prompt"]) == (12, 20, "The value")
    assert base64.b64decode(blocks["selfattn-livemodel-onnx"]) == panel.onnx
    model = panel.model
    for entry, prompt in zip(blocks["selfattn-livemodel-expected"], ["The value", "a class a cl"], strict=True):
        ids = TOKENIZER.encode(prompt)[None]
        T = ids.shape[1]
        assert entry["prompt"] == prompt and entry["ids"] == ids[0].tolist() and entry["T"] == T
        with torch.no_grad():
            logits, weights = model(ids, return_weights=True)
            greedy = model.generate(ids, 9, greedy=True, use_cache=False)  # the other decoding path
        assert _max_diff(decode_float32(entry["logits"], (T, TOKENIZER.vocab_size)), logits[0]) == 0.0
        assert _max_diff(decode_float32(entry["weights"], (2, 3, T, T)), torch.stack([w[0, :] for w in weights])) == 0.0
        assert entry["greedy"] == {"n_new": 9, "text": TOKENIZER.decode(greedy[0, T:])}
    # The controls the script reads, each labelled; the prompt box has no maxlength (a pasted prompt past
    # max_prompt is refused by the script with a message, never cut by the box); the heatmaps' readout.
    kinds = {a.get("class", a.get("type")) for _tag, a in parser.controls}
    assert {"selfattn-livemodel-mode", "selfattn-livemodel-temperature", "selfattn-livemodel-topk",
            "selfattn-livemodel-topp", "selfattn-livemodel-new", "selfattn-livemodel-again", "text"} <= kinds
    prompt_box = next(a for tag, a in parser.controls if a.get("type") == "text")
    assert "maxlength" not in prompt_box and prompt_box["value"] == "The value"
    assert 'Prompt (at most 12 characters)' in text and '<p class="selfattn-livemodel-readout"></p>' in text
    assert text.count("<label") == 6 and 'class="selfattn-livemodel"' in text
    assert panel._repr_mimebundle_()["text/html"].startswith('<div class="selfattn-livemodel"')


def test_decode_float32_checks_the_size():
    with pytest.raises(ValueError, match=r"shape \(2, 2\) needs 16"):
        decode_float32(base64.b64encode(b"\0" * 12).decode(), (2, 2))


def test_panel_stores_a_long_probe_past_block_size_with_gpt_forward_values(panel):
    """The page carries one prompt longer than block_size (the browser test runs it: positions >= block_size
    were never checked in the browser), with GPT.forward's logits and the last LONG_ROWS query rows of
    every head's weights, in the format the page's script decodes (selfattnLive.long())."""
    parser = _Scripts()
    parser.feed(panel._repr_html_())
    entry = json.loads(parser.blocks["selfattn-livemodel-long"])
    # default: the prompts joined by spaces, repeated, cut to min(max_positions 48, 5 * 12 // 2) = 30
    assert entry["prompt"] == ("The value a class a cl " * 2)[:30]
    T, rows, V = 30, LivePanel.LONG_ROWS, TOKENIZER.vocab_size
    assert (entry["T"], entry["row0"], entry["rows"]) == (T, T - rows, rows) and T > 12
    ids = TOKENIZER.encode(entry["prompt"])[None]
    assert entry["ids"] == ids[0].tolist()
    with torch.no_grad():
        logits, weights = panel.model(ids, return_weights=True)
    full = torch.stack([w[0] for w in weights])  # (L, H, T, T)
    assert _max_diff(decode_float32(entry["logits"], (T, V)), logits[0]) == 0.0
    stored = decode_float32(entry["weights"], (2, 3, rows, T))
    assert _max_diff(stored, full[:, :, T - rows:, :]) == 0.0
    assert np.allclose(stored.sum(-1), 1.0, atol=1e-5)  # real softmax rows
    diagonal = stored[:, :, np.arange(rows), np.arange(T - rows, T)]  # each stored query reads itself
    assert diagonal.min() > 0 and stored[:, :, 0, T - rows + 1:].max() == 0.0  # causal: nothing after it
    # positions >= block_size really are in it, and differ from the first block_size ones (not a copy)
    assert float(np.abs(stored[:, :, -1, :12]).sum()) > 0


def test_long_probe_prompt_is_checked():
    model = _model()
    with pytest.raises(ValueError, match=r"long_prompt must be a string of more than block_size=12 and at most "
                                         r"max_positions=48 characters; got 'The'"):
        LivePanel(model, TOKENIZER, ["The"], max_new_tokens=4, check_new_tokens=2, long_prompt="The")
    with pytest.raises(ValueError, match="max_positions=48"):
        LivePanel(model, TOKENIZER, ["The"], max_new_tokens=4, check_new_tokens=2, long_prompt="a" * 49)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        LivePanel(model, TOKENIZER, ["The"], max_new_tokens=4, check_new_tokens=2, long_prompt="Zebra" * 4)
    panel = LivePanel(model, TOKENIZER, ["The"], max_new_tokens=4, check_new_tokens=2, long_prompt="a class " * 5)
    assert panel.long_payload()["T"] == 40 and panel.long_payload()["prompt"] == "a class " * 5


def test_long_probe_keeps_the_capstone_page_small():
    """The capstone's sizes (block_size 64, max_positions 256: a 160-character probe) add about 0.14 MB
    to the page (vocabulary 94: 136 kB measured), far inside its 3 MB budget (1.42 MB before): the
    weights are the last 8 query rows only (all 160 would be 1.1 MB as base64)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=TOKENIZER.vocab_size, block_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                       positions="rope")
    panel = LivePanel(GPT(config).eval(), TOKENIZER, ["The value of "], max_new_tokens=8, check_new_tokens=2)
    payload = json.dumps(panel.long_payload())
    assert panel.long_payload()["T"] == 160
    data = 4 * (160 * TOKENIZER.vocab_size + 2 * 4 * 8 * 160)  # float32 logits (T, V) + weights (L, H, 8, T)
    assert len(payload) < data * 4 / 3 + 3000, (len(payload), data)  # base64 + the ids and the prompt
    assert len(payload) < 120_000, len(payload)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_panel_stores_the_float32_values_the_page_computes_for_a_model_in_another_dtype(dtype):
    """The page runs the export in float32; a bfloat16 model's own logits differ from that by ~1e-2 and
    can change a greedy character (found by the new-user review: the stored greedy text did not match
    the page's). The stored values must be the float32 model's, and the model passed in stays as it was."""
    model = _model(dtype=dtype)
    panel = LivePanel(model, TOKENIZER, ["The value", "a class"], max_new_tokens=12, check_new_tokens=12)
    assert model.lm_head.weight.dtype == dtype
    reference = _model(dtype=dtype).float()  # the same numbers, rounded to dtype, then widened
    for entry in panel.expected:
        ids = torch.tensor(entry["ids"])[None]
        with torch.no_grad():
            logits, weights = reference(ids, return_weights=True)
            greedy = reference.generate(ids, 12, greedy=True)
        assert _max_diff(entry["logits"], logits[0]) == 0.0
        assert _max_diff(entry["weights"], torch.stack([w[0] for w in weights])) == 0.0
        assert entry["greedy"] == TOKENIZER.decode(greedy[0, ids.shape[1]:])


# --- the AttentionOnly model of chapter 15 (induction heads) -----------------------------------------------

from selfattn.experiments.induction import AttentionOnly, InductionConfig  # noqa: E402
from selfattn.live import AttentionOnlyExport, TokenAlphabet  # noqa: E402

ALPHABET = TokenAlphabet(32)


def _attention_only(final_norm=True, rope_layers=2, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    config = InductionConfig(final_norm=final_norm, rope_layers=rope_layers)  # V = T = 32, D = 32, 2 x 4 heads
    model = AttentionOnly(config).eval()
    with torch.no_grad():  # trained-looking weights: heads that differ, a final norm that is not the identity
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.to(dtype)


def _ids32(T, seed=1):
    return torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("final_norm", [False, True])
@pytest.mark.parametrize("rope_layers", [0, 1, 2])  # RoPE in no layer, the first only, both
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("T", [1, 7, 32])  # 32 = seq_len, the most the model takes
def test_attention_only_twin_equals_its_forward(final_norm, rope_layers, dtype, atol, T):
    model = _attention_only(final_norm, rope_layers, dtype)
    ids = _ids32(T)
    with torch.no_grad():
        logits, weights = model(ids, return_weights=True)
        twin_logits, twin_weights = AttentionOnlyExport(model)(ids)
    assert twin_logits.shape == logits.shape == (1, T, 32) and twin_logits.dtype == dtype
    assert twin_weights.shape == (2, 4, T, T)
    # Without a layer norm inside, these logits reach ~40: the float32 bound is relative to their size
    # (1e-5 of the largest, ~100 float32 roundings); weights are in [0, 1].
    scale = max(1.0, float(logits.abs().max()))
    assert _max_diff(twin_logits, logits) < atol * scale
    assert _max_diff(twin_weights, torch.stack([w[0] for w in weights])) < atol


def test_attention_only_twin_follows_rope_layers_and_the_final_norm():
    """The twin must rotate only the first rope_layers layers and read through ln_f: a twin that rotated
    every layer, or skipped the norm, would differ from the forward by far more than rounding."""
    model = _attention_only(final_norm=True, rope_layers=1)
    both = _attention_only(final_norm=True, rope_layers=2)  # the same parameters (same seed), RoPE in layer 1 too
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), both.parameters(), strict=True))
    ids = _ids32(20)
    with torch.no_grad():
        logits = model(ids)
        rotated_both = AttentionOnlyExport(both)(ids)[0]
        model.ln_f.weight.mul_(2.0)  # the twin shares the norm's parameters: it must see the change
        assert _max_diff(AttentionOnlyExport(model)(ids)[0], model(ids)) < 1e-4  # logits up to ~40: float32
    assert _max_diff(rotated_both, logits) > 1e-2


def test_attention_only_onnx_equals_torch():
    """ONNX Runtime's float32 run of the export computes the model's function as accurately as torch's
    own float32 forward: both are compared with the float64 forward of the same weights (the oracle).

    Comparing the two float32 runs with each other at a fixed 1e-5 failed on one CPU class and not on
    another: torch's float32 weights are themselves up to 1.1e-5 off the float64 ones at T = 13 (scores
    of size ~10 through a softmax), and ONNX Runtime's kernels (MLAS, chosen by the CPU's vector ISA)
    round in another order, measured 1.8e-5 off at T = 32 on an AVX2 EPYC. So the bound is ONNX's error
    against float64 within 4x torch's float32 error (measured: at most 1.9x) plus 8 float32 ulps of 1.
    A wrong export (a scale, a RoPE layout, a mask off by one) is off by 1e-2 or more.
    """
    ort = pytest.importorskip("onnxruntime")
    model = _attention_only(rope_layers=1)
    oracle = _attention_only(rope_layers=1, dtype=torch.float64)  # the same weights, in float64
    session = ort.InferenceSession(export_onnx(model), providers=["CPUExecutionProvider"])
    wrong = _attention_only(rope_layers=1)
    with torch.no_grad():
        wrong.layers[0].W_O[0, 0] += 1e-2  # one weight of the output projection off: what the bound must catch
    wrong_session = ort.InferenceSession(export_onnx(wrong), providers=["CPUExecutionProvider"])
    floor = 8 * float(torch.finfo(torch.float32).eps)
    for T in (1, 2, 13, 32):
        ids = _ids32(T, seed=T)
        with torch.no_grad():
            logits, weights = model(ids, return_weights=True)
            logits64, weights64 = oracle(ids, return_weights=True)
        weights, weights64 = torch.stack([w[0] for w in weights]), torch.stack([w[0] for w in weights64])
        onnx_logits, onnx_weights = session.run(None, {"input_ids": ids.numpy()})
        assert onnx_logits.shape == (1, T, 32) and onnx_weights.shape == (2, 4, T, T)
        logit_bound = 4 * _max_diff(logits, logits64) + floor * max(1.0, float(logits64.abs().max()))
        weight_bound = 4 * _max_diff(weights, weights64) + floor
        assert _max_diff(onnx_logits, logits64) <= logit_bound, T
        assert _max_diff(onnx_weights, weights64) <= weight_bound, T
        if T > 1:  # the bound is tight enough to tell a wrong weight
            assert _max_diff(wrong_session.run(None, {"input_ids": ids.numpy()})[0], logits64) > logit_bound, T


def test_attention_only_export_refuses_bad_models_and_sizes():
    with pytest.raises(TypeError, match="model must be a selfattn.experiments.induction.AttentionOnly; got GPT"):
        AttentionOnlyExport(_model())
    with pytest.raises(TypeError, match="model must be a selfattn.models.gpt.GPT; got AttentionOnly"):
        GPTExport(_attention_only())
    with pytest.raises(TypeError, match="GPT or a selfattn.experiments.induction.AttentionOnly; got Linear"):
        export_onnx(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_positions must be <= the AttentionOnly model's seq_len=32"):
        AttentionOnlyExport(_attention_only(), max_positions=33)
    assert AttentionOnlyExport(_attention_only(), max_positions=16).cos.shape == (16, 4)


def test_token_alphabet_maps_ids_to_characters_and_back():
    assert ALPHABET.chars == "abcdefghijklmnopqrstuvwxyz234567" and ALPHABET.vocab_size == 32
    ids = torch.arange(32)
    assert ALPHABET.decode(ids) == ALPHABET.chars and torch.equal(ALPHABET.encode(ALPHABET.chars), ids)
    assert ALPHABET.encode("ba7").tolist() == [1, 0, 31] and ALPHABET.encode("ba7").dtype == torch.int64
    assert TokenAlphabet(3, "xyz").decode([2, 0]) == "zx" and TokenAlphabet(4).chars == "abcd"
    with pytest.raises(ValueError, match=r"outside the vocabulary: \['8', 'A'\]"):
        ALPHABET.encode("aA8")
    with pytest.raises(ValueError, match=r"ids must be in \[0, vocab_size=32\); got \[32\]"):
        ALPHABET.decode([3, 32])
    with pytest.raises(ValueError, match=r"vocab_size must be in 2 \.\. 32"):
        TokenAlphabet(33)
    with pytest.raises(ValueError, match="distinct printable characters, no whitespace"):
        TokenAlphabet(3, "a a")
    with pytest.raises(ValueError, match="distinct printable characters"):
        TokenAlphabet(3, "aab")
    with pytest.raises(TypeError, match="chars must be a str"):
        TokenAlphabet(3, ["a", "b", "c"])


PROMPTS32 = ["k3bqx7ma2fk3bqx7ma2f", "hello"]


@pytest.fixture(scope="module")
def induction_panel():
    return LivePanel(_attention_only(), ALPHABET, PROMPTS32, max_new_tokens=8, check_new_tokens=8, count_from=0)


def test_attention_only_panel_carries_the_models_values_and_no_long_probe(induction_panel):
    panel = induction_panel
    parser = _Scripts()
    parser.feed(panel._repr_html_())
    parser.blocks.pop("inline")
    blocks = {k: json.loads(v) for k, v in parser.blocks.items()}
    assert set(blocks) == {"selfattn-livemodel-config", "selfattn-livemodel-onnx", "selfattn-livemodel-expected"}
    assert panel.long is None and panel.long_payload() is None  # no position past seq_len to probe
    config = blocks["selfattn-livemodel-config"]
    assert config["vocab"] == ALPHABET.chars and config["model"] == "AttentionOnly"
    # prompts of up to 32 - 8 = 24 characters, so that the 8 new ones fit in the model's 32 positions
    assert (config["block_size"], config["max_positions"], config["max_prompt"], config["max_new_tokens"]) == (32, 32, 24, 8)
    assert (config["n_layers"], config["n_heads"], config["prompt"], config["count_from"]) == (2, 4, PROMPTS32[0], 0)
    assert "Prompt (at most 24 characters)" in panel._repr_html_()
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(base64.b64decode(blocks["selfattn-livemodel-onnx"]), providers=["CPUExecutionProvider"])
    model = panel.model
    for entry, prompt in zip(blocks["selfattn-livemodel-expected"], PROMPTS32, strict=True):
        ids = ALPHABET.encode(prompt)[None]
        T = ids.shape[1]
        assert entry["ids"] == ids[0].tolist() and entry["T"] == T
        with torch.no_grad():
            logits, weights = model(ids, return_weights=True)
        assert _max_diff(decode_float32(entry["logits"], (T, 32)), logits[0]) == 0.0
        assert _max_diff(decode_float32(entry["weights"], (2, 4, T, T)), torch.stack([w[0] for w in weights])) == 0.0
        # greedy continuation, recomputed here from the ONNX file the page runs, token by token
        seq = ids[0].tolist()
        for _ in range(8):
            onnx_logits, _ = session.run(None, {"input_ids": np.asarray([seq], dtype=np.int64)})
            seq.append(int(np.argmax(onnx_logits[0, -1])))
        assert entry["greedy"] == {"n_new": 8, "text": ALPHABET.decode(seq[T:])}


def test_attention_only_panel_refuses_what_does_not_fit():
    model = _attention_only()
    with pytest.raises(ValueError, match=r"prompts\[0\] must be a string of 1 to max_prompt=24 characters"):
        LivePanel(model, ALPHABET, ["a" * 25], max_new_tokens=8, check_new_tokens=8)
    with pytest.raises(ValueError, match="long_prompt must be None for an AttentionOnly model"):
        LivePanel(model, ALPHABET, ["abc"], max_new_tokens=8, check_new_tokens=8, long_prompt="abc" * 4)
    with pytest.raises(ValueError, match=r"need max_prompt \+ max_new_tokens <= max_positions"):
        LivePanel(model, ALPHABET, ["abc"], max_new_tokens=8, check_new_tokens=8, max_prompt=30)
    with pytest.raises(ValueError, match=r"max_prompt must be in 1 \.\. block_size=32"):
        LivePanel(model, ALPHABET, ["abc"], max_new_tokens=8, check_new_tokens=8, max_prompt=0)
    with pytest.raises(ValueError, match=r"tokenizer.vocab_size \(4\) must equal the model's vocab_size \(32\)"):
        LivePanel(model, TokenAlphabet(4), ["abc"])
    with pytest.raises(ValueError, match="count_from must be 0 or 1; got 2"):
        LivePanel(model, ALPHABET, ["abc"], max_new_tokens=8, check_new_tokens=8, count_from=2)
    with pytest.raises(ValueError, match=r"prompts\[0\] = 'aZ': .*outside the vocabulary"):
        LivePanel(model, ALPHABET, ["aZ"], max_new_tokens=8, check_new_tokens=8)
