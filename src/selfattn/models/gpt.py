"""The capstone decoder-only model: token embedding, a position scheme, causal pre-norm blocks and a
read-out, with a key/value cache for generation, a training loop with validation, and sampling.

:class:`GPT` has the parts of chapter 04's :class:`~selfattn.models.tiny_lm.TinyLM` (token
embedding, pre-norm :class:`~selfattn.block.TransformerBlock` layers, a final layer norm, a linear
read-out) and one more: a position scheme from :mod:`selfattn.positions` (``GPTConfig.positions``:
learned, sinusoidal, RoPE, ALiBi or none; RoPE by default). The model holds the scheme object and
calls its three methods at fixed places, never branching on its kind: ``add_absolute`` on the
embeddings, ``rotate`` on every layer's queries and keys, ``score_bias`` on the scores. The causal
mask is applied inside :meth:`GPT.forward` (a decoder never reads the future), the attention weights
of every layer can be returned, and :meth:`GPT.generate` decodes with or without a
:class:`~selfattn.efficient.KVCache` per layer, giving the same tokens either way. Except with
learned positions, it runs on sequences longer than the ``block_size`` it was trained at. Any cache
that follows the small protocol of :class:`CachePlan` (it says where the new queries and its keys
sit and which keys they see, and stores and rotates the keys) can stand in for the KVCache, e.g.
chapter 11's sliding window with attention sinks (:mod:`selfattn.inference.streaming`).

Introduced in chapter 14 (Radford et al. 2018's decoder-only layout, with pre-norm blocks); the
position schemes are compared in chapter 08.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .._validate import (
    require_broadcastable,
    require_flag,
    require_positive_int,
    require_rank,
    require_tensor,
    shape_of,
)
from ..attention import _attend, scaled_dot_product_attention
from ..block import BlockConfig, TransformerBlock
from ..data import random_windows
from ..efficient import KVCache, StaticKVCache
from ..embeddings import TokenEmbedding
from ..masks import causal_mask, from_hf_attention_mask
from ..positions import POSITION_SCHEMES, make_positions
from ..sampling import (
    _require_generator,
    _require_temperature,
    _require_top_k,
    _require_top_p,
    sample,
)
from .tiny_lm import TinyLMConfig, next_token_loss

__all__ = [
    "GPTConfig",
    "GPT",
    "CachePlan",
    "TrainingLog",
    "train_lm",
    "evaluate_loss",
    "unigram_cross_entropy",
    "seed_comparison",
]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and position scheme of a :class:`GPT`, validated at construction.

    Attributes:
        vocab_size: V, number of token ids (> 0).
        block_size: the training length (> 0): :func:`train_lm` and :func:`evaluate_loss` use windows
            of this many tokens, and a learned position table has this many rows. The other schemes
            run on longer inputs too.
        d_model: width D (> 0), divisible by ``n_heads``. n_heads: H (> 0).
        n_layers: number of Transformer blocks (> 0). d_ff: feed-forward width F (> 0).
        positions: the position scheme, one of :data:`selfattn.positions.POSITION_SCHEMES`
            (``"learned"``, ``"sinusoidal"``, ``"rope"``, ``"alibi"``, ``"none"``).
        rope_base: RoPE's frequency base (a finite number > 1; used only by ``"rope"``).
        tie_embeddings: share one (V, D) matrix between the token embedding and the read-out:
            ``lm_head.weight`` IS ``token_embedding.weight`` (Press & Wolf 2017; Inan et al. 2017),
            which saves V * D parameters; the read-out keeps its own bias. Default False.

    Raises:
        ValueError / TypeError: a size that is not a positive int, d_model not divisible by
        n_heads, an unknown ``positions``, a bad ``rope_base``, or sizes the scheme cannot use
        (RoPE needs an even d_head = d_model / n_heads; sinusoids an even d_model).

    Source: chapter 14; the schemes, chapter 08.
    """

    vocab_size: int
    block_size: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 1
    d_ff: int = 256
    positions: str = "rope"
    rope_base: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self):
        # the sizes: chapter 04's checks, the same messages
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError(f"tie_embeddings must be a bool; got {self.tie_embeddings!r}")
        TinyLMConfig(self.vocab_size, self.block_size, self.d_model, self.n_heads, self.n_layers, self.d_ff)
        if not isinstance(self.positions, str) or self.positions not in POSITION_SCHEMES:
            raise ValueError(f"positions must be one of {POSITION_SCHEMES}; got {self.positions!r}")
        base = self.rope_base
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not (math.isfinite(base) and base > 1):
            raise ValueError(f"rope_base must be a finite number > 1; got {base!r}")
        # The scheme checks the sizes it needs (even d_head for RoPE, even d_model for sinusoids).
        # Built on a forked RNG: validating a config must not move the seed the model is built from.
        try:
            with torch.random.fork_rng(devices=[]):
                self.make_positions()
        except ValueError as err:
            raise ValueError(
                f"positions={self.positions!r} does not fit d_model={self.d_model}, n_heads={self.n_heads} "
                f"(d_head={self.d_model // self.n_heads}): {err}"
            ) from err

    @property
    def block_config(self) -> BlockConfig:
        return BlockConfig(self.d_model, self.n_heads, self.d_ff)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def make_positions(self):
        """A fresh position scheme (:func:`selfattn.positions.make_positions`) for these sizes."""
        return make_positions(
            self.positions,
            max_positions=self.block_size,
            d_model=self.d_model,
            n_heads=self.n_heads,
            rope_base=self.rope_base,
        )


