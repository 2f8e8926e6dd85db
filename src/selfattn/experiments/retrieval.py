"""Attention as a differentiable lookup, learned end to end: a key-to-value retrieval task.

Each example is a small dictionary followed by a question. ``n_pairs`` positions each hold one
(key, value) pair, the key drawn without replacement from ``n_keys`` symbols and the value from
``n_values`` symbols; a last position holds a query key, one of the dictionary's keys. The answer
is the value stored under that key. Position i of the input is the vector
``key_embedding[key_i] + value_embedding[value_i]`` (the query position has a learned "no value"
vector in place of a value), so the only way to answer is to *address*: compare the query with
every key and read the value where they match.

:class:`RetrievalModel` is one self-attention layer (the package's
:class:`~selfattn.multihead.MultiHeadAttention`, one head) and a linear read-out of the last
position. Nothing tells it to look anything up: ``W_Q``, ``W_K`` and ``W_V`` start random and are
trained by gradient descent on the answer's cross-entropy. :func:`train_retrieval` records the
query's attention row on a fixed example while it learns, so the chapter can show the weights
moving onto the matching key; :func:`addressing_accuracy` measures how often the largest weight sits
on the matching pair.

Introduced in chapter 14 (claim 20).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import require_flag, require_positive_int
from ..multihead import MHAConfig, MultiHeadAttention

__all__ = [
    "RetrievalConfig",
    "RetrievalBatch",
    "make_retrieval_batch",
    "RetrievalModel",
    "RetrievalLog",
    "train_retrieval",
    "retrieval_accuracy",
    "addressing_accuracy",
]


@dataclass(frozen=True)
class RetrievalConfig:
    """Sizes of the task and of the model, validated at construction.

    Attributes:
        n_keys: number of key symbols (>= n_pairs). n_values: number of value symbols (> 1).
        n_pairs: (key, value) pairs per example (> 1). d_model: width D (> 0).
    """

    n_keys: int = 16
    n_values: int = 16
    n_pairs: int = 8
    d_model: int = 32

    def __post_init__(self):
        for name in ("n_keys", "n_values", "n_pairs", "d_model"):
            require_positive_int(name, getattr(self, name))
        if self.n_pairs < 2 or self.n_values < 2:
            raise ValueError(
                f"n_pairs and n_values must be >= 2; got n_pairs={self.n_pairs}, n_values={self.n_values}"
            )
        if self.n_keys < self.n_pairs:
            raise ValueError(
                f"n_keys={self.n_keys} must be >= n_pairs={self.n_pairs}: the keys of one example are distinct"
            )


@dataclass(frozen=True)
class RetrievalBatch:
    """A batch of examples.

    Attributes:
        keys: (B, n_pairs) int64, distinct within a row. values: (B, n_pairs) int64.
        query: (B,) int64, one of the row's keys. where: (B,) int64, the pair index holding it.
        answer: (B,) int64, ``values[b, where[b]]``.
    """

    keys: torch.Tensor
    values: torch.Tensor
    query: torch.Tensor
    where: torch.Tensor
    answer: torch.Tensor


def make_retrieval_batch(
    config: RetrievalConfig, batch_size: int, generator: torch.Generator | None = None
) -> RetrievalBatch:
    """Draw ``batch_size`` random examples (see the module docstring).

    Raises:
        TypeError / ValueError: ``batch_size`` not a positive int.

    Source: chapter 14.
    """
    B = require_positive_int("batch_size", batch_size)
    P = config.n_pairs
    # Distinct keys per row: the first P entries of a random permutation of the key symbols.
    keys = torch.rand(B, config.n_keys, generator=generator).argsort(dim=1)[:, :P]  # (B, P)
    values = torch.randint(0, config.n_values, (B, P), generator=generator)  # (B, P)
    where = torch.randint(0, P, (B,), generator=generator)  # (B,)
    rows = torch.arange(B)
    return RetrievalBatch(keys, values, keys[rows, where], where, values[rows, where])


class RetrievalModel(nn.Module):
    """One self-attention layer with one head over the pairs and the query, then a read-out.

    ``x_i = E_key[key_i] + E_value[value_i]`` for the pairs, ``x_q = E_key[query] + e_none`` for the
    query (last position); ``out = MultiHeadAttention(x, mask)`` (H = 1, no positions: the
    dictionary is unordered; the mask hides the query position from every query, so the answer must
    be read from the pairs); ``logits = out[:, -1] @ W_read`` over the ``n_values`` answers.

    Shapes:
        forward(batch) -> logits (B, n_values); with ``return_weights=True`` also the weights
        (B, 1, P + 1, P + 1). The query's row is ``weights[:, 0, -1]``.

    Source: chapter 14 (claim 20).
    """

    def __init__(self, config: RetrievalConfig):
        super().__init__()
        if not isinstance(config, RetrievalConfig):
            raise TypeError(f"config must be a RetrievalConfig; got {type(config).__name__}")
        self.config = config
        D = config.d_model
        self.key_embedding = nn.Embedding(config.n_keys, D)
        self.value_embedding = nn.Embedding(config.n_values, D)
        # Small embeddings: at initialization every score is near 0, so the query attends almost
        # uniformly and the reader sees the addressing being learned, not found by chance.
        nn.init.normal_(self.key_embedding.weight, std=0.1)
        nn.init.normal_(self.value_embedding.weight, std=0.1)
        self.no_value = nn.Parameter(torch.zeros(D))
        self.attn = MultiHeadAttention(MHAConfig(D, 1, bias=False))
        self.read_out = nn.Linear(D, config.n_values)

    def inputs(self, batch: RetrievalBatch) -> torch.Tensor:
        """The (B, P + 1, D) input vectors: P pairs, then the query."""
        pairs = self.key_embedding(batch.keys) + self.value_embedding(batch.values)  # (B, P, D)
        query = self.key_embedding(batch.query) + self.no_value  # (B, D)
        return torch.cat([pairs, query[:, None]], dim=1)  # (B, P, D) + (B, 1, D) -> (B, P + 1, D)

    def forward(self, batch: RetrievalBatch, *, return_weights: bool = False):
        return_weights = require_flag("return_weights", return_weights)
        x = self.inputs(batch)  # (B, P + 1, D)
        # Every position may read the P pairs but not the query position: the query's own key
        # would match itself, and the answer must come from the dictionary.
        keep = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device)  # (P+1, P+1)
        keep[:, -1] = False
        out, weights = self.attn(x, mask=keep, return_weights=True)  # (B, P+1, D), (B, 1, P+1, P+1)
        logits = self.read_out(out[:, -1])  # (B, D) @ (D, n_values) -> (B, n_values)
        return (logits, weights) if return_weights else logits


@dataclass
class RetrievalLog:
    """What :func:`train_retrieval` recorded.

    Attributes:
        loss: training loss (nats) of every step. accuracy: training-batch accuracy of every step.
        snapshot_steps: the steps (0 = before training) at which the query's attention row on the
            fixed example was recorded. snapshots: those rows, each a list of P + 1 floats.
        example: the fixed example (batch of one).
    """

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    snapshot_steps: list[int] = field(default_factory=list)
    snapshots: list[list[float]] = field(default_factory=list)
    example: RetrievalBatch | None = None


def train_retrieval(
    model: RetrievalModel,
    *,
    steps: int = 400,
    batch_size: int = 128,
    lr: float = 1e-2,
    seed: int = 0,
    snapshot_every: int = 20,
    progress: bool = False,
) -> RetrievalLog:
    """Train ``model`` (in place, CPU) with Adam on fresh random batches; record the learning.

    Args:
        model: a :class:`RetrievalModel`. steps, batch_size, snapshot_every: > 0. lr: Adam's step.
        seed: seeds the batches and the fixed example (the initialization is the caller's).
        progress: show a tqdm progress bar.

    Returns:
        A :class:`RetrievalLog`. The model is left in eval mode.

    Source: chapter 14 (claim 20).
    """
    progress = require_flag("progress", progress)
    from tqdm.auto import tqdm

    steps = require_positive_int("steps", steps)
    snapshot_every = require_positive_int("snapshot_every", snapshot_every)
    generator = torch.Generator().manual_seed(seed)
    log = RetrievalLog(
        example=make_retrieval_batch(model.config, 1, torch.Generator().manual_seed(seed + 1))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def snapshot(step: int) -> None:
        with torch.no_grad():
            _, weights = model(log.example, return_weights=True)  # (1, 1, P+1, P+1)
        log.snapshot_steps.append(step)
        log.snapshots.append(weights[0, 0, -1].tolist())  # the query's row, (P + 1,)

    snapshot(0)
    for step in tqdm(range(1, steps + 1), desc="retrieval", disable=not progress):
        batch = make_retrieval_batch(model.config, batch_size, generator)
        logits = model(batch)  # (B, n_values)
        loss = F.cross_entropy(logits, batch.answer)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.loss.append(loss.item())
        log.accuracy.append((logits.argmax(-1) == batch.answer).float().mean().item())
        if step % snapshot_every == 0 or step == steps:
            snapshot(step)
    model.eval()
    return log


@torch.no_grad()
def retrieval_accuracy(model: RetrievalModel, batch: RetrievalBatch) -> float:
    """Fraction of examples whose most probable answer is the stored value, in [0, 1].

    Source: chapter 14.
    """
    return (model(batch).argmax(-1) == batch.answer).float().mean().item()


@torch.no_grad()
def addressing_accuracy(model: RetrievalModel, batch: RetrievalBatch) -> tuple[float, float]:
    """How well the query addresses: (fraction of examples whose largest query weight is on the
    matching pair, mean weight on the matching pair), both in [0, 1].

    Source: chapter 14 (claim 20).
    """
    _, weights = model(batch, return_weights=True)  # (B, 1, P+1, P+1)
    row = weights[:, 0, -1]  # (B, P + 1): the query's attention over the pairs and itself
    rows = torch.arange(row.shape[0])
    top = (row.argmax(-1) == batch.where).float().mean().item()
    return top, row[rows, batch.where].mean().item()
