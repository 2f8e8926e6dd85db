"""Models of the course in the reader's browser: an ONNX export and a panel that runs it in the page.

A reader of the published book has no kernel, but the course's small models are small enough to run
in a browser. This module gives the pieces that make that possible and checkable:

- the *export twins*, :class:`GPTExport` of :meth:`selfattn.models.gpt.GPT.forward` (the capstone,
  chapter 14) and :class:`AttentionOnlyExport` of
  :meth:`selfattn.experiments.induction.AttentionOnly.forward` (the two-layer model with induction
  heads, chapter 15), each for one sequence: the same parameters and the same arithmetic, written
  without the argument checks, caches and branches that an exporter cannot trace.
  ``twin(input_ids) -> (logits, weights)`` with ``logits`` (1, T, V) and every layer's weights stacked
  (L, H, T, T). Tested equal to ``model.forward(input_ids, return_weights=True)``.
- :func:`export_onnx`: the twin of either model exported to ONNX (``torch.onnx.export``, T dynamic),
  as bytes.
- :class:`TokenAlphabet`: one printable character per token id, for a model whose tokens are bare
  ids (the AttentionOnly model's 32), so that a reader can type them.
- :class:`LivePanel`: a display object whose ``text/html`` holds the ONNX bytes, the vocabulary, the
  sizes and the values the torch model gives for a few fixed prompts (logits, weights, the greedy
  continuation) and, for a GPT, for one long probe past ``block_size``, plus the panel's markup: a
  prompt box, sampling controls, an output area and a heatmap grid. The book's
  ``_static/selfattn-live.js`` finds the panel and runs the model with ``onnxruntime-web``
  (WebAssembly, one thread), vendored by ``scripts/vendor_js.py``.

Only RoPE (layout "half") and no positions are supported: the rotation is read from a cos/sin table of
``max_positions`` rows, so the exported model runs on 1 .. max_positions tokens. A GPT with learned,
sinusoidal or ALiBi positions raises ``ValueError``. An AttentionOnly model rotates the queries and
keys of its first ``rope_layers`` layers only, as it does itself, and runs on at most ``seq_len``
tokens (its own limit).

Introduced in chapter 14 (the live capstone); chapter 15 puts the AttentionOnly model in its page.
"""

from __future__ import annotations

import base64
import copy
import html
import inspect
import io
import json
import math
import os
import uuid
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ._validate import require_positive_int
from .data import CharTokenizer

__all__ = ["GPTExport", "AttentionOnlyExport", "export_onnx", "TokenAlphabet", "LivePanel", "SUPPORTED_POSITIONS"]

SUPPORTED_POSITIONS = ("rope", "none")
# ONNX operator set of the export (onnxruntime-web 1.30 runs up to 23).
OPSET = 18


def _is_attention_only(model) -> bool:
    from .experiments.induction import AttentionOnly

    return isinstance(model, AttentionOnly)


def _require_gpt(model):
    """``model`` if it is a GPT with an exportable position scheme or an AttentionOnly model; else
    TypeError (another class) or ValueError (a scheme or RoPE layout the twins do not compute)."""
    from .models.gpt import GPT

    if _is_attention_only(model):
        if model.rope.layout != "half":
            raise ValueError(f"only RoPE's 'half' layout is exported; got layout {model.rope.layout!r}")
        return model
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a selfattn.models.gpt.GPT or a selfattn.experiments.induction.AttentionOnly; "
                        f"got {type(model).__name__}")
    scheme = model.config.positions
    if scheme not in SUPPORTED_POSITIONS:
        raise ValueError(f"model.config.positions must be one of {SUPPORTED_POSITIONS} to export; got {scheme!r}")
    if scheme == "rope" and model.positions.layout != "half":
        raise ValueError(f"only RoPE's 'half' layout is exported; got layout {model.positions.layout!r}")
    return model


def _training_length(model) -> int:
    """The length the model was trained at: a GPT's ``block_size``, an AttentionOnly's ``seq_len``."""
    return model.config.seq_len if _is_attention_only(model) else model.config.block_size