@dataclass(frozen=True, eq=False)
class CachePlan:
    """Where the T new positions of one cached step sit, as the layer's cache decides.

    :meth:`GPT.forward_cached` asks every layer's cache for its plan before it runs (``cache.plan(T,
    scheme, device)``), then lets the cache store the new keys and values and hand back the keys the
    queries read (``cache.update(k_new, v_new, rotate)``). A :class:`~selfattn.efficient.KVCache`
    keeps everything (chapter 10); :class:`selfattn.inference.streaming.SlidingWindowCache` keeps the
    first few and the last ``window`` tokens and renumbers them (chapter 11).

    Attributes:
        text_start: tokens of the sequence before the new ones (every layer's cache must agree); the
            position at which the scheme's ``add_absolute`` and a learned table's limit see them.
        start: the position, for the scheme's ``rotate`` and ``score_bias``, of the first new query;
            the queries sit at ``start .. start+T-1``.
        n_keys: S, the number of keys (cached and new) that ``update`` returns, which the scheme's
            ``score_bias`` places at positions ``0 .. S-1``.
        keep: (T, S) bool, True where new query t may read key s (in the order ``update`` returns); or
            None when every new query may read every key (one new query at the end of a causal cache:
            the attention then takes its unmasked path, whose numbers are the same).

    Source: chapter 11.
    """

    text_start: int
    start: int
    n_keys: int
    keep: torch.Tensor

    def same_as(self, other: CachePlan) -> bool:
        if (self.text_start, self.start, self.n_keys) != (other.text_start, other.start, other.n_keys):
            return False
        if self.keep is None or other.keep is None:
            return self.keep is other.keep
        return self.keep.shape == other.keep.shape and bool(torch.equal(self.keep, other.keep))


class _GrowingCache:
    """A :class:`~selfattn.efficient.KVCache` in the cache protocol of :class:`CachePlan`: the new
    keys are rotated at their positions ``len(cache) ..`` before they are stored (a position's
    rotation never changes), and every new query sees the cached keys and the new ones up to itself
    (the bottom-right causal mask)."""

    def __init__(self, cache: KVCache):
        self.cache = cache

    def plan(self, T: int, scheme, device) -> CachePlan:
        start = len(self.cache)  # the new positions are start .. start+T-1
        S = start + T  # keys: every cached position and the new ones
        if T == 1:  # one new query, the last position: it sees every key, no mask needed
            return CachePlan(start, start, S, None)
        # The new queries are the last T of S positions: bottom-right causal alignment (T == S
        # without a cache: the ordinary lower-triangular mask).
        return CachePlan(start, start, S, causal_mask(T, S, alignment="bottom_right", device=device))

    def update(self, k_new, v_new, rotate):
        return self.cache.append(rotate(k_new, len(self.cache)), v_new)  # (B, H, S, Dh) each


class _StaticCache(_GrowingCache):
    """A :class:`~selfattn.efficient.StaticKVCache` that :meth:`GPT.generate` made for itself, and so
    writes without the per-layer checks (the shapes are the model's own)."""

    def update(self, k_new, v_new, rotate):
        return self.cache._write(rotate(k_new, len(self.cache)), v_new)  # views, (B, H, S, Dh) each


def _as_protocol(cache, i: int):
    if isinstance(cache, KVCache):
        return _GrowingCache(cache)
    if callable(getattr(cache, "plan", None)) and callable(getattr(cache, "update", None)):
        return cache
    raise TypeError(
        f"caches[{i}] must be a KVCache or a cache with plan() and update() (e.g. "
        f"selfattn.inference.streaming.SlidingWindowCache); got {type(cache).__name__}"
    )


def _position_runs(position_ids: torch.Tensor):
    """For each row b of ``position_ids`` (B, T), its maximal runs of consecutive positions: a list of
    (b, t0, t1, p0), where columns t0 .. t1-1 hold p0, p0+1, ... (a packed document, or a row's
    real tokens after left padding)."""
    runs = []
    breaks = position_ids[:, 1:] != position_ids[:, :-1] + 1  # (B, T-1): a new run starts at t+1
    for b in range(position_ids.shape[0]):
        starts = [0] + (torch.nonzero(breaks[b]).flatten() + 1).tolist()
        ends = starts[1:] + [position_ids.shape[1]]
        runs += [(b, t0, t1, int(position_ids[b, t0])) for t0, t1 in zip(starts, ends, strict=True)]
    return runs


