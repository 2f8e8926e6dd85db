"""What attention weights do and do not tell: four per-edge measures on the real model.

For one sentence run through the package's :class:`~selfattn.encoder.Encoder` (all-MiniLM-L6-v2),
and a scalar output ``f`` of the model, every edge (layer l, head h, query i, key j) gets:

- its **attention weight** ``alpha[l, h, i, j]``;
- its **norm-weighted** value (Kobayashi et al. 2020, eq. 6): ``||alpha_ij * (x_j W_V^h + b_V^h) W_O^h||``,
  the length of the vector the edge actually adds to query i's output;
- its **gradient x weight**: ``alpha_ij * df/d alpha_ij``, a gradient-times-input attribution with
  the weight as the input, the first-order estimate of how ``f`` changes if the edge is removed;
- its **ablation effect**: ``f(edge blocked) - f``, measured by running the model again with the
  edge removed by the keep-mask. Blocking a key *renormalises* the row: the remaining weights are
  divided by ``1 - alpha_ij``, exactly what ``softmax`` does when the key is absent. A whole head
  is ablated by blocking all its keys, which makes its context zero (the package's contract for a
  query that sees nothing).

Beside them, two summaries and a second kind of intervention:

- **attention rollout** (Abnar & Zuidema 2020): the product over layers of ``0.5 I + 0.5 A_l``
  (heads averaged, rows renormalised), an estimate of how much each input token flows into each
  output position through attention and the residual stream (:func:`attention_rollout`);
- **mean ablation**: instead of removing a contribution (zero ablation: a blocked key, a zeroed head
  or token), replace it by its mean over a dataset of sentences, so the model sees a typical value
  rather than one it never saw in training (:func:`dataset_means`, :func:`mean_ablate_keys`,
  :func:`mean_ablate_heads`, :func:`ablate_tokens`).

The scalar ``f`` is what all-MiniLM-L6-v2 is for: the cosine similarity of the sentence's
embedding (mean of the last layer over its tokens, L2-normalised) with a reference sentence's.

The interventions use only the public parts of the encoder: its ``embeddings`` and ``blocks``,
each block called with a per-layer keep-mask (:func:`run_layers`), and a forward hook on each
block's attention that keeps the gradient of its weights (:func:`edge_attributions`).

Introduced in chapter 13 (claim 19). Sources: Jain & Wallace 2019; Wiegreffe & Pinter 2019;
Kobayashi et al. 2020; Abnar & Zuidema 2020.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._validate import require_rank, require_tensor, shape_of
from .encoder import Encoder
from .multihead import split_heads

__all__ = [
    "run_layers",
    "sentence_embedding",
    "EdgeAttributions",
    "edge_attributions",
    "value_norms",
    "ablate_heads",
    "ablate_edges",
    "ablate_keys",
    "spearman",
    "per_head_spearman",
    "attention_rollout",
    "DatasetMeans",
    "dataset_means",
    "mean_ablate_keys",
    "zero_value_keys",
    "mean_ablate_heads",
    "ablate_tokens",
    "importance_correlations",
]


def _require_encoder(encoder) -> None:
    if not isinstance(encoder, Encoder):
        raise TypeError(f"encoder must be a selfattn.encoder.Encoder; got {type(encoder).__name__}")


def run_layers(
    encoder: Encoder,
    x: torch.Tensor,
    *,
    start: int = 0,
    masks: dict[int, torch.Tensor] | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Run the encoder's blocks ``start, start + 1, ...`` on hidden states ``x``, with extra keep-masks.

    Args:
        encoder: the package's :class:`~selfattn.encoder.Encoder` (sentences without padding).
        x: (B, T, D), the input of block ``start`` (for ``start = 0``, ``encoder.embeddings(ids)``).
        start: index of the first block to run.
        masks: ``{layer: boolean keep-mask broadcastable to (B, H, T, T)}``; block ``layer`` is called
            with that mask (True = may attend), every other block with none.

    Returns:
        ``(hidden_states, weights)``: the outputs of the blocks that ran, each (B, T, D), and their
        attention weights, each (B, H, T, T).

    Raises:
        TypeError / ValueError: not an Encoder; ``x`` not (B, T, D); ``start`` out of range; a mask
        that is not a boolean tensor broadcastable to (B, H, T, T).

    Source: chapter 13.
    """
    _require_encoder(encoder)
    require_tensor("x", x)
    require_rank("x", x, 3, "(B, T, D)")
    L = len(encoder.blocks)
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < L:
        raise ValueError(f"start must be an int in [0, {L}); got {start!r}")
    masks = {} if masks is None else masks
    hidden_states, weights = [], []
    for layer in range(start, L):
        x, w = encoder.blocks[layer](
            x, masks.get(layer), return_weights=True
        )  # (B, T, D), (B, H, T, T)
        hidden_states.append(x)
        weights.append(w)
    return tuple(hidden_states), tuple(weights)


