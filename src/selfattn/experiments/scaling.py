"""Why scores are divided by sqrt(d_head): a simulation of random queries and keys.

For q, k with i.i.d. entries of mean 0 and variance 1, ``q · k`` is a sum of d_head products of
variance 1, so ``Var(q · k) = d_head``; ``q · k / sqrt(d_head)`` has variance 1 whatever d_head.
Without the division the softmax over a row of such scores saturates as d_head grows: its largest
weight tends to 1, its entropy to 0, and its Jacobian ``diag(p) - p p^T`` (the gradient the
scores receive) to 0. Source: Vaswani et al. 2017, section 3.2.1 and footnote 4; chapter 02
(claim 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import require_positive_int, require_tensor

__all__ = ["random_scores", "SaturationStats", "saturation_stats", "softmax_jacobian"]


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