class _PerTokenPositions:
    """The model's position scheme applied at given positions ``position_ids`` (B, T) of the new
    tokens instead of at ``start, start+1, ...``: each run of consecutive positions of a row goes
    through the scheme's own ``add_absolute`` / ``rotate`` with that run's first position, so that
    no scheme is special-cased. The ``start`` the model passes is ignored. (``score_bias`` is not
    wrapped: ALiBi's bias depends only on the column offset, which is the position offset for
    every pair within one run, the only pairs a document or padding mask keeps.)"""

    def __init__(self, scheme, position_ids: torch.Tensor):
        self.scheme, self.runs = scheme, _position_runs(position_ids)

    def add_absolute(self, x, start: int = 0):  # x (B, T, D)
        parts = [self.scheme.add_absolute(x[b : b + 1, t0:t1], p0) for b, t0, t1, p0 in self.runs]
        return self._assemble(x, parts, axis=1)

    def rotate(self, x, start: int = 0):  # x (B, H, T, Dh)
        parts = [self.scheme.rotate(x[b : b + 1, :, t0:t1], p0) for b, t0, t1, p0 in self.runs]
        return self._assemble(x, parts, axis=2)

    def _assemble(self, x, parts, axis: int):
        rows = [[] for _ in range(x.shape[0])]
        for (b, *_), part in zip(self.runs, parts, strict=True):
            rows[b].append(part)
        return torch.cat([torch.cat(r, dim=axis) for r in rows], dim=0)  # back to x's shape


def _require_position_ids(position_ids, input_ids: torch.Tensor) -> torch.Tensor:
    require_tensor("position_ids", position_ids)
    if position_ids.dtype.is_floating_point or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must be an integer tensor; got dtype {position_ids.dtype}")
    if tuple(position_ids.shape) != tuple(input_ids.shape):
        raise ValueError(f"position_ids must have the shape of input_ids {shape_of(input_ids)} (B, T); "
                         f"got {shape_of(position_ids)}")
    if position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0; got minimum {int(position_ids.min())}")
    return position_ids.to(torch.int64)


