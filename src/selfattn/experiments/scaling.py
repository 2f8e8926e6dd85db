"""Why scores are divided by sqrt(d_head): a simulation of random queries and keys.

For q, k with i.i.d. entries of mean 0 and variance 1, ``q · k`` is a sum of d_head products of
variance 1, so ``Var(q · k) = d_head``; ``q · k / sqrt(d_head)`` has variance 1 whatever d_head.
Without the division the softmax over a row of such scores saturates as d_head grows: its largest
weight tends to 1, its entropy to 0, and its Jacobian ``diag(p) - p p^T`` (the gradient the
scores receive) to 0. Source: Vaswani et al. 2017, section 3.2.1 and footnote 4; chapter 02
(claim 5).

The same argument in a real layer: :func:`init_score_variance` measures the scores of the
package's :class:`~selfattn.attention.SelfAttention` at initialisation (entries of W_Q, W_K drawn
N(0, 1/d_model), the fan-in or "LeCun" normal initialisation) on layer-normalised inputs (each row
of squared length d_model), where each component of q and k has variance ``|x|^2 / d_model = 1``;
:func:`minilm_score_spread` measures the scaled scores of every head of the trained MiniLM;
:class:`ScalingRecallModel` and :func:`train_scaling` train one head with and without the division.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._threads import one_thread
from .._validate import require_flag, require_positive_int, require_tensor
from ..attention import AttentionConfig, SelfAttention, scaled_dot_product_attention
from .tying import RecallConfig, RecallTask

__all__ = [
    "random_scores",
    "SaturationStats",
    "saturation_stats",
    "softmax_jacobian",
    "init_score_variance",
    "minilm_score_spread",
    "ScalingRecallModel",
    "ScalingRun",
    "train_scaling",
]


def random_scores(d_head: int, n_queries: int, n_keys: int, seed: int = 0) -> torch.Tensor:
    """Unscaled scores ``q · k`` of random standard-normal queries and keys.

    Returns:
        (n_queries, n_keys) float64: row i holds the scores of query i against n_keys fresh keys.

    Raises:
        TypeError / ValueError: a size that is not a positive int.
    """
    for name, value in (("d_head", d_head), ("n_queries", n_queries), ("n_keys", n_keys)):
        require_positive_int(name, value)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_queries, 1, d_head, generator=g, dtype=torch.float64)
    k = torch.randn(n_queries, n_keys, d_head, generator=g, dtype=torch.float64)
    return (q * k).sum(dim=-1)  # (N, 1, Dh) * (N, S, Dh) -> (N, S)


def softmax_jacobian(weights: torch.Tensor) -> torch.Tensor:
    """Jacobian of the softmax at output ``weights`` (..., S): ``d p_i / d x_j = p_i (δ_ij - p_j)``.

    Returns (..., S, S). Source: chapter 02 (derived there and checked against autograd).
    """
    require_tensor("weights", weights)
    return torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]  # (..., S, S)


@dataclass(frozen=True)
class SaturationStats:
    """Averages over the rows of a score matrix, after the softmax.

    Attributes:
        score_var: variance of the scores fed to the softmax.
        max_weight: mean of each row's largest weight (1/S for a uniform row, 1 when saturated).
        entropy: mean entropy of a row in nats (log S when uniform, 0 when saturated).
        jacobian_norm: mean Frobenius norm of the softmax Jacobian of a row (0 when saturated).
    """

    score_var: float
    max_weight: float
    entropy: float
    jacobian_norm: float


def saturation_stats(scores: torch.Tensor) -> SaturationStats:
    """Measure how saturated ``softmax(scores)`` is, row by row; ``scores`` is (N, S) float.

    Raises:
        TypeError: not a tensor. ValueError: not 2-D, or non-finite scores.
    """
    require_tensor("scores", scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must have shape (N, S); got {tuple(scores.shape)}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores must be finite")
    weights = torch.softmax(scores, dim=-1)  # (N, S)
    log_w = torch.log_softmax(scores, dim=-1)
    entropy = -(weights * log_w).sum(dim=-1)  # (N,); log_softmax keeps 0 * log 0 finite
    jac = softmax_jacobian(weights)  # (N, S, S)
    return SaturationStats(
        score_var=float(scores.var()),
        max_weight=float(weights.max(dim=-1).values.mean()),
        entropy=float(entropy.mean()),
        jacobian_norm=float(jac.flatten(-2).norm(dim=-1).mean()),
    )


def init_score_variance(X: torch.Tensor, d_heads: Sequence[int], n_inits: int = 64, seed: int = 0) -> dict[int, float]:
    """Variance of the unscaled scores ``q · k`` of a freshly initialised ``SelfAttention``, per d_head.

    For each d_head, ``n_inits`` heads are built with ``SelfAttention``'s own initialisation (seeds
    ``seed, seed + 1, ...``), each computes all scores ``Q K^T`` of the rows of ``X`` against each
    other, and the variance of those scores is averaged over the heads (one head's variance is one
    random draw of its weights; the average estimates its expectation).

    Args:
        X: (N, D) float64 inputs, typically layer-normalised (each row of squared length ``D``).
        d_heads: head widths (> 0). n_inits: heads per width (> 0).

    Returns:
        ``{d_head: mean variance of q · k}``; divide by d_head for the scaled scores' variance.
        Expected ``d_head * mean(|x|^2 |x'|^2) / D^2``, i.e. ``d_head`` for layer-normalised rows.

    Raises:
        TypeError / ValueError: X not a 2-D floating tensor; a size that is not a positive int.

    Source: chapter 02 (claim 5).
    """
    require_tensor("X", X)
    if X.ndim != 2 or not X.dtype.is_floating_point:
        raise ValueError(f"X must be a (N, D) floating tensor; got shape {tuple(X.shape)}, dtype {X.dtype}")
    require_positive_int("n_inits", n_inits)
    out = {}
    with torch.no_grad():
        for d_head in d_heads:
            require_positive_int("d_head", d_head)
            variances = []
            for i in range(n_inits):
                head = SelfAttention(AttentionConfig(X.shape[1], d_head), generator=torch.Generator().manual_seed(seed + i))
                Q, K, _ = head.to(X.dtype).project(X)  # (N, D) @ (D, Dh) -> (N, Dh) each
                variances.append(float((Q @ K.T).var()))  # (N, Dh) @ (Dh, N) -> (N, N)
            out[d_head] = float(np.mean(variances))
    return out


def minilm_score_spread(minilm, sentences: Sequence[str]) -> np.ndarray:
    """Spread of the scaled scores of every head of the pretrained MiniLM, on real sentences.

    For layer l and head h, the scores ``(q · k) / sqrt(d_head)`` of the real tokens of each sentence
    (padding left out) are computed from the layer's input ``hidden_states[l]`` with the head's
    own W_Q, W_K and biases; the spread is the standard deviation of one query's row of scores
    (what the softmax sees: it ignores a shift of the row), averaged over all query rows.

    Args:
        minilm: a :class:`~selfattn.pretrained.MiniLM`. sentences: a non-empty list of strings.

    Returns:
        (n_layers, n_heads) float64 array of spreads (unitless, scores are in nats of the softmax).

    Source: chapter 02 (claim 5).
    """
    run = minilm.run(list(sentences), output_weights=False)
    encoder = minilm.encoder()
    rows = {}
    with torch.no_grad():
        for layer, block in enumerate(encoder.blocks):
            attn = block.attn
            H, Dh = attn.config.n_heads, attn.config.d_head
            X = run.hidden_states[layer].double()  # (B, T, D): the input of this layer
            Q = X @ attn.W_Q.double() + attn.b_Q.double()  # (B, T, D) @ (D, D) -> (B, T, D)
            K = X @ attn.W_K.double() + attn.b_K.double()
            Q = Q.unflatten(-1, (H, Dh)).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
            K = K.unflatten(-1, (H, Dh)).transpose(1, 2)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(Dh)  # (B, H, T, Dh) @ (B, H, Dh, T) -> (B, H, T, T)
            per_row = [scores[b, :, :n, :n].std(dim=-1) for b, n in enumerate(run.lengths)]  # (H, n) each
            rows[layer] = torch.cat(per_row, dim=-1).mean(dim=-1).numpy()  # (H,)
    return np.stack([rows[layer] for layer in range(len(rows))])


class ScalingRecallModel(nn.Module):
    """One attention head on layer-normalised recall sequences, with or without the 1/sqrt(d_head).

    The input of the recall task of chapter 03 (:mod:`selfattn.experiments.tying`) is first layer
    normalised (no learned gain or bias, as a LayerNorm at initialisation), so that at
    initialisation every component of q and k has variance 1 and ``Var(q · k) = d_head``; the
    query position reads the pairs with scores multiplied by ``scale``; a linear readout names
    the value.

    Args:
        config: a :class:`~selfattn.experiments.tying.RecallConfig` (its d_head is the head width).
        scaled: divide the scores by sqrt(d_head) (True) or not (False).
        generator: seeds the initial weights.

    Shapes:
        forward(X (B, P + 1, D)) -> logits (B, n_values); with ``return_weights=True`` also the
        query's weights (B, 1, P).

    Source: chapter 02 (claim 5).
    """

    def __init__(self, config: RecallConfig, scaled: bool, generator: torch.Generator | None = None):
        super().__init__()
        scaled = require_flag("scaled", scaled)
        self.config = config
        self.scale = 1.0 / math.sqrt(config.d_head) if scaled else 1.0
        self.attn = SelfAttention(AttentionConfig(config.d_model, config.d_head), generator=generator)
        self.readout = nn.Linear(config.d_head, config.n_values)
        with torch.no_grad():  # seeded like the head (nn.Linear's own init would draw from the global generator)
            self.readout.weight.copy_(torch.randn(self.readout.weight.shape, generator=generator) / config.d_head**0.5)
            self.readout.bias.zero_()

    def forward(self, X: torch.Tensor, *, return_weights: bool = False):
        return_weights = require_flag("return_weights", return_weights)
        Q, K, V = self.attn.project(F.layer_norm(X, X.shape[-1:]))  # each (B, P + 1, Dh)
        context, weights = scaled_dot_product_attention(
            Q[:, -1:], K[:, :-1], V[:, :-1], scale=self.scale, return_weights=True
        )  # (B, 1, Dh), (B, 1, P): the query reads the pairs
        logits = self.readout(context[:, 0])  # (B, Dh) -> (B, n_values)
        return (logits, weights) if return_weights else logits


@dataclass(frozen=True)
class ScalingRun:
    """What :func:`train_scaling` measured.

    Attributes:
        entropy_at_init: mean entropy (nats) of the query's weights before training (uniform: ln P).
        max_weight_at_init: mean largest weight before training (uniform: 1 / P).
        losses: training cross-entropy (nats) of every step.
    """

    entropy_at_init: float
    max_weight_at_init: float
    losses: list[float]


SCALING_CONFIG = RecallConfig(d_head=256)  # a wide head: Var(q . k) = 256 at initialisation, unscaled


def train_scaling(scaled: bool, config: RecallConfig = SCALING_CONFIG, steps: int = 60,
                  lr: float = 0.01, seed: int = 0) -> ScalingRun:
    """Train a :class:`ScalingRecallModel` with Adam for ``steps`` steps of ``config.batch`` sequences.

    The seed fixes the initial weights (``seed``), the training batches (``seed + 10_000``) and the
    512 sequences on which the weights at initialisation are measured (``seed + 20_000``), so the
    scaled and unscaled runs see the same numbers. One CPU thread (restored afterwards), so the
    result does not depend on the machine's load; about half a second.

    Source: chapter 02 (claim 5).
    """
    require_positive_int("steps", steps)
    with one_thread():
        model = ScalingRecallModel(config, scaled, generator=torch.Generator().manual_seed(seed))
        task = RecallTask(config)
        X, _ = task.sample(512, torch.Generator().manual_seed(seed + 20_000))
        with torch.no_grad():
            _, weights = model(X, return_weights=True)  # (512, 1, P)
        entropy = -(weights * torch.log(weights.clamp_min(1e-30))).sum(dim=-1)  # (512, 1)
        data = torch.Generator().manual_seed(seed + 10_000)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            X, y = task.sample(config.batch, data)
            loss = F.cross_entropy(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return ScalingRun(float(entropy.mean()), float(weights.max(dim=-1).values.mean()), losses)
