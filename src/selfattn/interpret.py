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

The scalar ``f`` is what all-MiniLM-L6-v2 is for: the cosine similarity of the sentence's
embedding (mean of the last layer over its tokens, L2-normalised) with a reference sentence's.

The interventions use only the public parts of the encoder: its ``embeddings`` and ``blocks``,
each block called with a per-layer keep-mask (:func:`run_layers`), and a forward hook on each
block's attention that keeps the gradient of its weights (:func:`edge_attributions`).

Introduced in chapter 12 (claim 19). Sources: Jain & Wallace 2019; Wiegreffe & Pinter 2019;
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

    Source: chapter 12.
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

    (B, T, D) -> (B, D). Differentiable. Source: chapter 12 (as ``MiniLM.sentence_embedding``).
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

    Source: Kobayashi et al. 2020, section 3 (eq. 6); chapter 12.
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

    Source: chapter 12.
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

    Source: chapter 12 (Michel et al. 2019's head ablation, measured on f).
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

    Source: chapter 12.
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

    Source: chapter 12.
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

    Source: Spearman 1904; chapter 12.
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

    Source: chapter 12.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 4:
        raise ValueError(f"a and b must both have shape (L, H, T, T); got {a.shape} and {b.shape}")
    L, H = a.shape[:2]
    return np.array([[spearman(a[l, h], b[l, h]) for h in range(H)] for l in range(L)])  # noqa: E741