def _max_positions(model, max_positions) -> int:
    """The twin's longest input: default ``4 * block_size`` (GPT) or ``seq_len`` (AttentionOnly, which
    refuses more itself: ValueError past it)."""
    if _is_attention_only(model):
        limit = model.config.seq_len
        n = limit if max_positions is None else require_positive_int("max_positions", max_positions)
        if n > limit:
            raise ValueError(f"max_positions must be <= the AttentionOnly model's seq_len={limit} (it runs on at most "
                             f"that many tokens); got {n}")
        return n
    return 4 * model.config.block_size if max_positions is None else require_positive_int("max_positions", max_positions)


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


class _ExportTwin(nn.Module):
    """What the two twins share: the model (parameters shared, not copied), a cos/sin table of
    ``max_positions`` rows computed as the model's own RoPE computes it (float64, then stored in the
    model's dtype on its device; angles of 0 for a model without positions), and one attention layer
    written out for one sequence."""

    def __init__(self, model, max_positions, rope):
        super().__init__()
        self.model = _require_gpt(model)
        n = _max_positions(model, max_positions)
        self.max_positions = n
        d_head = model.config.d_head
        if rope is not None:
            from .positions import rope_cos_sin

            cos, sin = rope_cos_sin(range(n), d_head, base=rope.base, interpolation=rope.interpolation)
        else:  # no positions: a rotation by 0
            cos, sin = torch.ones(n, d_head // 2), torch.zeros(n, d_head // 2)
        parameter = next(model.parameters())
        self.register_buffer("cos", cos.to(dtype=parameter.dtype, device=parameter.device), persistent=False)  # (max_positions, Dh/2)
        self.register_buffer("sin", sin.to(dtype=parameter.dtype, device=parameter.device), persistent=False)

    def _rotate(self, x, cos, sin):
        """RoPE, 'half' layout: pair i = features (i, i + Dh/2). x (1, H, T, Dh), cos/sin (T, Dh/2)."""
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]  # (1, H, T, Dh/2) each
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (1, H, T, Dh)

    def _tables(self, input_ids):
        """cos, sin (T, Dh/2) of positions 0 .. T-1 and the causal ``keep`` (T, T): query t reads keys s <= t."""
        T = input_ids.shape[1]
        position = torch.arange(T, device=input_ids.device)
        return self.cos[:T], self.sin[:T], position[:, None] >= position[None, :]

    def _attend(self, attn, h, cos, sin, keep, rotate: bool = True):
        """One :class:`~selfattn.multihead.MultiHeadAttention` on h (1, T, D) under the causal mask, its
        queries and keys rotated if ``rotate``: (its write to the stream (1, T, D), weights (H, T, T))."""
        T, H, Dh = h.shape[1], self.model.config.n_heads, self.model.config.d_head
        Q = (h @ attn.W_Q + attn.b_Q).reshape(1, T, H, Dh).transpose(1, 2)  # (1, T, D) -> (1, H, T, Dh)
        K = (h @ attn.W_K + attn.b_K).reshape(1, T, H, Dh).transpose(1, 2)
        V = (h @ attn.W_V + attn.b_V).reshape(1, T, H, Dh).transpose(1, 2)
        if rotate:
            Q, K = self._rotate(Q, cos, sin), self._rotate(K, cos, sin)
        scores = (Q @ K.transpose(-2, -1)) * (1.0 / math.sqrt(Dh))  # (1, H, T, Dh) @ (1, H, Dh, T) -> (1, H, T, T)
        w = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)  # (1, H, T, T)
        context = (w @ V).transpose(1, 2).reshape(1, T, H * Dh)  # (1, H, T, Dh) -> (1, T, D)
        return context @ attn.W_O + attn.b_O, w[0]  # (1, T, D), (H, T, T)