def _keep_from_attention_mask(attention_mask, B: int, H: int, T: int, S: int) -> torch.Tensor:
    """``attention_mask`` (a (B, S) 0/1 or boolean key mask, 1/True = real token; or a boolean keep-mask
    broadcastable to (B, H, T, S)) as a boolean tensor broadcastable to (B, H, T, S)."""
    require_tensor("attention_mask", attention_mask)
    if attention_mask.ndim == 2:
        if tuple(attention_mask.shape) != (B, S):
            raise ValueError(f"a 2-D attention_mask must have shape (B, S) = {(B, S)} (one entry per key, "
                             f"cached ones included); got {shape_of(attention_mask)}")
        if attention_mask.dtype == torch.bool:
            return attention_mask[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
        return from_hf_attention_mask(attention_mask)
    if attention_mask.dtype != torch.bool or attention_mask.ndim != 4:
        raise TypeError(f"attention_mask must be (B, S) of 0/1 or bool, or a boolean keep-mask (B, H or 1, T, S); "
                        f"got dtype {attention_mask.dtype}, shape {shape_of(attention_mask)}")
    require_broadcastable("attention_mask", attention_mask, (B, H, T, S), "(B, H, T, S) =")
    return attention_mask


class GPT(nn.Module):
    """Decoder-only Transformer: ``logits = W_out(LN(blocks(positions.add_absolute(E[ids]), causal)))``.

    Inside every block the attention branch projects Q, K, V, rotates Q and K with the scheme at
    their absolute positions (``positions.rotate``), adds the scheme's score bias
    (``positions.score_bias``) and applies the causal mask. :meth:`forward` and
    :meth:`forward_cached` run the same branch; the KV cache stores keys after rotation, and the
    queries of a cached step sit at positions ``len(cache) ..``. Caching rotated keys assumes the
    rotation of a position never changes: a scheme whose angles depend on the current length (Hugging
    Face's "dynamic" NTK scaling) would need the keys cached unrotated; and the scheme must not be
    swapped while a cache is live.

    Args:
        config: a :class:`GPTConfig`.

    Attributes:
        token_embedding, blocks (n_layers :class:`~selfattn.block.TransformerBlock`, whose
        ``attn``, ``ln1``, ``ffn``, ``ln2`` are used), ln_f, lm_head, and ``positions``: the scheme
        (:class:`~selfattn.positions.PositionScheme`; a learned table is ``positions.weight``, (block_size, D)).
        The scheme is built last, so that for one seed every other parameter is initialized the same
        whatever the scheme.

    Shapes:
        forward(input_ids (B, T) int64) -> logits (B, T, V) float; with ``return_weights=True``
        also a tuple of n_layers attention weights (B, H, T, T). ``logits[b, t]`` scores the token
        that follows ``input_ids[b, t]`` and depends only on ``input_ids[b, :t + 1]``.

    Raises:
        TypeError / ValueError: ``config`` not a GPTConfig; ``input_ids`` not a (B, T) integer
        tensor with ids in [0, V), T = 0, or (learned positions only) T > block_size.

    Source: Radford et al. 2018 (decoder-only); Vaswani et al. 2017 section 3.2.3 (causal mask);
    chapter 14; position schemes, chapter 08.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig; got {type(config).__name__}")
        self.config = config
        self.token_embedding = TokenEmbedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(TransformerBlock(config.block_config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)
        if config.tie_embeddings:
            # one Parameter in both places (Press & Wolf 2017): nn.Linear computes h @ weight.T, and
            # the embedding's (V, D) table has exactly the read-out's (V, D) shape
            self.lm_head.weight = self.token_embedding.weight
        self.positions = config.make_positions()  # last: the other parameters' init ignores the scheme

    def _check_ids(self, input_ids: torch.Tensor, start: int) -> None:
        self._check_shape(input_ids)
        T = input_ids.shape[1]
        limit = self.positions.max_positions
        if limit is not None and start + T > limit:
            raise ValueError(
                f"positions {start}..{start + T - 1} exceed the {self.positions.name} position table of "
                f"{limit} rows (block_size={self.config.block_size}); got input_ids of shape "
                f"{shape_of(input_ids)} at offset {start}. Only positions='learned' has this limit"
            )

    @staticmethod
    def _check_shape(input_ids: torch.Tensor) -> None:
        require_tensor("input_ids", input_ids)
        require_rank("input_ids", input_ids, 2, "(B, T)")
        if input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must hold at least one token (T > 0); got shape {shape_of(input_ids)}")

    def _run(self, input_ids: torch.Tensor, caches: list, attention_mask=None, position_ids=None):
        """The T new positions ``input_ids`` after those the caches hold -> logits, weights.

        The one path of both :meth:`forward` (fresh caches) and :meth:`forward_cached`. ``caches``
        follow the protocol of :class:`CachePlan` (a KVCache is wrapped by :func:`_as_protocol`).
        ``attention_mask`` (ANDed with the cache's causal mask) and ``position_ids`` (B, T): see
        :meth:`forward`.
        """
        self._check_shape(input_ids)
        if position_ids is not None:
            position_ids = _require_position_ids(position_ids, input_ids)
        T = input_ids.shape[1]
        tokens = self.token_embedding(input_ids)  # (B, T, D)
        if all(isinstance(c, _GrowingCache) for c in caches):
            # the model's own caches: a plan depends only on the cache's length, so equal lengths are
            # equal plans (compared as ints: no mask comparison, no device-to-host sync)
            plans = [caches[0].plan(T, self.positions, tokens.device)]
            if len({len(c.cache) for c in caches}) != 1:
                raise ValueError(f"caches must all hold the same number of positions; got lengths "
                                 f"{[len(c.cache) for c in caches]}")
        else:
            plans = [cache.plan(T, self.positions, tokens.device) for cache in caches]
        plan = plans[0]  # where the new positions sit, the same for every layer
        if len({p.text_start for p in plans}) != 1:
            raise ValueError(f"caches must all hold the same number of positions; got lengths "
                             f"{[p.text_start for p in plans]}")
        if not all(plan.same_as(p) for p in plans[1:]):
            raise ValueError("caches must all be of one kind, with the same settings: their layers would place "
                             "the new positions differently; got (start, n_keys) per layer "
                             f"{[(p.start, p.n_keys) for p in plans]}")
        scheme = self.positions
        if position_ids is None:
            self._check_ids(input_ids, plan.text_start)
        else:  # the table's limit at the largest position asked for; each run through the scheme
            self._check_ids(input_ids[:, :1], int(position_ids.max()))
            scheme = _PerTokenPositions(self.positions, position_ids)
        keep = plan.keep
        if attention_mask is not None:
            given = _keep_from_attention_mask(attention_mask.to(tokens.device), input_ids.shape[0],
                                              self.config.n_heads, T, plan.n_keys)  # (B, H or 1, T, S)
            keep = given if keep is None else keep & given.to(keep.device)
        return self._forward_new(tokens, caches, plan, keep, scheme)

    def _forward_new(self, tokens: torch.Tensor, caches: list, plan: CachePlan, keep, scheme):
        """:meth:`_run` after its checks: embeddings ``tokens`` (B, T, D) of the new positions -> logits,
        weights. No argument checks and no device-to-host sync (one decode step of :meth:`generate`)."""
        T = tokens.shape[1]
        x = scheme.add_absolute(tokens, plan.text_start)  # (B, T, D)
        # ALiBi's bias in float32 at least: in bfloat16, -s * d near d = 500 would be rounded to steps of 2
        bias_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        bias = self.positions.score_bias(T, plan.n_keys, plan.start, dtype=bias_dtype, device=x.device)  # (H, T, S) or None
        weights = []
        for block, cache in zip(self.blocks, caches, strict=True):
            attn_out, w = self._attention(block, block.ln1(x), cache, plan.start, keep, bias, scheme)
            x = x + block.dropout(attn_out)  # (B, T, D)
            x = x + block.dropout(block.ffn(block.ln2(x)))  # (B, T, D)
            weights.append(w)
        return self.lm_head(self.ln_f(x)), tuple(weights)  # (B, T, D) @ (D, V) -> (B, T, V)

    def _attention(self, block: TransformerBlock, h, cache, start: int, keep, bias, scheme=None):
        """The attention branch of ``block`` for new positions ``h`` (B, T, D), queries at ``start ..``.

        The parameters and steps of :class:`~selfattn.multihead.MultiHeadAttention`'s forward, with
        the scheme's rotation of Q and K and its score bias, and keys and values of earlier
        positions read from ``cache``, which stores the new ones and rotates the keys where its
        plan places them (a KVCache: each key once, at its position, before storing it).
        """
        attn = block.attn
        scheme = self.positions if scheme is None else scheme  # a _PerTokenPositions with position_ids
        B, T, D = h.shape
        H = attn.config.n_heads
        # split_heads and merge_heads inlined, without their checks (the shapes are the model's own)
        Q = (h @ attn.W_Q + attn.b_Q).view(B, T, H, D // H).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
        K_new = (h @ attn.W_K + attn.b_K).view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
        V_new = (h @ attn.W_V + attn.b_V).view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
        Q = scheme.rotate(Q, start)  # at positions start .. start+T-1 (or position_ids)
        K, V = cache.update(K_new, V_new, scheme.rotate)  # rotated keys, values: (B, H, S, Dh) each
        dropout_p = attn.config.dropout if self.training else 0.0
        if isinstance(cache, _GrowingCache):  # the model's own caches: K, V and keep are well formed
            context, weights = _attend(Q, K, V, keep, bias, None, dropout_p)
        else:  # another cache's keys, values and plan: checked
            context, weights = scaled_dot_product_attention(
                Q, K, V, keep, bias=bias, dropout_p=dropout_p, return_weights=True
            )  # context (B, H, T, Dh), weights (B, H, T, S)
        context = context.transpose(1, 2).reshape(B, T, D)  # (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D)
        return context @ attn.W_O + attn.b_O, weights  # (B, T, D) @ (D, D) -> (B, T, D)

    def forward(self, input_ids: torch.Tensor, *, return_weights: bool = False, attention_mask=None,
                position_ids=None):
        """Logits (B, T, V) of ``input_ids`` (B, T) under the causal mask (see the class).

        Args:
            input_ids: (B, T) int64. return_weights: also return each layer's weights (B, H, T, T).
            attention_mask: optional, ANDed with the causal mask: a (B, T) key mask (1 or True = a
                real token, 0 or False = padding, as Hugging Face's) or a boolean keep-mask
                broadcastable to (B, H, T, T), e.g. ``selfattn.masks.document_causal_mask(doc_ids)``
                for packed documents. A query that then sees no key (a padding token) gets a zero
                attention output, never NaN.
            position_ids: optional (B, T) integer positions >= 0 of the tokens, instead of
                ``0 .. T-1``: ``selfattn.masks.document_positions(doc_ids)`` restarts them per packed
                document; after left padding, each row's real tokens start at 0. Each run of
                consecutive positions goes through the scheme at its first position.

        Raises:
            as the class; TypeError / ValueError for an ``attention_mask`` or ``position_ids`` of the
            wrong dtype, shape or values.

        Source: chapters 07 (assembled) and 14 (trained); ``attention_mask`` and ``position_ids``, chapter 08
        (packed and left-padded sequences; chapters 04 and 05 show them on ``TinyLM``).
        """
        return_weights = require_flag("return_weights", return_weights)
        logits, weights = self._run(input_ids, [_GrowingCache(KVCache()) for _ in self.blocks],  # no earlier positions
                                    attention_mask, position_ids)
        return (logits, weights) if return_weights else logits

    def forward_cached(self, input_ids: torch.Tensor, caches: list, *, attention_mask=None,
                       position_ids=None) -> torch.Tensor:
        """Logits of the new positions ``input_ids`` (B, T_new), given ``caches`` of the earlier ones.

        Each block is the pre-norm block of chapter 07 with its attention split open: the new
        positions' keys and values go to the layer's cache, and the new queries attend over the keys
        the cache hands back. With a :class:`KVCache` (chapter 10) the keys are rotated at their
        positions and stored, and the new queries, at positions ``len(cache) ..``, attend over all S
        cached positions with the bottom-right causal mask (and the scheme's score bias): equal to
        the last T_new rows of :meth:`forward` on the whole sequence (tested, every scheme). Any
        other cache follows the protocol of :class:`CachePlan`, e.g.
        :class:`selfattn.inference.streaming.SlidingWindowCache` (chapter 11), which keeps a fixed
        number of positions.

        Args:
            input_ids: (B, T_new) int64. caches: one cache per layer, all of one kind and at the same
                point (modified in place; a fresh start is ``[KVCache() for _ in range(n_layers)]``).
            attention_mask: optional (B, S) key mask over all S keys, cached and new (1 = real token,
                0 = padding), or a boolean keep-mask broadcastable to (B, H, T_new, S); ANDed with
                the cache's causal mask. position_ids: optional (B, T_new) positions of the new tokens
                (as :meth:`forward`); the cache stores keys rotated at these positions.

        Returns:
            logits (B, T_new, V).

        Raises:
            ValueError: the wrong number of caches, caches of different lengths or kinds, or
            (learned positions) positions past the table; whatever the cache refuses (e.g. a sliding
            window given more new tokens than it can hold). TypeError: an object that is not a cache.

        Source: chapter 10 (the cache), chapter 11 (the protocol), chapter 14.
        """
        if not isinstance(caches, (list, tuple)) or len(caches) != len(self.blocks):
            raise ValueError(
                f"caches must hold one KVCache per layer ({len(self.blocks)}); got "
                f"{len(caches) if isinstance(caches, (list, tuple)) else type(caches).__name__}"
                " (or one SlidingWindowCache, or other cache with plan() and update(), per layer)"
            )
        return self._run(input_ids, [_as_protocol(c, i) for i, c in enumerate(caches)], attention_mask,
                         position_ids)[0]

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        top_k: int | None = None,
        top_p: float | None = None,
        make_cache: Callable[[], object] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to ``input_ids``, one at a time.

        Each step turns the last position's logits into probabilities ``softmax(logits /
        temperature)``, optionally keeping only the top-k tokens and the top-p nucleus
        (:func:`selfattn.sampling.sample`), and takes the most probable token (``greedy``) or a
        sample drawn with ``generator`` (``torch.multinomial``). With ``use_cache`` only the new token passes through
        the model at each step (keys and values of earlier positions are read from the cache);
        without it the whole sequence is recomputed. Both give the same tokens (tested, greedy and
        seeded sampling, every scheme). The result may be longer than ``block_size`` except with
        learned positions.

        Args:
            input_ids: (B, T0) int64 prompt, T0 >= 1.
            max_new_tokens: number of tokens to add (> 0); with learned positions
                T0 + max_new_tokens <= block_size.
            temperature: > 0; below 1 sharpens, above 1 flattens the distribution.
            greedy: argmax instead of sampling. generator: for reproducible samples.
            use_cache: decode with a cache per layer: a :class:`~selfattn.efficient.StaticKVCache` of
                capacity T0 + max_new_tokens, written in place (no copy of the cache per step, and no
                argument check after the first step), unless ``make_cache`` or ``attention_mask`` is given.
            top_k: sample among the k most probable tokens (None: all). top_p: among the smallest set
                whose probability reaches p (None or 1: all).
            make_cache: with ``use_cache``, a callable that returns a fresh cache for one layer (e.g.
                ``lambda: SlidingWindowCache(32, n_sinks=4)``, chapter 11); then the prompt is fed
                one token at a time, which every cache accepts. None: a :class:`KVCache` per layer,
                and the prompt in one step.
            attention_mask: optional (B, T0) 0/1 (or boolean) mask of a batch of prompts padded on
                the LEFT (0 = padding): every row's pad tokens come first, then its real tokens.
                Padding keys are masked and each row's positions start at 0 at its first real token,
                so that every row generates what it would alone (tested: the same tokens, logits to
                1e-10 in float64). Not with ``make_cache``.

        Returns:
            (B, T0 + max_new_tokens) int64, the prompt followed by the new tokens.

        Raises:
            TypeError / ValueError: bad ``input_ids``; ``max_new_tokens`` not a positive int;
            ``temperature`` not a finite number > 0; ``generator`` not a torch.Generator or None;
            NaN or +inf logits (a model with NaN weights), greedy or not; with learned positions, a result longer than the table;
            ``make_cache`` not callable, or given with ``use_cache=False``; an ``attention_mask`` not
            of shape (B, T0), not 0/1, not left padding, with a row of padding only, or with ``make_cache``.

        Source: chapter 14; ``make_cache``, chapter 11; ``attention_mask`` (left padding):
        what chapter 05 writes by hand for ``TinyLM``.
        """
        greedy = require_flag("greedy", greedy)
        use_cache = require_flag("use_cache", use_cache)
        require_tensor("input_ids", input_ids)
        require_rank("input_ids", input_ids, 2, "(B, T0)")
        n_new = require_positive_int("max_new_tokens", max_new_tokens)
        _require_temperature(temperature)
        _require_top_k(top_k)
        _require_top_p(top_p)
        _require_generator(generator)
        if make_cache is not None and (not callable(make_cache) or not use_cache):
            raise ValueError(f"make_cache must be a callable returning a fresh cache, with use_cache=True; got "
                             f"{make_cache!r} with use_cache={use_cache}")
        offsets = None if attention_mask is None else self._left_padding(attention_mask, input_ids, make_cache)
        total = input_ids.shape[1] + n_new - (0 if offsets is None else int(offsets.min()))  # positions used
        limit = self.positions.max_positions
        if limit is not None and total > limit:
            raise ValueError(
                f"prompt length {input_ids.shape[1]} + max_new_tokens {n_new} = {total} exceeds the "
                f"{self.positions.name} position table of {limit} rows (block_size={self.config.block_size})"
            )
        if offsets is None:
            self._check_ids(input_ids, 0)
        else:  # the positions' limit was checked above (the longest row)
            self._check_shape(input_ids)
        was_training = self.training
        self.eval()
        try:  # the mode comes back also when a step raises (a caught error must not leave dropout off)
            return self._generate_eval(input_ids, n_new, offsets, use_cache, make_cache, dict(
                temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, generator=generator))
        finally:
            self.train(was_training)

    def _generate_eval(self, input_ids, n_new: int, offsets, use_cache: bool, make_cache, how: dict):
        """:meth:`generate`'s loop, in eval mode, after its argument checks."""
        temperature, top_k, top_p, greedy, generator = (how[k] for k in ("temperature", "top_k", "top_p", "greedy",
                                                                       "generator"))
        if offsets is not None:
            return self._generate_left_padded(input_ids, n_new, offsets, use_cache, how)
        if use_cache and make_cache is None:
            return self._generate_static(input_ids, n_new, how)
        ids = input_ids
        caches = [make_cache() for _ in self.blocks] if use_cache else None
        step_input = ids
        if make_cache is not None and ids.shape[1] > 1:  # the prompt one token at a time, all but the last
            for t in range(ids.shape[1] - 1):
                self.forward_cached(ids[:, t : t + 1], caches)
            step_input = ids[:, -1:]
        for _ in range(n_new):
            if use_cache:
                logits = self.forward_cached(step_input, caches)[:, -1]  # (B, V)
            else:
                logits = self(ids)[:, -1]  # (B, T, V) -> (B, V)
            next_id = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                             generator=generator)  # (B, 1)
            ids = torch.cat([ids, next_id], dim=1)  # (B, T) -> (B, T + 1)
            step_input = next_id
        return ids

    def _generate_static(self, input_ids, n_new: int, how: dict) -> torch.Tensor:
        """:meth:`generate` with a :class:`~selfattn.efficient.StaticKVCache` per layer of capacity
        T0 + n_new: the prompt in one checked step (:meth:`_run`), then one unchecked step per token
        (:meth:`_forward_new`: no argument checks, no mask, keys and values written in place, no
        copy of the cache). Tokens are written into the preallocated result."""
        B, T0 = input_ids.shape
        caches = [_StaticCache(StaticKVCache(T0 + n_new)) for _ in self.blocks]
        out = torch.empty((B, T0 + n_new), dtype=torch.int64, device=input_ids.device)  # (B, T0 + n_new)
        out[:, :T0] = input_ids
        logits = self._run(input_ids, caches)[0][:, -1]  # (B, V): the prompt's last position
        weight = self.token_embedding.weight  # (V, D)
        for i in range(n_new):
            next_id = sample(logits, **how)  # (B, 1); refuses NaN or +inf logits
            out[:, T0 + i : T0 + i + 1] = next_id
            if i + 1 < n_new:
                plan = caches[0].plan(1, self.positions, out.device)  # the same for every layer
                tokens = weight[next_id]  # (B, 1, D): the ids come from sample, in [0, V)
                logits = self._forward_new(tokens, caches, plan, plan.keep, self.positions)[0][:, -1]  # (B, V)
        return out

    @staticmethod
    def _left_padding(attention_mask, input_ids, make_cache) -> torch.Tensor:
        """The number of padding tokens at the start of each row (B,), after checking the mask."""
        require_tensor("attention_mask", attention_mask)
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask must have the shape of input_ids {shape_of(input_ids)} (B, T0); "
                             f"got {shape_of(attention_mask)}")
        if make_cache is not None:
            raise ValueError("attention_mask (left padding) works with the default KVCache only; got make_cache too")
        if attention_mask.is_floating_point() or attention_mask.is_complex():  # .to(int64) would truncate 0.5 to 0
            bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)]
            if bad.numel():
                raise ValueError("attention_mask must hold only 0 (padding) and 1 (a real token); got values "
                                 f"{sorted(set(bad.flatten().tolist()))[:5]}")
        keep = from_hf_attention_mask(attention_mask.to(torch.int64))[:, 0, 0]  # (B, T0) bool, checks 0/1
        if bool((keep[:, 1:] < keep[:, :-1]).any()):
            raise ValueError("attention_mask must be left padding: in every row the 0s (padding) come before "
                             f"the 1s (real tokens); got {attention_mask.tolist()}")
        if not bool(keep[:, -1].all()):
            raise ValueError(f"every prompt needs at least one real token; got attention_mask {attention_mask.tolist()}")
        return (~keep).sum(dim=1)  # (B,)

    def _generate_left_padded(self, input_ids, n_new: int, offsets, use_cache: bool, how: dict):
        """:meth:`generate` for left-padded prompts: key padding masked, positions ``t - offsets[b]``
        (padding tokens at position 0: they see no key and nobody reads them)."""
        B, T0 = input_ids.shape
        column = torch.arange(T0 + n_new, device=input_ids.device)
        positions = (column[None, :] - offsets[:, None].to(column.device)).clamp(min=0)  # (B, T0 + n_new)
        real = column[None, :] >= offsets[:, None].to(column.device)  # (B, T0 + n_new): the key mask
        ids = input_ids
        caches = [KVCache() for _ in self.blocks] if use_cache else None
        step_input = ids
        for _ in range(n_new):
            T = ids.shape[1]
            if use_cache:
                t0 = T - step_input.shape[1]  # the new tokens' first column
                logits = self.forward_cached(step_input, caches, attention_mask=real[:, :T],
                                             position_ids=positions[:, t0:T])[:, -1]  # (B, V)
            else:
                logits = self(ids, attention_mask=real[:, :T], position_ids=positions[:, :T])[:, -1]  # (B, V)
            next_id = sample(logits, **how)  # (B, 1)
            ids = torch.cat([ids, next_id], dim=1)  # (B, T) -> (B, T + 1)
            step_input = next_id
        return ids


