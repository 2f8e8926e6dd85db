"""Two lookups at once: why several narrow heads beat one wide head at the same parameter count.

Each of ``n_items`` context positions holds a key (the keys of one sequence are a random
permutation of ``n_items`` letters) and a value digit; its vector is the *sum* of a key embedding
and a value embedding, ``x_j = E_key[k_j] + E_val[v_j]``, so nothing but the attention weights can
tie a value to its key. A last position (a fixed query embedding) must name two things at once:
the value stored under key 0 ("A") and the value stored under key 1 ("B"). One multi-head
attention layer (:class:`~selfattn.multihead.MultiHeadAttention`, queries from the last position,
keys and values from the items) and two linear read-outs of ``x_last + attention`` give the two
answers.

A single head has one distribution of weights: to read both items it must split its weight, and
then it reads the mixture ``w v(a) + (1 - w) v(b)`` of two digits embedded the same way, in which
which digit came from A and which from B is lost except through the size of w; a linear read-out
cannot undo that for both answers. Two heads of half the width each read one item. The parameter
count is the same (W_Q, W_K, W_V, W_O are D x D in both). Introduced in chapter 06 (claim 13).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._threads import one_thread
from .._validate import require_positive_int, require_rank, require_tensor, shape_of
from ..multihead import MHAConfig, MultiHeadAttention

__all__ = ["TwoLookupConfig", "sample_two_lookups", "TwoLookupModel", "TwoLookupResult", "train_two_lookups"]


@dataclass(frozen=True)
class TwoLookupConfig:
    """Sizes of the two-lookup task and of its training run, validated at construction.

    Attributes:
        n_items: context positions, one per key (>= 2; the keys A and B are two of them).
        n_values: value digits per item (> 1).
        d_model: width D (> 0), divisible by every head count that is compared.
        steps: Adam steps. batch: sequences per step. lr: learning rate (> 0).
        n_eval: fresh sequences for the accuracy.
    """

    n_items: int = 8
    n_values: int = 64
    d_model: int = 16
    steps: int = 400
    batch: int = 128
    lr: float = 0.01
    n_eval: int = 2048

    def __post_init__(self):
        for name in ("n_items", "n_values", "d_model", "steps", "batch", "n_eval"):
            require_positive_int(name, getattr(self, name))
        if self.n_items < 2:
            raise ValueError(f"n_items must be >= 2 (keys A and B must both be present); got {self.n_items}")
        if self.n_values < 2:
            raise ValueError(f"n_values must be >= 2; got {self.n_values}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0; got {self.lr}")


def sample_two_lookups(config: TwoLookupConfig, n: int, generator: torch.Generator):
    """``n`` sequences: ``keys`` (n, P) int64 (a permutation of 0..P-1 per row), ``values`` (n, P)
    int64 digits, and the targets ``(value under key 0, value under key 1)``, each (n,) int64."""
    require_positive_int("n", n)
    P = config.n_items
    keys = torch.rand(n, P, generator=generator).argsort(dim=1)  # (n, P): distinct keys, random order
    values = torch.randint(config.n_values, (n, P), generator=generator)
    where_a, where_b = keys.argsort(dim=1)[:, 0], keys.argsort(dim=1)[:, 1]  # position of key 0, of key 1
    rows = torch.arange(n)
    return keys, values, values[rows, where_a], values[rows, where_b]


class TwoLookupModel(nn.Module):
    """Embeddings, one multi-head attention layer read at the query position, two linear read-outs.

    Args:
        config: a :class:`TwoLookupConfig`. n_heads: H, dividing ``config.d_model``.

    Shapes:
        forward(keys: (B, P) int64, values: (B, P) int64) -> (logits_a, logits_b), each
        (B, n_values), and the attention weights (B, H, 1, P) with ``return_weights=True``.

    Raises:
        ValueError: ``d_model`` not divisible by ``n_heads``; inputs not (B, P) with P = n_items.
    """

    def __init__(self, config: TwoLookupConfig, n_heads: int):
        super().__init__()
        self.config = config
        D = config.d_model
        self.key_embed = nn.Embedding(config.n_items, D)
        self.value_embed = nn.Embedding(config.n_values, D)
        self.query = nn.Parameter(torch.randn(D))  # the query position's own vector
        self.attn = MultiHeadAttention(MHAConfig(D, n_heads))
        self.readout_a = nn.Linear(D, config.n_values)
        self.readout_b = nn.Linear(D, config.n_values)

    def forward(self, keys: torch.Tensor, values: torch.Tensor, *, return_weights: bool = False):
        P = self.config.n_items
        for name, ids in (("keys", keys), ("values", values)):
            require_tensor(name, ids)
            require_rank(name, ids, 2, "(B, P)")
            if ids.shape[1] != P:
                raise ValueError(f"{name} must have P = n_items = {P} columns; got shape {shape_of(ids)}")
        items = self.key_embed(keys) + self.value_embed(values)  # (B, P, D): key and value summed
        q = self.query.expand(items.shape[0], 1, -1)  # (D,) -> (B, 1, D)
        read, weights = self.attn(q, items, return_weights=True)  # (B, 1, D), weights (B, H, 1, P)
        h = (q + read)[:, 0]  # the residual stream at the query position, (B, D)
        logits = (self.readout_a(h), self.readout_b(h))  # (B, D) @ (D, n_values), twice
        return (logits, weights) if return_weights else logits


@dataclass(frozen=True)
class TwoLookupResult:
    """Accuracies (fractions in [0, 1]) on fresh sequences: both answers right (``accuracy``),
    answer A right, answer B right; the training loss per step; the parameter count; the trained
    model (eval mode)."""

    n_heads: int
    accuracy: float
    accuracy_a: float
    accuracy_b: float
    losses: list[float]
    n_parameters: int
    model: TwoLookupModel


def train_two_lookups(n_heads: int, config: TwoLookupConfig = TwoLookupConfig(), seed: int = 0) -> TwoLookupResult:
    """Train a :class:`TwoLookupModel` with ``n_heads`` heads; evaluate on fresh sequences.

    The seed fixes the initial weights, the training data and the evaluation data, so models with
    different head counts see the same sequences in the same order. One CPU thread (restored
    afterwards): results do not depend on the machine's thread count or load.
    """
    with one_thread():
        return _train(n_heads, config, seed)


def _train(n_heads: int, config: TwoLookupConfig, seed: int) -> TwoLookupResult:
    torch.manual_seed(seed)
    model = TwoLookupModel(config, n_heads)
    data = torch.Generator().manual_seed(seed + 10_000)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    losses = []
    for _ in range(config.steps):
        keys, values, a, b = sample_two_lookups(config, config.batch, data)
        logits_a, logits_b = model(keys, values)
        loss = F.cross_entropy(logits_a, a) + F.cross_entropy(logits_b, b)  # both answers count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    keys, values, a, b = sample_two_lookups(config, config.n_eval, torch.Generator().manual_seed(seed + 20_000))
    with torch.no_grad():
        logits_a, logits_b = model(keys, values)
    right_a, right_b = logits_a.argmax(dim=1) == a, logits_b.argmax(dim=1) == b
    return TwoLookupResult(
        n_heads=n_heads,
        accuracy=float((right_a & right_b).float().mean()),
        accuracy_a=float(right_a.float().mean()),
        accuracy_b=float(right_b.float().mean()),
        losses=losses,
        n_parameters=sum(p.numel() for p in model.parameters()),
        model=model.eval(),
    )