class GPTExport(_ExportTwin):
    """The export twin of :meth:`GPT.forward <selfattn.models.gpt.GPT.forward>` for one sequence.

    It holds ``model`` (its parameters are shared, not copied) and computes, for ``input_ids`` (1, T):
    token embedding, then per block ``x + attn(ln1(x))`` with RoPE on the queries and keys from a
    precomputed table and the causal mask, ``x + ffn(ln2(x))``, then ``lm_head(ln_f(x))``. Dropout is
    left out (the twin is for inference: ``GPT`` in eval mode).

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` with ``positions`` "rope" (layout "half") or "none".
        max_positions: the longest sequence the twin accepts (> 0); default ``4 * block_size`` (RoPE
            runs past the training length; chapter 14 measures how well).

    Shapes:
        forward(input_ids (1, T) int64, 1 <= T <= max_positions) -> (logits (1, T, V),
        weights (L, H, T, T)), both in the model's dtype. ``weights[l, h, t, s]`` is layer l+1's head
        h+1 weight from query position t to key position s (0 above the diagonal).

    Raises:
        TypeError / ValueError: ``model`` not a GPT, an unsupported position scheme, a bad
        ``max_positions``. Calls are not checked (that is the point of the twin): use
        :meth:`GPT.forward` for checked input.

    Source: chapter 14.
    """

    def __init__(self, model, max_positions: int | None = None):
        from .models.gpt import GPT

        if not isinstance(model, GPT):
            raise TypeError(f"model must be a selfattn.models.gpt.GPT; got {type(model).__name__}")
        _require_gpt(model)
        super().__init__(model, max_positions, model.positions if model.config.positions == "rope" else None)

    def forward(self, input_ids: torch.Tensor):
        model = self.model
        cos, sin, keep = self._tables(input_ids)
        x = model.token_embedding.weight[input_ids]  # (1, T) -> (1, T, D)
        weights = []
        for block in model.blocks:
            out, w = self._attend(block.attn, block.ln1(x), cos, sin, keep)
            x = x + out  # (1, T, D)
            x = x + block.ffn.linear2(block.ffn.activation(block.ffn.linear1(block.ln2(x))))  # (1, T, D)
            weights.append(w)  # (H, T, T)
        logits = model.lm_head(model.ln_f(x))  # (1, T, D) @ (D, V) -> (1, T, V)
        return logits, torch.stack(weights)  # (1, T, V), (L, H, T, T)


class AttentionOnlyExport(_ExportTwin):
    """The export twin of :meth:`AttentionOnly.forward <selfattn.experiments.induction.AttentionOnly.forward>`
    for one sequence.

    It holds ``model`` (parameters shared, not copied) and computes, for ``input_ids`` (1, T): the token
    embedding alone (no position vector), then per layer ``x + attn(x)`` under the causal mask, with
    RoPE on the queries and keys of the first ``config.rope_layers`` layers only (from a precomputed
    table), and no feed-forward network and no norm inside; then ``unembed(ln_f(x))``, ``ln_f`` the
    final layer norm of a model built with ``final_norm=True`` (chapter 15's) and the identity otherwise.

    Args:
        model: a :class:`~selfattn.experiments.induction.AttentionOnly` (its RoPE in layout "half").
        max_positions: the longest sequence the twin accepts, 1 .. ``seq_len`` (default ``seq_len``:
            the model itself refuses longer input).

    Shapes:
        forward(input_ids (1, T) int64, 1 <= T <= max_positions) -> (logits (1, T, V),
        weights (L, H, T, T)), in the model's dtype; ``weights[l, h, t, s]`` is layer l's head h
        weight (counted from 0, as chapter 15 counts) from query t to key s (0 above the diagonal).

    Raises:
        TypeError: ``model`` not an AttentionOnly. ValueError: ``max_positions`` not an int in
        1 .. ``seq_len``. Calls are not checked: use :meth:`AttentionOnly.forward` for checked input.

    Source: Elhage et al. 2021 (attention-only transformers); chapter 15.
    """

    def __init__(self, model, max_positions: int | None = None):
        if not _is_attention_only(model):
            raise TypeError(f"model must be a selfattn.experiments.induction.AttentionOnly; got {type(model).__name__}")
        super().__init__(model, max_positions, model.rope)

    def forward(self, input_ids: torch.Tensor):
        model = self.model
        cos, sin, keep = self._tables(input_ids)
        x = model.token_embedding.weight[input_ids]  # (1, T) -> (1, T, D): no position vector
        weights = []
        for layer, attn in enumerate(model.layers):
            out, w = self._attend(attn, x, cos, sin, keep, rotate=layer < model.config.rope_layers)
            x = x + out  # (1, T, D)
            weights.append(w)  # (H, T, T)
        logits = model.unembed(model.ln_f(x))  # (1, T, D) -> (1, T, V)
        return logits, torch.stack(weights)  # (1, T, V), (L, H, T, T)


def _twin(model, max_positions):
    return AttentionOnlyExport(model, max_positions) if _is_attention_only(model) else GPTExport(model, max_positions)


