"""Induction heads: a two-layer attention-only transformer trained on repeated random spans.

Each training sequence is ``seq_len`` uniformly random tokens in which a span of ``span`` tokens
appears twice: once at a random start ``first`` and again, later, at a random start ``second``
(``second >= first + span``). The first occurrence cannot be predicted (loss about ``log V``); the
second can, from the context, if the model finds the earlier copy of the current token and reads
the token that followed it. Elhage et al. 2021 and Olsson et al. 2022 found that two heads in two
layers do it together:

- a *previous-token head* (layer 1) writes into position ``j`` which token sits at ``j - 1``;
- an *induction head* (layer 2) at position ``t`` attends to the position ``j`` whose previous token
  equals the current token (its keys read what the previous-token head wrote: K-composition) and
  copies the token at ``j`` into the prediction.

The model, :class:`AttentionOnly`, is a small dedicated class built from the package's attention:
token embedding (:class:`selfattn.embeddings.TokenEmbedding`), then
``n_layers`` residual :class:`selfattn.multihead.MultiHeadAttention` layers (their ``W_Q``, ``W_K``,
``W_V``, ``W_O`` run with :func:`selfattn.attention.scaled_dot_product_attention`, the causal
mask and RoPE on the queries and keys), and a linear read-out. No feed-forward networks and no layer norms, as in Elhage et al.'s
attention-only models, so that a head's ``W_Q W_K^T`` and ``W_V W_O`` act directly on the residual
stream and the composition scores of :func:`composition_scores` are exact (averaged over the
RoPE rotations a layer applies). The gap between the two
occurrences varies from sequence to sequence, so no head can solve the task by a fixed offset.

Introduced in chapter 14 (claim 31).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from .._runcache import shared_run
from .._threads import one_thread
from .._validate import require_positive_int, require_rank, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..embeddings import TokenEmbedding
from ..masks import causal_mask
from ..multihead import MHAConfig, MultiHeadAttention, merge_heads, split_heads
from ..positions import apply_rope, make_positions

__all__ = [
    "InductionConfig",
    "RepeatedSpans",
    "repeated_spans",
    "AttentionOnly",
    "InductionRun",
    "train_induction",
    "head_means",
    "run_ablated",
    "span_losses",
    "previous_token_scores",
    "induction_scores",
    "composition_scores",
    "composition_baseline",
]

SIDES = (None, "queries", "keys", "values")


@dataclass(frozen=True)
class InductionConfig:
    """The task's and the model's sizes and the training budget, validated at construction.

    Attributes:
        vocab_size: V, number of token ids (>= 2). seq_len: T, tokens per sequence. span: S, the
            length of the repeated span (>= 2, ``2 * span <= seq_len``).
        d_model: D. n_heads: H (D divisible by H). n_layers: attention layers (>= 2 for induction).
        steps, batch_size, lr: Adam steps, sequences per step, learning rate (constant after a
            warm-up of ``steps // 20`` steps).
        init_std: standard deviation of the token embedding's initial entries.
        rope_layers: how many of the first layers rotate their queries and keys with RoPE (the
            only source of positions; default: every layer).
        final_norm: put a layer norm ``ln_f`` before the read-out (chapter 15's model, whose
            logits are split through that norm); default False (chapter 14's model).

    Raises:
        ValueError / TypeError: sizes that are not positive ints, ``span < 2``, ``2 * span > seq_len``,
        ``vocab_size < 2``, D not divisible by H, ``lr`` not a finite number > 0.
    """

    vocab_size: int = 32
    seq_len: int = 32
    span: int = 12
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    steps: int = 1500
    batch_size: int = 32
    lr: float = 5e-3
    init_std: float = 1.0
    rope_layers: int = 2
    final_norm: bool = False

    def __post_init__(self):
        if not isinstance(self.final_norm, bool):
            raise TypeError(f"final_norm must be a bool; got {self.final_norm!r}")
        for name in ("vocab_size", "seq_len", "span", "d_model", "n_heads", "n_layers", "steps", "batch_size"):
            require_positive_int(name, getattr(self, name))
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2; got {self.vocab_size}")
        if self.span < 2 or 2 * self.span > self.seq_len:
            raise ValueError(f"span must be >= 2 and 2 * span <= seq_len={self.seq_len}; got span={self.span}")
        MHAConfig(self.d_model, self.n_heads)  # D divisible by H, with the usual message
        if isinstance(self.rope_layers, bool) or not isinstance(self.rope_layers, int) or not (
                0 <= self.rope_layers <= self.n_layers):
            raise ValueError(f"rope_layers must be an int in [0, n_layers={self.n_layers}]; got {self.rope_layers!r}")
        if self.d_head % 2:
            raise ValueError(f"RoPE needs an even d_head = d_model / n_heads; got {self.d_head}")
        if not (isinstance(self.init_std, (int, float)) and math.isfinite(self.init_std) and self.init_std > 0):
            raise ValueError(f"init_std must be a finite number > 0; got {self.init_std!r}")
        lr = self.lr
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0; got {lr!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class RepeatedSpans:
    """A batch of sequences with one repeated span.

    Attributes:
        ids: (B, T) int64 token ids in [0, V). first, second: (B,) int64, where the span starts
            the first and the second time (``second >= first + span``). span: S.
    """

    ids: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor
    span: int


def repeated_spans(batch_size: int, config: InductionConfig, generator: torch.Generator) -> RepeatedSpans:
    """``batch_size`` sequences of uniform random tokens with a span copied later in each.

    The first start is uniform over the starts that leave room for both copies, the second uniform
    over ``first + span .. T - span``; the span's tokens are random, like the rest.

    Args:
        batch_size: B (> 0). config: an :class:`InductionConfig` (V, T, S). generator: a
            ``torch.Generator``, the only source of randomness (the same seed gives the same batch).

    Returns:
        A :class:`RepeatedSpans`.

    Raises:
        TypeError / ValueError: ``batch_size`` not a positive int, ``config`` not an
        InductionConfig, ``generator`` not a torch.Generator.

    Source: chapter 14 (after Olsson et al. 2022's repeated random tokens).
    """
    B = require_positive_int("batch_size", batch_size)
    if not isinstance(config, InductionConfig):
        raise TypeError(f"config must be an InductionConfig; got {type(config).__name__}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    V, T, S = config.vocab_size, config.seq_len, config.span
    ids = torch.randint(V, (B, T), generator=generator)  # (B, T)
    first = torch.randint(T - 2 * S + 1, (B,), generator=generator)  # 0 .. T - 2S
    room = T - S - (first + S) + 1  # how many starts the second copy has: first + S .. T - S
    second = first + S + (torch.rand(B, generator=generator) * room).long().clamp(max=room - 1)
    offsets = torch.arange(S)
    rows = torch.arange(B)[:, None]
    ids[rows, second[:, None] + offsets] = ids[rows, first[:, None] + offsets]  # (B, S): the copy
    return RepeatedSpans(ids, first, second, S)


class AttentionOnly(nn.Module):
    """A transformer with attention layers only: ``logits = W_U(x_L)``, ``x_l = x_{l-1} + attn_l(x_{l-1})``.

    ``x_0 = E[ids]``, the token embedding alone. Each layer is a
    :class:`~selfattn.multihead.MultiHeadAttention` (with biases) under the causal mask; no
    feed-forward network, no layer norm. Positions enter only through the queries and keys of the
    first ``rope_layers`` layers (all of them by default), rotated by RoPE (chapter 08), as in the
    capstone GPT. The residual stream holds no position vector, so a head cannot copy *where* a
    token sat into a later position; a later layer knows which token preceded a position only
    from what an earlier head wrote there. (With a learned position table, one of our seeds found
    another route: a layer-1 head that attends to the earlier copy of the current token and hands
    its position to layer 2's queries.)

    Shapes:
        forward(ids (B, T) int64, T <= seq_len) -> logits (B, T, V); with ``return_weights=True`` also
        a tuple of n_layers weights (B, H, T, T).

    Raises:
        TypeError / ValueError: ``config`` not an InductionConfig; ``ids`` not (B, T) with
        0 < T <= seq_len and ids in [0, V).

    Source: Elhage et al. 2021 (attention-only transformers); Su et al. 2021 (RoPE); chapter 14.
    """

    def __init__(self, config: InductionConfig):
        super().__init__()
        if not isinstance(config, InductionConfig):
            raise TypeError(f"config must be an InductionConfig; got {type(config).__name__}")
        self.config = config
        self.token_embedding = TokenEmbedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(
            MultiHeadAttention(MHAConfig(config.d_model, config.n_heads)) for _ in range(config.n_layers)
        )
        self.unembed = nn.Linear(config.d_model, config.vocab_size)
        # chapter 15's variant reads the stream through a final layer norm; chapter 14's reads it as is
        self.ln_f = nn.LayerNorm(config.d_model) if config.final_norm else nn.Identity()
        self.rope = make_positions("rope", max_positions=config.seq_len, d_model=config.d_model,
                                   n_heads=config.n_heads)
        with torch.no_grad():  # unit-variance entries: with no layer norm, this sets the scale the scores start at
            self.token_embedding.weight.normal_(0.0, config.init_std)

    def _check_ids(self, ids) -> None:
        require_tensor("ids", ids)
        require_rank("ids", ids, 2, "(B, T)")
        if not 0 < ids.shape[1] <= self.config.seq_len:
            raise ValueError(f"ids must hold 1 .. seq_len={self.config.seq_len} positions; got shape {shape_of(ids)}")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        self._check_ids(ids)
        return self.token_embedding(ids)  # (B, T, D): no position vector

    def head_contexts(self, layer: int, x_q, x_k=None, x_v=None):
        """Layer ``layer``'s per-head contexts (B, H, T, Dh) and weights (B, H, T, T), with queries,
        keys and values read from ``x_q``, ``x_k``, ``x_v`` (each (B, T, D); default ``x_q``)."""
        attn = self.layers[layer]
        H = self.config.n_heads
        x_k = x_q if x_k is None else x_k
        x_v = x_q if x_v is None else x_v
        Q = split_heads(x_q @ attn.W_Q + attn.b_Q, H)  # (B, T, D) -> (B, H, T, Dh)
        K = split_heads(x_k @ attn.W_K + attn.b_K, H)
        if layer < self.config.rope_layers:  # positions 0 .. T-1
            Q, K = self.rope.rotate(Q, 0), self.rope.rotate(K, 0)
        V = split_heads(x_v @ attn.W_V + attn.b_V, H)
        T = x_q.shape[1]
        return scaled_dot_product_attention(Q, K, V, causal_mask(T, device=x_q.device), return_weights=True)

    def write(self, layer: int, contexts: torch.Tensor) -> torch.Tensor:
        """What layer ``layer`` adds to the residual stream: merged contexts (B, H, T, Dh) @ W_O + b_O."""
        attn = self.layers[layer]
        return merge_heads(contexts) @ attn.W_O + attn.b_O  # (B, T, D) @ (D, D) -> (B, T, D)

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream (B, T, D) -> logits (B, T, V): ``unembed(ln_f(x))`` (``ln_f`` the identity
        unless ``config.final_norm``)."""
        return self.unembed(self.ln_f(x))

    def forward(self, ids: torch.Tensor, *, return_weights: bool = False):
        x = self.embed(ids)
        weights = []
        for layer in range(self.config.n_layers):
            contexts, w = self.head_contexts(layer, x)
            x = x + self.write(layer, contexts)  # (B, T, D)
            weights.append(w)
        logits = self.readout(x)  # (B, T, D) -> (B, T, V)
        return (logits, tuple(weights)) if return_weights else logits


@dataclass
class InductionRun:
    """A trained :class:`AttentionOnly` (eval mode), its training loss per step (nats per token, over
    all positions) and the seed."""

    model: AttentionOnly
    train_loss: list[float] = field(default_factory=list)
    seed: int = 0
    #: with ``train_induction(..., eval_every=n)``: the steps (1-based, after the update) at which the
    #: scores below were measured on one fixed batch, and each head's previous-token and induction
    #: score there, (n_evals, L, H) float tensors; empty otherwise
    eval_steps: list[int] = field(default_factory=list)
    prev_scores: torch.Tensor | None = None
    ind_scores: torch.Tensor | None = None


@shared_run
def train_induction(config: InductionConfig = InductionConfig(), seed: int = 0, *, eval_every: int = 0,
                    eval_size: int = 256) -> InductionRun:
    """Train an :class:`AttentionOnly` model on :func:`repeated_spans` batches, next-token loss.

    ``torch.manual_seed(seed)`` fixes the initial weights, a generator seeded by ``seed`` the batches;
    Adam at ``config.lr`` after a linear warm-up, gradient clipping at norm 1. Runs on one CPU thread
    (restored afterwards), so the result does not depend on the machine's thread count or load.

    With ``eval_every`` = n > 0, every n steps (and before the first) each head's
    :func:`previous_token_scores` and :func:`induction_scores` are measured on one fixed batch of
    ``eval_size`` sequences, drawn once from its own generator (seed ``10_000 + seed``), without
    gradients: the training's random stream and the trained weights are those of ``eval_every=0``
    (tested bit for bit). This is how Olsson et al. 2022 (section 4) date the phase change: the loss
    bump and the induction score rising together.

    Raises:
        TypeError / ValueError: ``config`` not an InductionConfig; ``seed`` not an int; ``eval_every``
        not an int >= 0 or ``eval_size`` not a positive int.

    Source: chapter 14.
    """
    if not isinstance(config, InductionConfig):
        raise TypeError(f"config must be an InductionConfig; got {type(config).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int; got {seed!r}")
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
        raise ValueError(f"eval_every must be an int >= 0 (0: no evaluation); got {eval_every!r}")
    eval_size = require_positive_int("eval_size", eval_size)
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AttentionOnly(config)
        generator = torch.Generator().manual_seed(seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        warmup = max(1, config.steps // 20)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
        run = InductionRun(model, seed=seed)
        probe = repeated_spans(eval_size, config, torch.Generator().manual_seed(10_000 + seed)) if eval_every else None
        prev, ind = [], []

        def evaluate(step: int) -> None:  # no gradients, no random numbers: training is untouched
            with torch.no_grad():
                _, weights = model(probe.ids, return_weights=True)
            run.eval_steps.append(step)
            prev.append(torch.stack([previous_token_scores(w) for w in weights]))
            ind.append(torch.stack([induction_scores(w, probe) for w in weights]))

        if eval_every:
            evaluate(0)
        for step in range(config.steps):
            batch = repeated_spans(config.batch_size, config, generator)
            logits = model(batch.ids[:, :-1])  # (B, T - 1, V): predict token t + 1 from 0 .. t
            loss = nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), batch.ids[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            run.train_loss.append(loss.item())
            if eval_every and (step + 1) % eval_every == 0:
                evaluate(step + 1)
        model.eval()
        if eval_every:
            run.prev_scores, run.ind_scores = torch.stack(prev), torch.stack(ind)  # (n_evals, L, H)
    return run


def _require_model(model) -> None:
    if not isinstance(model, AttentionOnly):
        raise TypeError(f"model must be an AttentionOnly; got {type(model).__name__}")


def _require_batch(batch, model) -> None:
    if not isinstance(batch, RepeatedSpans):
        raise TypeError(f"batch must be a RepeatedSpans; got {type(batch).__name__}")
    model._check_ids(batch.ids)


@torch.no_grad()
def head_means(model: AttentionOnly, batch: RepeatedSpans) -> torch.Tensor:
    """Each head's context vector averaged over every position of every sequence: (L, H, Dh).

    What a mean ablation substitutes: the same definition as chapter 13's
    :func:`selfattn.interpret.dataset_means` (``contexts``), for this model.

    Raises:
        TypeError / ValueError: not an AttentionOnly; not a RepeatedSpans that fits the model.

    Source: chapter 14 (mean ablation as in chapter 13).
    """
    _require_model(model)
    _require_batch(batch, model)
    x = model.embed(batch.ids)
    means = []
    for layer in range(model.config.n_layers):
        contexts, _ = model.head_contexts(layer, x)  # (B, H, T, Dh)
        means.append(contexts.mean(dim=(0, 2)))  # (H, Dh)
        x = x + model.write(layer, contexts)
    return torch.stack(means)  # (L, H, Dh)


def _require_heads(heads, model) -> list[tuple[int, int]]:
    L, H = model.config.n_layers, model.config.n_heads
    try:
        heads = [(int(layer), int(h)) for layer, h in heads]
    except (TypeError, ValueError):
        raise TypeError(f"heads must be an iterable of (layer, head) pairs; got {heads!r}") from None
    bad = [(layer, h) for layer, h in heads if not (0 <= layer < L and 0 <= h < H)]
    if bad:
        raise ValueError(f"heads must be (layer, head) pairs with layer in [0, {L}) and head in [0, {H}); got {bad}")
    return heads


@torch.no_grad()
def run_ablated(
    model: AttentionOnly, ids: torch.Tensor, means: torch.Tensor, heads=(), *, side: str | None = None
):
    """Logits (B, T, V) and weights with the outputs of ``heads`` replaced by their mean contexts.

    Two residual streams run side by side: the clean one and the patched one, in which each listed
    head writes ``means[l, h] @ W_O^h`` at every position instead of its context. With ``side=None``
    the model reads only the patched stream (an ordinary mean ablation). With ``side="keys"``
    (or ``"queries"``, ``"values"``), the layers after the ablated head read their keys (or queries,
    or values) from the patched stream and everything else, the read-out included, from the clean
    one: the head is removed from one input of the later layers only (path patching, Wang et al.
    2023). Whatever a later layer writes goes into both streams.

    Args:
        model: an :class:`AttentionOnly`. ids: (B, T) int64. means: (L, H, Dh), from
            :func:`head_means`. heads: (layer, head) pairs (empty: the clean model).
        side: None, ``"queries"``, ``"keys"`` or ``"values"``.

    Returns:
        (logits (B, T, V), tuple of L weights (B, H, T, T)).

    Raises:
        TypeError / ValueError: a bad model, ids, means of the wrong shape, heads out of range, an
        unknown side.

    Source: chapter 14.
    """
    _require_model(model)
    c = model.config
    require_tensor("means", means)
    if tuple(means.shape) != (c.n_layers, c.n_heads, c.d_head):
        raise ValueError(f"means must have shape (L, H, Dh) = {(c.n_layers, c.n_heads, c.d_head)}; got {shape_of(means)}")
    heads = _require_heads(heads, model)
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}; got {side!r}")
    clean = model.embed(ids)  # (B, T, D)
    patched = clean
    weights = []
    for layer in range(c.n_layers):
        reads = {s: (patched if side in (None, s) else clean) for s in ("queries", "keys", "values")}
        contexts, w = model.head_contexts(layer, reads["queries"], reads["keys"], reads["values"])  # (B, H, T, Dh)
        out = model.write(layer, contexts)  # (B, T, D)
        ablated = [h for lay, h in heads if lay == layer]
        if ablated:
            swapped = contexts.clone()
            swapped[:, ablated] = means[layer, ablated][None, :, None, :]  # (B, n, T, Dh) <- (1, n, 1, Dh)
            patched = patched + model.write(layer, swapped)
        else:
            patched = patched + out
        clean = clean + out
        weights.append(w)
    return model.readout(patched if side is None else clean), tuple(weights)


@torch.no_grad()
def span_losses(logits: torch.Tensor, batch: RepeatedSpans) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss (nats) of predicting each span token from the one before it, in both occurrences.

    Position ``i`` (0 .. S - 2) of the result is the mean over the batch of the loss of predicting
    token ``start + i + 1`` from the logits at ``start + i``, with ``start`` the first occurrence
    (result 1) or the second (result 2). The first token of each occurrence is never a target: it
    follows a random token.

    Args:
        logits: (B, T, V), the model's logits on ``batch.ids``. batch: a :class:`RepeatedSpans`.

    Returns:
        (first (S - 1,), second (S - 1,)) float tensors.

    Raises:
        TypeError / ValueError: not a RepeatedSpans; logits not (B, T, V) for this batch.

    Source: chapter 14.
    """
    if not isinstance(batch, RepeatedSpans):
        raise TypeError(f"batch must be a RepeatedSpans; got {type(batch).__name__}")
    require_tensor("logits", logits)
    B, T = batch.ids.shape
    if logits.ndim != 3 or tuple(logits.shape[:2]) != (B, T):
        raise ValueError(f"logits must have shape (B, T, V) = ({B}, {T}, V); got {shape_of(logits)}")
    log_p = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    offsets = torch.arange(batch.span - 1)
    rows = torch.arange(B)[:, None]
    result = []
    for start in (batch.first, batch.second):
        at = start[:, None] + offsets  # (B, S - 1): the positions that predict
        targets = batch.ids[rows, at + 1]  # (B, S - 1)
        result.append(-log_p[rows, at, targets].mean(dim=0))  # (S - 1,)
    return result[0], result[1]


def _require_weights(weights) -> torch.Tensor:
    require_tensor("weights", weights)
    require_rank("weights", weights, 4, "(B, H, T, T)")
    if weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 2:
        raise ValueError(f"weights must be (B, H, T, T) with T >= 2; got shape {shape_of(weights)}")
    return weights


def previous_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """Each head's previous-token score: its mean attention weight from position t to t - 1.

    ``score[h] = mean over b and t = 1 .. T - 1 of weights[b, h, t, t - 1]``; 1 for a head that
    always reads the token before, 1 / (t + 1) at t for uniform causal attention.

    Args:
        weights: (B, H, T, T) attention weights (rows sum to 1), T >= 2.

    Returns:
        (H,) float tensor in [0, 1].

    Raises:
        TypeError / ValueError: not a tensor of shape (B, H, T, T) with T >= 2.

    Source: Elhage et al. 2021, Olsson et al. 2022 (previous-token heads); chapter 14.
    """
    weights = _require_weights(weights)
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (B, H, T - 1) -> (H,)


def induction_scores(weights: torch.Tensor, batch: RepeatedSpans) -> torch.Tensor:
    """Each head's induction score on repeated spans: its mean attention from a token of the second
    occurrence to the token after that token's earlier copy.

    ``score[h] = mean over b and i = 0 .. S - 2 of weights[b, h, second_b + i, first_b + i + 1]``: the
    query at ``second + i`` holds the same token as ``first + i``; an induction head attends to
    ``first + i + 1``, the token that came next last time (and is the right prediction now).

    Args:
        weights: (B, H, T, T), on ``batch.ids``. batch: a :class:`RepeatedSpans`.

    Returns:
        (H,) float tensor in [0, 1].

    Raises:
        TypeError / ValueError: not a RepeatedSpans; weights not (B, H, T, T) for this batch.

    Source: Olsson et al. 2022 (the induction-head score on repeated random tokens); chapter 14.
    """
    if not isinstance(batch, RepeatedSpans):
        raise TypeError(f"batch must be a RepeatedSpans; got {type(batch).__name__}")
    weights = _require_weights(weights)
    B, T = batch.ids.shape
    if weights.shape[0] != B or weights.shape[-1] != T:
        raise ValueError(f"weights must be (B, H, T, T) = ({B}, H, {T}, {T}) for this batch; got {shape_of(weights)}")
    offsets = torch.arange(batch.span - 1)
    rows = torch.arange(B)[:, None]
    queries = batch.second[:, None] + offsets  # (B, S - 1)
    keys = batch.first[:, None] + offsets + 1  # (B, S - 1)
    picked = weights.permute(0, 2, 3, 1)[rows, queries, keys]  # (B, S - 1, H)
    return picked.mean(dim=(0, 1))  # (H,)


def _head_matrices(model: AttentionOnly, layer: int, offset: int = 0):
    """Per head of ``layer``: W_QK = W_Q^h R W_K^h^T and W_OV = W_V^h W_O^h, each (H, D, D), with R
    the RoPE rotation of a query ``offset`` positions after its key (the identity in a layer without
    RoPE): ``(q R_t) . (k R_s) = q R_{t-s} k^T``."""
    attn = model.layers[layer]
    Dh = model.config.d_head
    R = torch.eye(Dh)
    if layer < model.config.rope_layers:  # the rows of the identity, rotated at position offset
        R = apply_rope(torch.eye(Dh), torch.full((Dh,), offset), base=model.rope.base, layout=model.rope.layout)
    heads = [attn.head_weights(h) for h in range(model.config.n_heads)]
    W_QK = torch.stack([hw.W_Q @ R @ hw.W_K.T for hw in heads])  # (D, Dh) @ (Dh, Dh) @ (Dh, D) -> (D, D)
    W_OV = torch.stack([hw.W_V @ hw.W_O for hw in heads])  # (D, Dh) @ (Dh, D) -> (D, D)
    return W_QK, W_OV


def _composition(W_QK2, W_OV2, W_OV1) -> dict[str, torch.Tensor]:
    """Scores (H1, H2) for every pair of a head of the earlier layer and one of the later layer."""
    fro = torch.linalg.matrix_norm  # Frobenius norm of the last two axes
    n_qk, n_ov2, n_ov1 = fro(W_QK2)[None, :], fro(W_OV2)[None, :], fro(W_OV1)[:, None]  # (1, H2), (1, H2), (H1, 1)
    # Row-vector convention (x @ W): head 1 writes y @ W_OV1; a later score is x_q @ W_QK2 @ x_k^T.
    keys = fro(W_QK2[None] @ W_OV1[:, None].transpose(-1, -2))  # x_q W_QK (y W_OV1)^T: (H1, H2)
    queries = fro(W_OV1[:, None] @ W_QK2[None])  # (y W_OV1) W_QK x_k^T
    values = fro(W_OV1[:, None] @ W_OV2[None])  # (y W_OV1) W_OV2
    return {
        "keys": keys / (n_qk * n_ov1),
        "queries": queries / (n_qk * n_ov1),
        "values": values / (n_ov2 * n_ov1),
    }


@torch.no_grad()
def composition_scores(model: AttentionOnly, earlier: int = 0, later: int = 1) -> dict[str, torch.Tensor]:
    """Elhage et al. 2021's composition scores between the heads of two layers.

    For head h1 of layer ``earlier`` (``W_OV^h1 = W_V^h1 W_O^h1``, what it writes) and head h2 of layer
    ``later`` (``W_QK^h2 = W_Q^h2 W_K^h2^T``, ``W_OV^h2``), with ``||.||`` the Frobenius norm and the
    row-vector convention of the package (``x @ W``):

    - K-composition: ``||W_QK^h2 (W_OV^h1)^T|| / (||W_QK^h2|| ||W_OV^h1||)`` (h2's keys read h1's output);
    - Q-composition: ``||W_OV^h1 W_QK^h2|| / (||W_QK^h2|| ||W_OV^h1||)`` (its queries read it);
    - V-composition: ``||W_OV^h1 W_OV^h2|| / (||W_OV^h2|| ||W_OV^h1||)`` (its values read it).

    In a layer with RoPE a query ``d`` positions after its key meets ``W_Q^h2 R_d W_K^h2^T`` (``R_d``
    the rotation by ``d`` positions); the scores are then averaged over ``d = 0 .. seq_len - 1``.
    Each is at most 1; it is large when what h1 writes lies where h2 reads. Compare with
    :func:`composition_baseline` (random matrices of the same shapes).

    Returns:
        ``{"keys", "queries", "values"}``, each an (H, H) float tensor indexed [h1, h2].

    Raises:
        TypeError / ValueError: not an AttentionOnly; ``earlier >= later`` or a layer out of range.

    Source: Elhage et al. 2021, "Composition scores"; chapter 14.
    """
    _require_model(model)
    L = model.config.n_layers
    for name, v in (("earlier", earlier), ("later", later)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < L:
            raise ValueError(f"{name} must be a layer index in [0, {L}); got {v!r}")
    if earlier >= later:
        raise ValueError(f"earlier must be a layer before later; got earlier={earlier}, later={later}")
    _, W_OV1 = _head_matrices(model, earlier)
    # With RoPE the later layer's bilinear form depends on how far the key lies behind the query:
    # average the scores over the offsets 0 .. T-1 a sequence holds (one offset without RoPE).
    offsets = range(model.config.seq_len) if later < model.config.rope_layers else range(1)
    per_offset = []
    for offset in offsets:
        W_QK2, W_OV2 = _head_matrices(model, later, offset)
        per_offset.append(_composition(W_QK2, W_OV2, W_OV1))
    return {k: torch.stack([p[k] for p in per_offset]).mean(dim=0) for k in per_offset[0]}


@torch.no_grad()
def composition_baseline(d_model: int, d_head: int, n: int = 200, seed: int = 0) -> dict[str, float]:
    """The mean composition scores of ``n`` pairs of random heads of the same shapes.

    Every ``W_Q, W_K, W_V`` (D, Dh) and ``W_O`` (Dh, D) is drawn with i.i.d. standard normal entries
    (the scores do not depend on the scale): the value a score takes when the two heads' subspaces
    are unrelated (about 0.18 for D = 32, Dh = 8). A trained pair well above it shares a subspace.

    Raises:
        TypeError / ValueError: sizes not positive ints; ``d_head > d_model``.

    Source: Elhage et al. 2021 (random-matrix baseline of the composition scores); chapter 14.
    """
    D, Dh, n = (require_positive_int(k, v) for k, v in (("d_model", d_model), ("d_head", d_head), ("n", n)))
    if Dh > D:
        raise ValueError(f"d_head={Dh} must be <= d_model={D}")
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(n, *shape, generator=g, dtype=torch.float64)

    W_QK2 = draw(D, Dh) @ draw(Dh, D)
    W_OV2 = draw(D, Dh) @ draw(Dh, D)
    W_OV1 = draw(D, Dh) @ draw(Dh, D)
    fro = torch.linalg.matrix_norm
    return {
        "keys": float((fro(W_QK2 @ W_OV1.transpose(-1, -2)) / (fro(W_QK2) * fro(W_OV1))).mean()),
        "queries": float((fro(W_OV1 @ W_QK2) / (fro(W_QK2) * fro(W_OV1))).mean()),
        "values": float((fro(W_OV1 @ W_OV2) / (fro(W_OV2) * fro(W_OV1))).mean()),
    }