@dataclass
class TrainingLog:
    """What :func:`train_lm` measured.

    Attributes:
        train_loss: the training loss (nats per token) of every step.
        val_steps: the steps (counted from 1) after which the validation loss was measured.
        val_loss: the validation loss (nats per token) at those steps.
        seconds: wall-clock time of the whole run, evaluations included.
        device: where it ran.
    """

    train_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    device: str = "cpu"


@torch.no_grad()
def evaluate_loss(
    model: GPT, ids: torch.Tensor, *, batches: int = 8, batch_size: int = 32, seed: int = 1234
) -> float:
    """Mean next-token loss (nats per token) of ``model`` on ``batches`` fixed random windows of ``ids``.

    The windows are drawn with a generator seeded by ``seed``, so every call sees the same ones;
    the model runs causally (:class:`GPT`'s forward).

    Raises:
        TypeError / ValueError: as :func:`selfattn.data.random_windows`.

    Source: chapter 14.
    """
    require_positive_int("batches", batches)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        inputs, targets = random_windows(ids, batch_size, model.config.block_size, generator)
        total += next_token_loss(model(inputs.to(device)), targets.to(device)).item()
    model.train(was_training)
    return total / batches


def train_lm(
    model: GPT,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    eval_every: int = 50,
    eval_batches: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> TrainingLog:
    """Train ``model`` (in place, on the device its parameters are on) to predict the next token.

    AdamW (weight decay 0.01), gradient clipping at norm 1, a linear warm-up over the first 5 % of
    the steps and a cosine decay to 10 % of ``lr``. Each step samples ``batch_size`` random windows
    of ``block_size`` tokens from ``train_ids`` (seeded by ``seed``). Every ``eval_every`` steps and
    after the last one, :func:`evaluate_loss` measures the loss on ``val_ids``. A tqdm progress bar
    shows the latest losses when ``progress``.

    Args:
        model: a :class:`GPT`. train_ids, val_ids: 1-D int64 tensors of token ids.
        steps: number of optimizer steps (> 0). batch_size, eval_every, eval_batches: > 0.
        lr: peak learning rate. seed: seeds the batches (the model's initialization is the caller's).
        progress: show the progress bar.

    Returns:
        A :class:`TrainingLog`. The model is left in eval mode.

    Raises:
        TypeError / ValueError: sizes not positive ints; ids too short for one window.

    Source: chapter 14.
    """
    progress = require_flag("progress", progress)
    from tqdm.auto import tqdm

    steps = require_positive_int("steps", steps)
    eval_every = require_positive_int("eval_every", eval_every)
    device = next(model.parameters()).device
    T = model.config.block_size
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    log = TrainingLog(device=str(device))
    start = time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc="training", disable=not progress)
    for step in bar:
        model.train()
        inputs, targets = random_windows(train_ids, batch_size, T, generator)
        loss = next_token_loss(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        log.train_loss.append(loss.item())
        if step % eval_every == 0 or step == steps:
            log.val_steps.append(step)
            log.val_loss.append(
                evaluate_loss(model, val_ids, batches=eval_batches, batch_size=batch_size)
            )
            bar.set_postfix(train=f"{log.train_loss[-1]:.3f}", val=f"{log.val_loss[-1]:.3f}")
    model.eval()
    log.seconds = time.perf_counter() - start
    return log


def unigram_cross_entropy(train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats per token) on ``val_ids`` of the unigram model fitted on ``train_ids``.

    The baseline a next-token model must beat: it predicts every token from the training
    frequencies alone, ignoring context. Counts are add-one (Laplace) smoothed so that a token
    unseen in training has a finite loss. The uniform baseline is ``log(vocab_size)``.

    Raises:
        TypeError / ValueError: ids not 1-D integer tensors; ``vocab_size`` not a positive int.

    Source: chapter 14.
    """
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        require_tensor(name, ids)
        require_rank(name, ids, 1, "(N,)")
    V = require_positive_int("vocab_size", vocab_size)
    counts = torch.bincount(train_ids, minlength=V).double() + 1.0  # (V,)
    log_p = torch.log(counts / counts.sum())  # (V,)
    return float(-log_p[val_ids].mean())


def seed_comparison(gaps) -> dict:
    """Judge a difference measured over several seeds against how much it moves from seed to seed.

    Args: ``gaps``: the same difference (e.g. one model's validation loss minus another's, nats) measured
    once per seed, at least two finite floats.

    Returns {"mean": float, "spread": float, "clear": bool}: the mean over the seeds; the spread, the
    largest minus the smallest gap (its seed-to-seed range, the run's noise); and ``clear``, whether
    ``|mean| > spread``. A generated sentence names a direction only when ``clear``; otherwise it says the
    run cannot tell (issue 26: no conclusion from a difference smaller than the run's noise).

    Raises: ValueError: fewer than two gaps, or a gap that is not a finite number. Source: chapter 14
    (weight tying).
    """
    gaps = list(gaps)
    if len(gaps) < 2:
        raise ValueError(f"gaps must hold at least two seeds' differences (a spread needs two), got {len(gaps)}")
    if not all(isinstance(g, (int, float)) and math.isfinite(g) for g in gaps):
        raise ValueError(f"gaps must be finite numbers, got {gaps!r}")
    mean = sum(gaps) / len(gaps)
    spread = max(gaps) - min(gaps)
    return {"mean": mean, "spread": spread, "clear": bool(abs(mean) > spread)}