def export_onnx(model, path=None, *, max_positions: int | None = None, dynamo: bool = False) -> bytes:
    """``model`` exported to ONNX through its twin (:class:`GPTExport` for a GPT,
    :class:`AttentionOnlyExport` for an AttentionOnly model), as the bytes of the ONNX file.

    Inputs and outputs of the graph: ``input_ids`` (1, T) int64 -> ``logits`` (1, T, V) float32 and
    ``weights`` (L, H, T, T) float32, with T dynamic (1 .. ``max_positions``). The model is exported
    in float32 (a copy, if it is in another dtype or on another device); the twin runs in eval mode.

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` (positions "rope" or "none") or a
            :class:`~selfattn.experiments.induction.AttentionOnly`.
        path: where to write the file too (str or path-like), or None.
        max_positions: as :class:`GPTExport` / :class:`AttentionOnlyExport`.
        dynamo: use ``torch.onnx.export(..., dynamo=True)`` (torch.export and onnxscript) instead of
            the TorchScript exporter. Both give graphs equal to the twin (tested); the TorchScript one
            is the default: on the capstone model it takes about 1 s against 7-11 s for dynamo on 2
            CPU cores, and its file is smaller (0.49 against 0.56 MB). Chapter 14 exports at build time.

    Returns:
        ``bytes``, a serialized ONNX ``ModelProto`` (weights inside, no external data).

    Raises:
        TypeError / ValueError: as the twins; TypeError: ``path`` neither None, a str nor
        path-like (checked before exporting); ImportError: ``onnx`` (and, with ``dynamo``,
        ``onnxscript``) not installed.

    Source: chapter 14 (the capstone GPT); chapter 15 (the AttentionOnly model).
    """
    if not isinstance(dynamo, bool):
        raise TypeError(f"dynamo must be a bool; got {dynamo!r}")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be None, a str or a path-like object; got {type(path).__name__} {path!r}")
    _require_gpt(model)
    twin = _twin(copy.deepcopy(model).to(device="cpu", dtype=torch.float32), max_positions).eval()
    example = torch.zeros(1, min(8, twin.max_positions), dtype=torch.int64)
    names = dict(input_names=["input_ids"], output_names=["logits", "weights"])
    buffer = io.BytesIO()
    with torch.no_grad():
        if dynamo:
            T = torch.export.Dim("T", min=1, max=twin.max_positions)
            program = torch.onnx.export(twin, (example,), dynamo=True, opset_version=OPSET,
                                        dynamic_shapes={"input_ids": {1: T}}, **names)
            program.save(buffer)
        else:
            with warnings.catch_warnings():
                # torch >= 2.9 says the TorchScript exporter is deprecated; it is still the fast one
                # here (about 1 s against 7-11 s for dynamo=True on this model, 2 CPU cores)
                warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx.*")
                warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
                # torch >= 2.9 exports with dynamo unless told not to; torch < 2.5 has no such argument
                legacy = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
                torch.onnx.export(twin, (example,), buffer, **legacy, opset_version=OPSET,
                                  dynamic_axes={"input_ids": {1: "T"}, "logits": {1: "T"},
                                                "weights": {2: "T", 3: "T"}}, **names)
    data = buffer.getvalue()
    if path is not None:
        from pathlib import Path

        Path(path).write_bytes(data)
    return data


def _require_in_vocabulary(tokenizer, name: str, text: str) -> None:
    """ValueError naming the argument, its text and the characters outside the tokenizer's vocabulary."""
    try:
        tokenizer.encode(text)
    except ValueError as err:
        raise ValueError(f"{name} = {text!r}: {err}") from err


def _b64_float32(x) -> str:
    return base64.b64encode(np.ascontiguousarray(np.asarray(x, dtype="<f4")).tobytes()).decode("ascii")


def _json_script(cls: str, payload) -> str:
    # "</" must not appear inside a <script> element: JSON allows "\/" for "/".
    text = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" class="{cls}">{text}</script>'


