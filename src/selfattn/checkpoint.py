"""Save and load a model with safetensors: tensors plus the config as JSON, never pickle.

A checkpoint is one ``.safetensors`` file. Its tensors are the model's ``state_dict``; its
metadata (string to string, stored in the file's header) holds ``"config"`` (the model's frozen
dataclass config as JSON), ``"config_class"`` and ``"model_class"`` (their names, checked on
loading), ``"shared"`` (JSON ``{alias: name}``: state-dict entries that are one tensor, such as a
read-out tied to the embedding, are stored once under ``name``) and ``"format": "selfattn"``.
Loading builds a fresh model from the config and loads the tensors strictly: no code is executed
from the file, unlike ``torch.save``'s pickle.

Introduced in chapter 14.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

__all__ = ["save_checkpoint", "load_checkpoint", "read_metadata"]

_FORMAT = "selfattn"


def _unreadable(path: Path, error: Exception) -> ValueError:
    """safetensors' own error on a file it cannot parse, as a ValueError naming the file (raise ... from it)."""
    size = path.stat().st_size if path.is_file() else None
    return ValueError(
        f"{path} is truncated or corrupt, not a complete safetensors file ({size} bytes): "
        f"safetensors says {error}; save or copy the checkpoint again"
    )


def save_checkpoint(
    model: nn.Module, path: str | Path, *, extra: dict[str, str] | None = None
) -> Path:
    """Write ``model``'s state dict and config to ``path`` (a ``.safetensors`` file).

    Args:
        model: an ``nn.Module`` with a ``config`` attribute that is a dataclass instance whose
            fields are JSON-serialisable (every config of this package is).
        path: the file to write (parent directories are created).
        extra: more metadata, ``{str: str}`` (e.g. the corpus name, the final losses).

    Returns:
        The path written, as a ``Path``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` with a dataclass ``config``; ``extra`` not a
        dict of strings.
        ValueError: ``extra`` uses a reserved key.

    Source: chapter 14.
    """
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"model.config must be a dataclass instance; got {type(config).__name__}")
    # Tied weights (e.g. GPTConfig(tie_embeddings=True)) appear under two names in the state dict;
    # safetensors refuses tensors that share memory, so each is stored once and the alias recorded.
    state = model.state_dict()
    kept: dict[tuple, str] = {}
    shared: dict[str, str] = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in kept:
            shared[name] = kept[key]
        else:
            kept[key] = name
    metadata = {
        "format": _FORMAT,
        "shared": json.dumps(shared, sort_keys=True),
        "model_class": type(model).__name__,
        "config_class": type(config).__name__,
        "config": json.dumps(dataclasses.asdict(config), sort_keys=True),
    }
    extra = {} if extra is None else extra
    if not isinstance(extra, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
    ):
        raise TypeError("extra must be a dict of str to str")
    clash = sorted(set(extra) & set(metadata))
    if clash:
        raise ValueError(f"extra must not use the reserved keys {clash}")
    metadata.update(extra)
    # safetensors wants contiguous CPU tensors that share no memory.
    tensors = {
        name: t.detach().to("cpu").contiguous().clone() for name, t in state.items() if name not in shared
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a checkpoint (``format``, ``model_class``, ``config_class``, ``config``, extras).

    Raises:
        FileNotFoundError: no such file. ValueError: not a selfattn checkpoint; a truncated or
        corrupt file (raised from safetensors' ``SafetensorError``, naming the file).

    Source: chapter 14.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    from safetensors import SafetensorError

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
    except SafetensorError as e:
        raise _unreadable(path, e) from e
    if metadata.get("format") != _FORMAT:
        raise ValueError(
            f"{path} is not a selfattn checkpoint (metadata format={metadata.get('format')!r})"
        )
    return metadata


def load_checkpoint(
    path: str | Path, model_cls: type[nn.Module], config_cls: type, *, device=None
) -> nn.Module:
    """Build ``model_cls(config_cls(**config))`` from a checkpoint and load its tensors strictly.

    Args:
        path: a file written by :func:`save_checkpoint`.
        model_cls, config_cls: the classes to build; their names must match the ones recorded.
        device: where to put the model (default CPU).

    Returns:
        The model, in eval mode.

    Raises:
        FileNotFoundError / ValueError: as :func:`read_metadata` (a truncated or corrupt file among
        them); the recorded class names differ from ``model_cls``/``config_cls``.
        RuntimeError: the tensors do not fit the model (missing, unexpected or wrong shapes), or a
        recorded alias names a tensor the file does not hold.

    Source: chapter 14.
    """
    from safetensors.torch import load_file

    metadata = read_metadata(path)
    for what, cls in (("model_class", model_cls), ("config_class", config_cls)):
        if metadata.get(what) != cls.__name__:
            raise ValueError(
                f"{path} holds a {metadata.get(what)!r} ({what}); got {cls.__name__!r} to build"
            )
    config = config_cls(**json.loads(metadata["config"]))
    model = model_cls(config)
    from safetensors import SafetensorError

    try:
        tensors = load_file(str(path), device="cpu")
    except SafetensorError as e:  # e.g. a header that is whole but tensors cut short
        raise _unreadable(Path(path), e) from e
    shared = json.loads(metadata.get("shared", "{}"))  # {alias: stored name}; older files have none
    for alias, name in shared.items():
        if name not in tensors:
            raise RuntimeError(f"{path}: the shared entry {alias!r} points at {name!r}, which the file does not hold")
        tensors[alias] = tensors[name]
    model.load_state_dict(tensors, strict=True)
    return model.to(device if device is not None else torch.device("cpu")).eval()
