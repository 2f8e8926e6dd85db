"""selfattn.checkpoint: safetensors round trip (tensors, config, outputs), metadata, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from selfattn.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from selfattn.experiments.retrieval import RetrievalConfig, RetrievalModel
from selfattn.models.gpt import GPT, GPTConfig


def _gpt(positions="rope", rope_base=10000.0):
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                  positions=positions, rope_base=rope_base)
    ).eval()


@pytest.mark.parametrize(
    ("positions", "rope_base"), [("rope", 10000.0), ("rope", 500000.0), ("learned", 10000.0), ("alibi", 10000.0)]
)
def test_round_trip_restores_every_tensor_the_config_and_the_outputs(tmp_path, positions, rope_base):
    model = _gpt(positions, rope_base)
    path = save_checkpoint(model, tmp_path / "sub" / "gpt.safetensors", extra={"corpus": "test"})
    loaded = load_checkpoint(path, GPT, GPTConfig)
    assert loaded.config == model.config and not loaded.training
    assert (loaded.config.positions, loaded.config.rope_base) == (positions, rope_base)
    assert type(loaded.positions) is type(model.positions)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    assert ("positions.weight" in a) == (positions == "learned")  # only a learned table is a tensor
    for name in a:
        assert torch.equal(a[name], b[name]), name
    T = 8 if positions == "learned" else 20  # past block_size where the scheme can
    ids = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    if positions == "rope":  # the base is part of the model: another base gives other logits
        other = _gpt("rope", 10000.0 if rope_base != 10000.0 else 500000.0)
        assert (other(ids) - model(ids)).abs().max() > 1e-3


def test_metadata_holds_the_config_as_json_and_the_extras(tmp_path):
    model = _gpt()
    path = save_checkpoint(model, tmp_path / "gpt.safetensors", extra={"val_loss": "1.5"})
    meta = read_metadata(path)
    assert meta["format"] == "selfattn" and meta["model_class"] == "GPT"
    assert meta["config_class"] == "GPTConfig"
    config = json.loads(meta["config"])
    assert config["d_model"] == 16 and config["positions"] == "rope" and config["rope_base"] == 10000.0
    assert meta["val_loss"] == "1.5"
    # The file is plain safetensors: the tensors read back with safetensors alone.
    raw = load_file(str(path))
    assert torch.equal(raw["lm_head.weight"], model.state_dict()["lm_head.weight"])


def test_other_models_round_trip_too(tmp_path):
    torch.manual_seed(0)
    model = RetrievalModel(RetrievalConfig(d_model=8))
    loaded = load_checkpoint(
        save_checkpoint(model, tmp_path / "r.safetensors"), RetrievalModel, RetrievalConfig
    )
    for name, t in model.state_dict().items():
        assert torch.equal(t, loaded.state_dict()[name]), name


def test_refusals(tmp_path):
    model = _gpt()
    path = save_checkpoint(model, tmp_path / "gpt.safetensors")
    with pytest.raises(ValueError, match="RetrievalModel"):
        load_checkpoint(path, RetrievalModel, RetrievalConfig)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        read_metadata(tmp_path / "missing.safetensors")
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(ValueError, match="not a selfattn checkpoint"):
        read_metadata(plain)
    with pytest.raises(TypeError, match="nn.Module"):
        save_checkpoint({"x": 1}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="dataclass"):
        save_checkpoint(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(model, tmp_path / "x.safetensors", extra={"config": "{}"})
    # A state dict that does not fit the config is refused, not half-loaded.
    meta = read_metadata(path)
    tensors = load_file(str(path))
    del tensors["lm_head.bias"]
    broken = tmp_path / "broken.safetensors"
    save_file(tensors, str(broken), metadata=meta)
    with pytest.raises(RuntimeError, match="lm_head.bias"):
        load_checkpoint(broken, GPT, GPTConfig)


def test_a_tied_model_round_trips_stored_once_and_stays_tied(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                          tie_embeddings=True)).eval()
    with torch.no_grad():  # move the shared table off its initialization, so a round trip must carry it
        model.token_embedding.weight.add_(torch.randn(11, 16, generator=torch.Generator().manual_seed(3)))
    path = save_checkpoint(model, tmp_path / "tied.safetensors")
    meta = read_metadata(path)
    assert json.loads(meta["shared"]) == {"lm_head.weight": "token_embedding.weight"}
    raw = load_file(str(path))
    assert "lm_head.weight" not in raw and torch.equal(raw["token_embedding.weight"], model.token_embedding.weight)
    loaded = load_checkpoint(path, GPT, GPTConfig)
    assert loaded.config.tie_embeddings and loaded.lm_head.weight is loaded.token_embedding.weight
    for name, t in model.state_dict().items():
        assert torch.equal(t, loaded.state_dict()[name]), name
    ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    # An untied model records no aliases; an alias naming a missing tensor is refused.
    assert json.loads(read_metadata(save_checkpoint(_gpt(), tmp_path / "u.safetensors"))["shared"]) == {}
    del raw["token_embedding.weight"]
    broken = tmp_path / "broken.safetensors"
    save_file(raw, str(broken), metadata=meta)
    with pytest.raises(RuntimeError, match="token_embedding.weight"):
        load_checkpoint(broken, GPT, GPTConfig)


def test_a_truncated_or_corrupt_file_raises_a_value_error_naming_the_file(tmp_path):
    # Regression: a truncated checkpoint (an interrupted copy or download) raised safetensors' own
    # SafetensorError ("MetadataIncompleteBuffer", "invalid header ...") from read_metadata or
    # load_checkpoint; now a ValueError naming the file and what is wrong, raised from the original.
    from safetensors import SafetensorError

    path = save_checkpoint(_gpt(), tmp_path / "gpt.safetensors")
    data = path.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")  # the 8-byte header length, then the JSON header
    for name, cut in (("length", data[:4]), ("header", data[: header // 2]), ("tensors", data[:-100]),
                      ("garbage", b"\x00not a safetensors file" * 4)):
        broken = tmp_path / f"cut-{name}.safetensors"
        broken.write_bytes(cut)
        for call, args in ((read_metadata, (broken,)), (load_checkpoint, (broken, GPT, GPTConfig))):
            with pytest.raises(ValueError, match=rf"{broken.name} is truncated or corrupt") as info:
                call(*args)
            assert isinstance(info.value.__cause__, SafetensorError), name