class TokenAlphabet(CharTokenizer):
    """One printable character per token id: a tokenizer for a model whose tokens are bare ids.

    The AttentionOnly model of chapters 14-15 reads ids 0 .. V-1 that stand for nothing (random
    tokens); to let a reader type them, id ``i`` is written as ``chars[i]``. The default for V <= 32 is
    the first V characters of ``abcdefghijklmnopqrstuvwxyz234567`` (RFC 4648's base32 alphabet,
    lowercased: no 0/o or 1/l to confuse). It has :class:`~selfattn.data.CharTokenizer`'s interface
    (``chars``, ``vocab_size``, ``encode``, ``decode``), which is what :class:`LivePanel` reads.

    Args:
        vocab_size: V (an int, 2 .. ``len(chars)``).
        chars: the characters, at least V of them, distinct, printable and not whitespace; the first V
            are used. Default :attr:`DEFAULT` (so V <= 32 without ``chars``).

    Attributes:
        chars: the V characters, id = index. vocab_size: V.

    Raises:
        TypeError: ``chars`` not a str. ValueError: V < 2 or more than the characters given;
        characters repeated, not printable or whitespace.

    Source: chapter 15 (the live panel of the AttentionOnly model).
    """

    DEFAULT = "abcdefghijklmnopqrstuvwxyz234567"

    def __init__(self, vocab_size: int, chars: str | None = None):
        V = require_positive_int("vocab_size", vocab_size)
        chars = self.DEFAULT if chars is None else chars
        if not isinstance(chars, str):
            raise TypeError(f"chars must be a str; got {type(chars).__name__}")
        if not 2 <= V <= len(chars):
            raise ValueError(f"vocab_size must be in 2 .. {len(chars)} (the characters given); got {V}")
        chars = chars[:V]
        if len(set(chars)) != V or any(not ch.isprintable() or ch.isspace() for ch in chars):
            raise ValueError(f"chars must be {V} distinct printable characters, no whitespace; got {chars!r}")
        self.chars = chars
        self._index = {ch: i for i, ch in enumerate(chars)}

    def _vocabulary_hint(self) -> str:
        return f" (it is {self.chars!r})"

    def __repr__(self) -> str:
        return f"TokenAlphabet({self.vocab_size}, {self.chars!r})"