def sentence_embedding(hidden: torch.Tensor) -> torch.Tensor:
    """all-MiniLM-L6-v2's sentence embedding of unpadded sentences: mean over positions, L2-normalised.

    (B, T, D) -> (B, D). Differentiable. Source: chapter 13 (as ``MiniLM.sentence_embedding``).
    """
    pooled = hidden.mean(dim=1)  # (B, T, D) -> (B, D)
    return pooled / pooled.norm(dim=-1, keepdim=True)


def _target(hidden: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """f = cosine similarity of each sentence's embedding with the reference embedding: (B,)."""
    return sentence_embedding(hidden) @ reference  # (B, D) @ (D,) -> (B,)


def _check_ids(input_ids: torch.Tensor) -> None:
    require_tensor("input_ids", input_ids)
    require_rank("input_ids", input_ids, 2, "(1, T)")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"input_ids must hold one sentence, shape (1, T); got {shape_of(input_ids)}"
        )


def value_norms(encoder: Encoder, hidden_states) -> torch.Tensor:
    """``||(x_j W_V^h + b_V^h) W_O^h||`` for every layer, head and key position (Kobayashi et al. 2020).

    Args:
        hidden_states: the n_layers + 1 hidden states of one run (B, T, D) each; block l reads
            ``hidden_states[l]``.

    Returns:
        (B, L, H, T) float: the length of the vector each key would add to a query's output if it
        had all the weight. Multiply by the weights (B, L, H, T_query, T_key) to get the norms of
        the vectors each edge moves.

    Source: Kobayashi et al. 2020, section 3 (eq. 6); chapter 13.
    """
    _require_encoder(encoder)
    norms = []
    for layer, block in enumerate(encoder.blocks):
        attn = block.attn
        H, Dh = attn.config.n_heads, attn.config.d_head
        V = split_heads(hidden_states[layer] @ attn.W_V + attn.b_V, H)  # (B, T, D) -> (B, H, T, Dh)
        W_O = attn.W_O.reshape(H, Dh, -1)  # (D, D) -> (H, Dh, D): head h owns rows h*Dh:(h+1)*Dh
        moved = V @ W_O[None]  # (B, H, T, Dh) @ (1, H, Dh, D) -> (B, H, T, D)
        norms.append(moved.norm(dim=-1))  # (B, H, T)
    return torch.stack(norms, dim=1)  # L x (B, H, T) -> (B, L, H, T)


@dataclass(frozen=True)
class EdgeAttributions:
    """The per-edge measures of one sentence (NumPy float64, L layers, H heads, T tokens).

    Attributes:
        tokens: the T token strings. target: f, the cosine similarity with the reference.
        weights: (L, H, T, T) attention weights alpha (rows: queries i, columns: keys j).
        norms: (L, H, T, T) ``alpha_ij * ||v_j W_O^h||``.
        grad_x_weight: (L, H, T, T) ``alpha_ij * df/d alpha_ij`` (signed).
        token_grad_x_input: (T,) ``sum_d x_jd * df/dx_jd`` at the embeddings' output (signed).
    """

    tokens: list[str]
    target: float
    weights: np.ndarray
    norms: np.ndarray
    grad_x_weight: np.ndarray
    token_grad_x_input: np.ndarray