@torch.no_grad()
def _greedy_ids(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` greedy new ids after ``ids`` (1, T): :meth:`GPT.generate` for a GPT; for an AttentionOnly
    model (no ``generate``) the argmax of the last position's logits, the whole sequence run again per
    token, as the page does. Returns (1, T + n)."""
    if not _is_attention_only(model):
        return model.generate(ids, n, greedy=True)
    for _ in range(n):
        next_id = model(ids)[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1): the first of equal maxima
        ids = torch.cat([ids, next_id], dim=1)
    return ids


class LivePanel:
    """A panel for the book's page that runs ``model`` in the reader's browser (chapters 14 and 15).

    Displayed in a notebook, its ``text/html`` holds, in ``<script type="application/json">`` blocks:

    - ``selfattn-livemodel-config``: ``vocab`` (the tokenizer's characters, id = index), ``block_size``
      (the training length: a GPT's ``block_size``, an AttentionOnly's ``seq_len``), ``n_layers``,
      ``n_heads``, ``max_positions`` (the longest input of the exported model), ``max_prompt`` (the
      prompt box's limit), ``max_new_tokens``, ``prompt``, ``positions``, ``model`` (the class name) and
      ``count_from`` (the number of the first layer and head in the heatmaps' labels);
    - ``selfattn-livemodel-onnx``: the ONNX file of :func:`export_onnx`, base64;
    - ``selfattn-livemodel-expected``: for each fixed prompt, its ``ids``, the torch model's ``logits``
      (T, V) and ``weights`` (L, H, T, T) as little-endian float32 in base64 (row-major), and the
      ``greedy`` continuation (``n_new`` characters: :meth:`GPT.generate` with ``greedy=True``, or for
      an AttentionOnly model the argmax of its forward, token by token);
    - ``selfattn-livemodel-long`` (a GPT only): the *long probe*, one prompt longer than ``block_size``
      (so the page's run is checked at positions >= ``block_size``, where RoPE runs past the training
      length): its ``prompt``, ``ids``, ``T``, the torch model's ``logits`` (T, V) and, to keep the page
      small, only the weights of its last ``rows`` query positions: ``weights`` (L, H, rows, T) = the
      full weights' ``[:, :, row0:, :]`` with ``row0 = T - rows``. No greedy text. An AttentionOnly
      model runs on at most ``seq_len`` tokens, its training length: it has no such positions.

    The markup around them is the panel the page's script fills in: a labelled prompt box, controls
    for greedy / temperature / top-k / top-p and the number of new characters, an output area and a
    grid of heatmaps (one per layer and head), and a one-line inline script that lets the page's script
    find the panel as soon as it is parsed (a no-op without it). Without the page's script (in a
    notebook) the panel says where it runs.

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` (positions "rope" or "none") or an
            :class:`~selfattn.experiments.induction.AttentionOnly`, trained.
        tokenizer: its :class:`~selfattn.data.CharTokenizer`, or a :class:`TokenAlphabet` of the
            model's vocabulary size.
        prompts: the fixed prompts whose torch values the page carries (1 .. 8 non-empty strings of
            at most ``max_prompt`` vocabulary characters); the first one fills the prompt box.
        max_new_tokens: the most characters the panel generates (> 0; max_prompt + new <= max_positions).
        check_new_tokens: characters of each prompt's greedy continuation stored for the test (> 0,
            <= max_new_tokens).
        max_positions: as :class:`GPTExport` (default ``4 * block_size``) or
            :class:`AttentionOnlyExport` (default and at most ``seq_len``).
        long_prompt: a GPT's long probe text: ``block_size`` < length <= ``max_positions`` vocabulary
            characters; default: the prompts joined by spaces (without, if the vocabulary has no
            space), repeated and cut to ``min(max_positions, 5 * block_size // 2)`` characters. Must be
            None for an AttentionOnly model.
        max_prompt: the prompt box's limit (1 .. the training length, and max_prompt +
            max_new_tokens <= max_positions); default ``block_size`` for a GPT, ``max_positions -
            max_new_tokens`` for an AttentionOnly model (so that a continuation always fits).
        count_from: 0 (default: "layer 0, head 0", as the whole course, its figures, explorers and the
            hook names ``blocks.{l}`` count, issue 31) or 1: the first layer's and head's number in the
            labels.

    Attributes:
        onnx: the exported bytes. expected: the per-prompt values (numpy arrays). long: the long
        probe's values (numpy arrays; ``weights`` the last ``LONG_ROWS`` query rows), None for an
        AttentionOnly model. Both are computed by the model in float32, the precision of the export the
        page runs (a model in another dtype is copied to float32 for them; the model passed in is not
        changed).

    Raises:
        TypeError / ValueError: a model or tokenizer of the wrong type, vocabularies of different
        sizes, prompts that are empty, too long, not strings or hold characters outside the vocabulary,
        bad sizes, a long prompt given for an AttentionOnly model.

    Source: chapter 14 (the capstone GPT); chapter 15 (the AttentionOnly model with induction heads).
    """

    def __init__(self, model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 40,
                 check_new_tokens: int = 24, max_positions: int | None = None, long_prompt: str | None = None,
                 max_prompt: int | None = None, count_from: int = 0):
        from .data import CharTokenizer

        _require_gpt(model)
        attention_only = _is_attention_only(model)
        if not isinstance(tokenizer, (CharTokenizer, TokenAlphabet)):
            raise TypeError(f"tokenizer must be a selfattn.data.CharTokenizer or a selfattn.live.TokenAlphabet; "
                            f"got {type(tokenizer).__name__}")
        config = model.config
        if tokenizer.vocab_size != config.vocab_size:
            raise ValueError(f"tokenizer.vocab_size ({tokenizer.vocab_size}) must equal the model's vocab_size "
                             f"({config.vocab_size})")
        if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not 1 <= len(prompts) <= 8:
            raise TypeError(f"prompts must be a list of 1 to 8 strings; got {prompts!r}")
        self.block_size = _training_length(model)
        self.max_positions = _max_positions(model, max_positions)
        n_new = require_positive_int("max_new_tokens", max_new_tokens)
        n_check = require_positive_int("check_new_tokens", check_new_tokens)
        if max_prompt is None:
            max_prompt = self.max_positions - n_new if attention_only else self.block_size
        elif isinstance(max_prompt, bool) or not isinstance(max_prompt, int):
            raise TypeError(f"max_prompt must be an int or None; got {max_prompt!r}")
        if not 1 <= max_prompt <= self.block_size:
            raise ValueError(f"max_prompt must be in 1 .. block_size={self.block_size} (the training length); "
                             f"got {max_prompt}")
        self.max_prompt = max_prompt
        for i, p in enumerate(prompts):
            if not isinstance(p, str) or not 1 <= len(p) <= max_prompt:
                raise ValueError(f"prompts[{i}] must be a string of 1 to {'max_prompt' if attention_only else 'block_size'}"
                                 f"={max_prompt} characters; got {p!r}")
            _require_in_vocabulary(tokenizer, f"prompts[{i}]", p)
        if max_prompt + n_new > self.max_positions or n_check > n_new:
            raise ValueError(f"need max_prompt + max_new_tokens <= max_positions and check_new_tokens <= "
                             f"max_new_tokens; got {max_prompt} + {n_new} vs {self.max_positions}, "
                             f"check_new_tokens={n_check}")
        if attention_only:
            if long_prompt is not None:
                raise ValueError("long_prompt must be None for an AttentionOnly model: it runs on at most seq_len="
                                 f"{self.block_size} tokens, so no position lies past its training length")
        else:
            if long_prompt is None:
                sep = " " if " " in tokenizer.chars else ""
                unit = sep.join(prompts) + sep
                n_long = min(self.max_positions, 5 * self.block_size // 2)
                long_prompt = (unit * (n_long // len(unit) + 1))[:n_long]
            if not isinstance(long_prompt, str) or not self.block_size < len(long_prompt) <= self.max_positions:
                raise ValueError(f"long_prompt must be a string of more than block_size={self.block_size} and at most "
                                 f"max_positions={self.max_positions} characters; got {long_prompt!r}")
            _require_in_vocabulary(tokenizer, "long_prompt", long_prompt)
        if count_from not in (0, 1) or isinstance(count_from, bool):
            raise ValueError(f"count_from must be 0 or 1; got {count_from!r}")
        self.count_from = count_from
        self.model, self.tokenizer, self.prompts = model, tokenizer, list(prompts)
        self.max_new_tokens, self.check_new_tokens = n_new, n_check
        # The page runs the export in float32, so the stored values are the float32 model's: a model in
        # another dtype (bfloat16 rounds logits by ~1e-2 and can change a greedy character) is copied first.
        self._reference = model if _dtype(model) == torch.float32 else copy.deepcopy(model).float()
        self.onnx = export_onnx(model, max_positions=self.max_positions)
        self.expected = [self._expected(p) for p in self.prompts]
        self.long = None if long_prompt is None else self._long(long_prompt)

    LONG_ROWS = 8  # query rows of the long probe's weights stored in the page

    @torch.no_grad()
    def _reference_run(self, prompt: str, n_greedy: int = 0):
        """``prompt`` through the float32 reference (what the page computes), in eval mode, its mode
        restored after: ``(ids (1, T), logits (1, T, V), weights L x (1, H, T, T), greedy text or None)``."""
        model = self._reference
        device = next(model.parameters()).device
        ids = self.tokenizer.encode(prompt)[None].to(device)  # (1, T)
        was_training = model.training
        model.eval()
        try:
            logits, weights = model(ids, return_weights=True)
            greedy = None
            if n_greedy:
                out = _greedy_ids(model, ids, n_greedy)  # (1, T + n)
                greedy = self.tokenizer.decode(out[0, ids.shape[1]:].cpu())
        finally:
            model.train(was_training)
        return ids, logits, weights, greedy

    def _long(self, prompt: str) -> dict:
        ids, logits, weights, _ = self._reference_run(prompt)  # T > block_size
        row0 = max(0, ids.shape[1] - self.LONG_ROWS)
        return {"prompt": prompt, "ids": ids[0].tolist(), "row0": row0,
                "logits": logits[0].float().cpu().numpy(),  # (T, V)
                "weights": torch.stack([w[0, :, row0:, :] for w in weights]).float().cpu().numpy()}  # (L, H, rows, T)

    def long_payload(self) -> dict | None:
        """The long probe as the page reads it, or None (an AttentionOnly model has none)."""
        e = self.long
        if e is None:
            return None
        return {"prompt": e["prompt"], "ids": e["ids"], "T": len(e["ids"]), "row0": e["row0"],
                "rows": len(e["ids"]) - e["row0"], "logits": _b64_float32(e["logits"]),
                "weights": _b64_float32(e["weights"])}

    def _expected(self, prompt: str) -> dict:
        ids, logits, weights, greedy = self._reference_run(prompt, self.check_new_tokens)
        return {"prompt": prompt, "ids": ids[0].tolist(), "logits": logits[0].float().cpu().numpy(),
                "weights": torch.stack([w[0] for w in weights]).float().cpu().numpy(), "greedy": greedy}

    def config_payload(self) -> dict:
        c = self.model.config
        positions = "rope" if _is_attention_only(self.model) else c.positions
        return {"vocab": self.tokenizer.chars, "block_size": self.block_size, "n_layers": c.n_layers,
                "n_heads": c.n_heads, "max_positions": self.max_positions, "max_prompt": self.max_prompt,
                "max_new_tokens": self.max_new_tokens, "prompt": self.prompts[0], "positions": positions,
                "model": type(self.model).__name__, "count_from": self.count_from}

    def expected_payload(self) -> list[dict]:
        return [{"prompt": e["prompt"], "ids": e["ids"], "T": len(e["ids"]),
                 "logits": _b64_float32(e["logits"]), "weights": _b64_float32(e["weights"]),
                 "greedy": {"n_new": self.check_new_tokens, "text": e["greedy"]}} for e in self.expected]

    def _repr_html_(self) -> str:
        c = self.model.config
        uid = uuid.uuid4().hex[:8]
        esc = html.escape
        n_new = min(24, self.max_new_tokens)
        long = self.long_payload()
        long_block = "" if long is None else _json_script("selfattn-livemodel-long", long) + "\n"
        return f"""<div class="selfattn-livemodel" id="selfattn-livemodel-{uid}" role="region" aria-label="Live model: type a prompt, see the continuation and every head's attention weights">
{_json_script("selfattn-livemodel-config", self.config_payload())}
{_json_script("selfattn-livemodel-onnx", base64.b64encode(self.onnx).decode("ascii"))}
{_json_script("selfattn-livemodel-expected", self.expected_payload())}
{long_block}<div class="selfattn-livemodel-controls">
<label class="selfattn-livemodel-prompt">Prompt (at most {self.max_prompt} characters)
<input type="text" id="selfattn-livemodel-{uid}-prompt" value="{esc(self.prompts[0])}" autocomplete="off" spellcheck="false"></label>
<label>Decoding <select class="selfattn-livemodel-mode"><option value="greedy" selected>greedy</option><option value="sample">sample</option></select></label>
<label>Temperature <input type="number" class="selfattn-livemodel-temperature" min="0" step="0.05" value="0.8" title="0: greedy"></label>
<label>Top-k <input type="number" class="selfattn-livemodel-topk" min="0" max="{c.vocab_size}" step="1" value="0" title="0: every token"></label>
<label>Top-p <input type="number" class="selfattn-livemodel-topp" min="0.01" max="1" step="0.01" value="1"></label>
<label>New characters <input type="number" class="selfattn-livemodel-new" min="1" max="{self.max_new_tokens}" step="1" value="{n_new}"></label>
<button type="button" class="selfattn-livemodel-again">Generate again</button>
</div>
<p class="selfattn-livemodel-status" role="status" aria-live="polite">This panel runs the model in the book's web page (WebAssembly). In a notebook, run the model in the cells above instead.</p>
<p class="selfattn-livemodel-output" aria-live="polite"><span class="selfattn-livemodel-out-prompt"></span><mark class="selfattn-livemodel-out-new"></mark></p>
<div class="selfattn-livemodel-grid" role="group" aria-label="Attention weights of every layer and head for the prompt"></div>
<p class="selfattn-livemodel-readout"></p>
<p class="selfattn-livemodel-legend">Each square: one head's weights for the prompt. Row t is the character that asks, column s the character it reads (s &le; t, causal); colour from 0 (dark purple) to 1 (yellow), Viridis. The continuation is underlined after the prompt.</p>
<script>window.selfattnLive && window.selfattnLive.init();</script>
</div>"""

    def _repr_mimebundle_(self, include=None, exclude=None):
        text = (f"LivePanel: {len(self.prompts)} fixed prompts, ONNX model of {len(self.onnx):,} bytes; "
                "it runs in the book's HTML page")
        return {"text/html": self._repr_html_(), "text/plain": text}


def decode_float32(b64: str, shape) -> np.ndarray:
    """The inverse of the panel's encoding: base64 little-endian float32 -> array of ``shape``.

    Raises:
        ValueError: the bytes do not hold ``prod(shape)`` float32 numbers.
    """
    raw = base64.b64decode(b64)
    n = int(np.prod(shape))
    if len(raw) != 4 * n:
        raise ValueError(f"b64 holds {len(raw)} bytes; shape {tuple(shape)} needs {4 * n}")
    return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