def edge_attributions(
    encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor, tokens: list[str]
) -> EdgeAttributions:
    """Weights, norm-weighted values and gradient x weight for every edge, from one forward and backward.

    Args:
        encoder: the package's Encoder (eval mode). input_ids: (1, T) int64, one unpadded sentence.
        reference: (D,) unit vector, the reference sentence's embedding. tokens: the T token strings.

    Returns:
        An :class:`EdgeAttributions`.

    Raises:
        TypeError / ValueError: not an Encoder; ``input_ids`` not (1, T); ``reference`` not (D,).

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    require_tensor("reference", reference)
    require_rank("reference", reference, 1, "(D,)")
    kept = []

    def keep_weight_grad(module, args, output):
        weights = output[1]  # the blocks call attention with return_weights=True
        weights.retain_grad()
        kept.append(weights)

    hooks = [block.attn.register_forward_hook(keep_weight_grad) for block in encoder.blocks]
    try:
        with torch.enable_grad():
            x = encoder.embeddings(input_ids).detach().requires_grad_(True)  # (1, T, D)
            hidden, _ = run_layers(encoder, x)
            f = _target(hidden[-1], reference)[0]
            f.backward()
    finally:
        for hook in hooks:
            hook.remove()
    weights = torch.stack([w.detach()[0] for w in kept])  # L x (H, T, T) -> (L, H, T, T)
    grads = torch.stack([w.grad[0] for w in kept])  # (L, H, T, T)
    with torch.no_grad():
        states = (x.detach(),) + tuple(h.detach() for h in hidden)
        moved = value_norms(encoder, states)[0]  # (L, H, T_key)
    as_np = lambda t: t.detach().double().numpy()  # noqa: E731
    return EdgeAttributions(
        tokens=list(tokens),
        target=float(f.detach()),
        weights=as_np(weights),
        norms=as_np(weights * moved[:, :, None, :]),  # (L, H, T, T) * (L, H, 1, T)
        grad_x_weight=as_np(weights * grads),
        token_grad_x_input=as_np((x.grad * x.detach()).sum(-1)[0]),  # (1, T, D) -> (T,)
    )


def _ablation_effects(
    encoder, input_ids, reference, layer: int, keep: torch.Tensor, chunk: int
) -> np.ndarray:
    """f(with ``keep[n]`` at ``layer``) - f for every n; keep is (N, H, T or 1, T or 1) boolean."""
    with torch.no_grad():
        x = encoder.embeddings(input_ids)  # (1, T, D)
        hidden = run_layers(encoder, x)[0]
        base = _target(hidden[-1], reference)[0]
        x_in = x if layer == 0 else hidden[layer - 1]  # (1, T, D): the input of block ``layer``
        effects = []
        for lo in range(0, keep.shape[0], chunk):
            part = keep[lo : lo + chunk]  # (n, H, ., .)
            out = run_layers(
                encoder, x_in.expand(part.shape[0], -1, -1), start=layer, masks={layer: part}
            )[0]
            effects.append(_target(out[-1], reference) - base)  # (n,)
    return torch.cat(effects).double().numpy()


def ablate_heads(encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor) -> np.ndarray:
    """Change of f when one head's context is zeroed (all its keys blocked): (L, H), signed.

    Source: chapter 13 (Michel et al. 2019's head ablation, measured on f).
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    H = encoder.config.n_heads
    keep = ~torch.eye(H, dtype=torch.bool)[:, :, None, None]  # (H, H, 1, 1): row n blocks head n
    return np.stack(
        [
            _ablation_effects(encoder, input_ids, reference, layer, keep, H)
            for layer in range(len(encoder.blocks))
        ]
    )


def ablate_edges(
    encoder: Encoder,
    input_ids: torch.Tensor,
    reference: torch.Tensor,
    layer: int,
    head: int,
    *,
    chunk: int = 64,
) -> np.ndarray:
    """Change of f when one edge (query i, key j) of one head is blocked, row renormalised: (T, T), signed.

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    H, T = encoder.config.n_heads, input_ids.shape[1]
    keep = torch.ones(T * T, H, T, T, dtype=torch.bool)  # one copy of the model per edge
    n = torch.arange(T * T)
    keep[n, head, n // T, n % T] = False  # copy n blocks edge (n // T, n % T) of ``head``
    return _ablation_effects(encoder, input_ids, reference, layer, keep, chunk).reshape(T, T)


def ablate_keys(
    encoder: Encoder,
    input_ids: torch.Tensor,
    reference: torch.Tensor,
    layer: int,
    *,
    chunk: int = 64,
) -> np.ndarray:
    """Change of f when one head stops reading one key (column j blocked for every query): (H, T), signed.

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    H, T = encoder.config.n_heads, input_ids.shape[1]
    keep = torch.ones(H * T, H, 1, T, dtype=torch.bool)
    n = torch.arange(H * T)
    keep[n, n // T, 0, n % T] = False  # copy n: head n // T does not read key n % T
    return _ablation_effects(encoder, input_ids, reference, layer, keep, chunk).reshape(H, T)


def spearman(a, b) -> float:
    """Spearman rank correlation of two equally long 1-D arrays (average ranks for ties), in [-1, 1].

    Raises:
        ValueError: different lengths, fewer than 3 entries, NaN/inf, or a constant input.

    Source: Spearman 1904; chapter 13.
    """
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape or a.size < 3:
        raise ValueError(
            f"a and b must be equally long with >= 3 entries; got {a.shape} and {b.shape}"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a and b must be finite")
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra**2).sum() * (rb**2).sum())
    if denom == 0:
        raise ValueError("a or b is constant: the rank correlation is undefined")
    return float((ra * rb).sum() / denom)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(x.size)
    # Tied values share the mean of their ranks.
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def per_head_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation over the edges of each head: (L, H, T, T) and (L, H, T, T) -> (L, H).

    Source: chapter 13.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 4:
        raise ValueError(f"a and b must both have shape (L, H, T, T); got {a.shape} and {b.shape}")
    L, H = a.shape[:2]
    return np.array([[spearman(a[l, h], b[l, h]) for h in range(H)] for l in range(L)])  # noqa: E741


def attention_rollout(weights, residual: float = 0.5) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020, eq. 1): how much each input token reaches each output.

    For each layer l, average the heads, ``A_l = mean_h weights[l, h]``, add the residual stream,
    ``R_l = residual * I + (1 - residual) * A_l``, renormalise each row to sum to one, and multiply
    from the first layer up: ``rollout = R_L @ ... @ R_2 @ R_1``. Row i then says how the output
    at position i divides over the input tokens (each row sums to one).

    Args:
        weights: (L, H, T, T) attention weights of one sentence (rows: queries, columns: keys),
            NumPy or torch; every row non-negative with a positive sum.
        residual: the weight of the identity (0.5 in the paper), in [0, 1).

    Returns:
        (T, T) float64 NumPy array.

    Raises:
        ValueError: ``weights`` not 4-D with square (T, T) maps, negative or non-finite entries,
        or ``residual`` outside [0, 1); ``residual`` 0 with a weights row (heads averaged) that sums
        to 0 (its renormalisation would be 0/0); a head-averaged row whose sum overflows.

    Source: Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", section 3; chapter 13.
    """
    w = np.asarray(weights.detach() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must have shape (L, H, T, T); got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and non-negative")
    if isinstance(residual, bool) or not isinstance(residual, (int, float)) or not 0 <= residual < 1:
        raise ValueError(f"residual must be a number in [0, 1); got {residual!r}")
    T = w.shape[-1]
    rollout = np.eye(T)
    for index, layer in enumerate(w):  # (H, T, T), first layer first
        with np.errstate(over="ignore"):  # an overflowing sum is reported below, by layer and row
            mixed = residual * np.eye(T) + (1 - residual) * layer.mean(axis=0)  # (T, T)
            total = mixed.sum(axis=-1, keepdims=True)  # (T, 1), >= residual when residual > 0
        # Renormalising a row that sums to 0 (residual 0 and a query that sees nothing, a zero row by the
        # package's mask convention) or to inf (weights near the float64 maximum) would be 0/0 or inf/inf:
        # a NaN row. Refused, naming the first such row, rather than returned.
        bad = ~(np.isfinite(total[:, 0]) & (total[:, 0] > 0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            if total[row, 0] == 0:
                raise ValueError(
                    f"residual={residual!r} leaves row {row} of layer {index} with weights that sum to 0 (a "
                    "query that sees no key): the rollout row would be 0/0; pass residual > 0 (the identity "
                    "keeps such a token where it is) or weights whose every row has a positive sum")
            raise ValueError(
                f"weights of layer {index}, row {row}: the head-averaged row does not have a finite sum "
                f"(got {float(total[row, 0])!r}); attention weights are at most 1 (rows of a softmax)")
        mixed = mixed / total  # rows sum to one again
        rollout = mixed @ rollout  # (T, T) @ (T, T): this layer on top of the ones below
    return rollout


@dataclass(frozen=True)
class DatasetMeans:
    """Means over every token position of a set of sentences (float32 tensors, L layers, H heads).

    Attributes:
        embedding: (D,) the embeddings' output (the input of block 0).
        values: (L, H, Dh) each head's value vectors ``x_j W_V^h + b_V^h``.
        contexts: (L, H, Dh) each head's context vectors (its weighted sum of values).
        n_tokens: how many token positions were averaged.
    """

    embedding: torch.Tensor
    values: torch.Tensor
    contexts: torch.Tensor
    n_tokens: int


def dataset_means(encoder: Encoder, sentences_ids) -> DatasetMeans:
    """The means a mean ablation substitutes, over all token positions of ``sentences_ids``.

    Args:
        encoder: the package's Encoder. sentences_ids: a non-empty list of (1, T_s) int64 tensors,
            one unpadded sentence each.

    Returns:
        A :class:`DatasetMeans`.

    Raises:
        TypeError / ValueError: not an Encoder; an empty list; an entry that is not (1, T).

    Source: chapter 13 (mean ablation, as in Wang et al. 2023's path patching with mean activations).
    """
    _require_encoder(encoder)
    sentences_ids = list(sentences_ids)
    if not sentences_ids:
        raise ValueError("sentences_ids must hold at least one sentence")
    embeddings, values, contexts = [], [], []
    with torch.no_grad():
        for ids in sentences_ids:
            _check_ids(ids)
            x = encoder.embeddings(ids)  # (1, T, D)
            hidden, weights = run_layers(encoder, x)
            inputs = (x,) + hidden[:-1]  # block l reads inputs[l]
            embeddings.append(x[0])
            per_layer_v, per_layer_c = [], []
            for layer, block in enumerate(encoder.blocks):
                attn = block.attn
                V = split_heads(inputs[layer] @ attn.W_V + attn.b_V, attn.config.n_heads)  # (1, H, T, Dh)
                per_layer_v.append(V[0])  # (H, T, Dh)
                per_layer_c.append((weights[layer] @ V)[0])  # (1, H, T, T) @ (1, H, T, Dh) -> (H, T, Dh)
            values.append(torch.stack(per_layer_v))  # (L, H, T, Dh)
            contexts.append(torch.stack(per_layer_c))
    return DatasetMeans(
        embedding=torch.cat(embeddings).mean(dim=0),  # (sum T, D) -> (D,)
        values=torch.cat(values, dim=2).mean(dim=2),  # (L, H, sum T, Dh) -> (L, H, Dh)
        contexts=torch.cat(contexts, dim=2).mean(dim=2),
        n_tokens=sum(int(ids.shape[1]) for ids in sentences_ids),
    )


def _patched_effects(encoder, input_ids, reference, layer: int, patch, n: int, chunk: int) -> np.ndarray:
    """f(with ``patch`` applied to copy k of block ``layer``'s attention output) - f, for k < n.

    ``patch(out, weights, x, rows)`` returns the changed output (b, T, D) of the copies ``rows``
    (a range); ``x`` is the attention's input (b, T, D), ``weights`` its (b, H, T, T)."""
    with torch.no_grad():  # the unchanged run first, before the hook exists
        x = encoder.embeddings(input_ids)  # (1, T, D)
        hidden = run_layers(encoder, x)[0]
        base = _target(hidden[-1], reference)[0]
        x_in = x if layer == 0 else hidden[layer - 1]  # (1, T, D): the input of block ``layer``
    rows = range(0)

    def hook(module, args, output):
        out, weights = output  # the blocks call attention with return_weights=True
        return patch(out, weights, args[0], rows), weights

    handle = encoder.blocks[layer].attn.register_forward_hook(hook)
    try:
        with torch.no_grad():
            effects = []
            for lo in range(0, n, chunk):
                rows = range(lo, min(lo + chunk, n))
                out = run_layers(encoder, x_in.expand(len(rows), -1, -1), start=layer)[0]
                effects.append(_target(out[-1], reference) - base)  # (b,)
    finally:
        handle.remove()
    return torch.cat(effects).double().numpy()


def _require_means(means, encoder) -> None:
    if not isinstance(means, DatasetMeans):
        raise TypeError(f"means must be a DatasetMeans (from dataset_means); got {type(means).__name__}")
    cfg = encoder.config
    want = (len(encoder.blocks), cfg.n_heads, cfg.d_model // cfg.n_heads)
    if tuple(means.values.shape) != want:
        raise ValueError(f"means.values must have shape {want} for this encoder; got {tuple(means.values.shape)}")


def mean_ablate_keys(
    encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor, layer: int, means: DatasetMeans,
    *, chunk: int = 64,
) -> np.ndarray:
    """Change of f when one head reads the dataset's mean value in place of one key's value: (H, T), signed.

    The weights stay as they are (unlike :func:`ablate_keys`, which blocks the key and renormalises
    the row): only what key j supplies to head h changes, from ``v_j^h`` to the mean value of head h
    over ``means``' sentences.

    Raises:
        TypeError / ValueError: not an Encoder; ``input_ids`` not (1, T); ``means`` not a
        :class:`DatasetMeans` of this encoder's shape.

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    _require_means(means, encoder)
    return _replace_key_values(encoder, input_ids, reference, layer, means.values[layer], chunk)


def zero_value_keys(
    encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor, layer: int, *, chunk: int = 64,
) -> np.ndarray:
    """Change of f when one key's value is set to zero for one head, the weights fixed: (H, T), signed.

    The ablation between :func:`ablate_keys` and :func:`mean_ablate_keys`: like the second it leaves
    every weight as it is (no renormalisation); like the first it takes what key j supplies to head
    h away (``v_j^h`` becomes 0, so the edge moves nothing; the head's output bias stays). Against
    :func:`mean_ablate_keys` it isolates the replacement value (zero against the mean); against
    :func:`ablate_keys` it isolates the renormalisation of the row.

    Raises:
        TypeError / ValueError: not an Encoder; ``input_ids`` not (1, T); ``layer`` out of range.

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    L = len(encoder.blocks)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < L:
        raise ValueError(f"layer must be an int in [0, {L}); got {layer!r}")
    cfg = encoder.config
    zeros = torch.zeros(cfg.n_heads, cfg.d_model // cfg.n_heads, dtype=encoder.blocks[layer].attn.W_V.dtype)
    return _replace_key_values(encoder, input_ids, reference, layer, zeros, chunk)


def _replace_key_values(encoder, input_ids, reference, layer: int, fill: torch.Tensor, chunk: int) -> np.ndarray:
    """f(head h reads ``fill[h]`` (H, Dh) in place of key j's value, weights unchanged) - f: (H, T)."""
    attn = encoder.blocks[layer].attn
    H, Dh, T = attn.config.n_heads, attn.config.d_head, input_ids.shape[1]
    W_O = attn.W_O.reshape(H, Dh, -1)  # (D, D) -> (H, Dh, D)
    mean_v = fill  # (H, Dh)

    def patch(out, weights, x, rows):
        n = torch.as_tensor(list(rows))
        h, j = n // T, n % T  # copy n: head h reads the mean in place of key j
        V = split_heads(x @ attn.W_V + attn.b_V, H)  # (b, T, D) -> (b, H, T, Dh)
        b = torch.arange(len(n))
        delta = mean_v[h] - V[b, h, j]  # (b, Dh): what the value changes by
        moved = (delta[:, None, :] @ W_O[h])[:, 0]  # (b, 1, Dh) @ (b, Dh, D) -> (b, D)
        return out + weights[b, h, :, j][..., None] * moved[:, None, :]  # (b, T, 1) * (b, 1, D)

    return _patched_effects(encoder, input_ids, reference, layer, patch, H * T, chunk).reshape(H, T)


def mean_ablate_heads(
    encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor, means: DatasetMeans
) -> np.ndarray:
    """Change of f when one head's context is replaced by its mean over the dataset: (L, H), signed.

    The counterpart of :func:`ablate_heads` (which sets the context to zero): every query of head h
    receives the same, typical context vector ``means.contexts[l, h]``.

    Raises:
        As :func:`mean_ablate_keys`.

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    _require_means(means, encoder)
    effects = []
    for layer, block in enumerate(encoder.blocks):
        attn = block.attn
        H, Dh = attn.config.n_heads, attn.config.d_head
        W_O = attn.W_O.reshape(H, Dh, -1)  # (H, Dh, D)
        mean_c = means.contexts[layer]  # (H, Dh)

        def patch(out, weights, x, rows, attn=attn, H=H, W_O=W_O, mean_c=mean_c):
            h = torch.arange(rows.start, rows.stop)  # copy n ablates head n
            b = torch.arange(len(h))
            V = split_heads(x @ attn.W_V + attn.b_V, H)  # (b, H, T, Dh)
            context = weights[b, h] @ V[b, h]  # (b, T, T) @ (b, T, Dh) -> (b, T, Dh)
            return out + (mean_c[h][:, None, :] - context) @ W_O[h]  # (b, T, Dh) @ (b, Dh, D) -> (b, T, D)

        effects.append(_patched_effects(encoder, input_ids, reference, layer, patch, H, H))
    return np.stack(effects)


def ablate_tokens(
    encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor, replacement: str | DatasetMeans = "zero"
) -> np.ndarray:
    """Change of f when one token's input vector (the embeddings' output) is replaced: (T,), signed.

    ``replacement="zero"`` sets it to zero (zero ablation); a :class:`DatasetMeans` replaces it by
    the mean input vector over the dataset (mean ablation). Everything downstream is recomputed.

    Raises:
        TypeError / ValueError: not an Encoder; ``input_ids`` not (1, T); another ``replacement``.

    Source: chapter 13.
    """
    _require_encoder(encoder)
    _check_ids(input_ids)
    if isinstance(replacement, DatasetMeans):
        _require_means(replacement, encoder)
        fill = replacement.embedding  # (D,)
    elif replacement == "zero":
        fill = None
    else:
        raise ValueError(f"replacement must be 'zero' or a DatasetMeans; got {replacement!r}")
    T = input_ids.shape[1]
    with torch.no_grad():
        x = encoder.embeddings(input_ids)  # (1, T, D)
        base = _target(run_layers(encoder, x)[0][-1], reference)[0]
        copies = x.repeat(T, 1, 1)  # (T, T, D): copy n changes token n
        n = torch.arange(T)
        copies[n, n] = 0.0 if fill is None else fill
        effects = _target(run_layers(encoder, copies)[0][-1], reference) - base  # (T,)
    return effects.double().numpy()


def importance_correlations(
    encoder: Encoder, input_ids: torch.Tensor, reference: torch.Tensor, means: DatasetMeans,
    *, keys: bool = True,
) -> dict[tuple[str, str, str], float]:
    """Rank correlations between attention-based measures and zero / mean ablation, for one sentence.

    Three levels, each ablated both ways (|effect on f|, Spearman's rho):

    - ``"keys"`` (layer, head, key) triples (L H T of them; skipped with ``keys=False``, the costly
      part): zero = :func:`ablate_keys` (key blocked, row renormalised), mean =
      :func:`mean_ablate_keys`; measures: ``"weight"`` received, ``"norm"`` of the moved vectors,
      ``"gradient x weight"`` (summed over queries, then absolute);
    - ``"heads"`` (L H): zero = :func:`ablate_heads`, mean = :func:`mean_ablate_heads`; measures:
      ``"[CLS] share"`` (mean weight on position 0), ``"moved norm"`` (summed over edges);
    - ``"tokens"`` (T): zero / mean = :func:`ablate_tokens`; measures: ``"raw attention"`` (last
      layer, heads averaged, mean over queries) and ``"rollout"`` (:func:`attention_rollout`, mean
      over output positions, since f pools all of them).

    Returns:
        ``{(level, ablation, measure): rho}`` with ablation ``"zero"`` or ``"mean"``, and
        ``(level, "zero vs mean", "")`` for how the two ablations rank the same units.

    Raises:
        The errors of :func:`edge_attributions` and :func:`mean_ablate_keys`.

    Source: chapter 13.
    """
    _require_means(means, encoder)
    A = edge_attributions(encoder, input_ids, reference, [""] * input_ids.shape[1])
    rho: dict[tuple[str, str, str], float] = {}
    effects: dict[str, dict[str, np.ndarray]] = {
        "heads": {"zero": ablate_heads(encoder, input_ids, reference),
                  "mean": mean_ablate_heads(encoder, input_ids, reference, means)},
        "tokens": {"zero": ablate_tokens(encoder, input_ids, reference),
                   "mean": ablate_tokens(encoder, input_ids, reference, means)},
    }
    measures = {
        "heads": {"[CLS] share": A.weights[:, :, :, 0].mean(axis=-1), "moved norm": A.norms.sum(axis=(2, 3))},
        "tokens": {"raw attention": A.weights[-1].mean(axis=(0, 1)),  # (H, T, T) -> (T,)
                   "rollout": attention_rollout(A.weights).mean(axis=0)},  # (T, T) -> (T,)
    }
    if keys:
        L = len(encoder.blocks)
        effects["keys"] = {
            "zero": np.stack([ablate_keys(encoder, input_ids, reference, layer) for layer in range(L)]),
            "mean": np.stack([mean_ablate_keys(encoder, input_ids, reference, layer, means) for layer in range(L)]),
        }
        measures["keys"] = {"weight": A.weights.sum(axis=2), "norm": A.norms.sum(axis=2),
                            "gradient x weight": np.abs(A.grad_x_weight.sum(axis=2))}
    for level, by_ablation in effects.items():
        for ablation, effect in by_ablation.items():
            for measure, values in measures[level].items():
                rho[(level, ablation, measure)] = spearman(np.abs(effect), values)
        rho[(level, "zero vs mean", "")] = spearman(np.abs(by_ablation["zero"]), np.abs(by_ablation["mean"]))
    return rho
