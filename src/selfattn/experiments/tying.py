"""Associative recall with one attention head: what tying the values to the keys costs.

Each of ``n_pairs`` context positions holds a (key token, value token) pair, its vector the
concatenation ``[one_hot(key), one_hot(value)]`` of width ``D = n_keys + n_values``; one more,
last position holds only a query key (``[one_hot(query), 0]``). The target is the value stored
under the matching key. One head reads the context from the query position (``Q`` from the last
position, ``K`` and ``V`` from the pairs) and a linear readout names the value.

Untied, ``W_K`` can keep only the key part of a position (where to read) and ``W_V`` only the value
part (what is read). Tied (``V = X W_K``), one ``d_head``-wide projection must serve both, so when
``d_head`` is smaller than ``n_keys + n_values`` keys and values crowd each other out.
Source: chapter 03 (claim 8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .._threads import one_thread
from .._validate import require_positive_int
from ..attention import AttentionConfig, SelfAttention, scaled_dot_product_attention

__all__ = ["RecallConfig", "RecallTask", "RecallModel", "TiedRecallModel", "RecallResult", "train_recall"]


@dataclass(frozen=True)
class RecallConfig:
    """Sizes of the recall task and of its training run.

    Attributes:
        n_keys: key vocabulary size (>= n_pairs, keys in one sequence are distinct).
        n_values: value vocabulary size.
        n_pairs: number of (key, value) positions in one sequence.
        d_head: width of the attention head; 4, far below D = 32, so that a tied head runs out of room.
        steps: optimisation steps (Adam). batch: sequences per step. lr: learning rate.
        n_eval: fresh sequences used to measure accuracy.
    """

    n_keys: int = 16
    n_values: int = 16
    n_pairs: int = 8
    d_head: int = 4
    steps: int = 300
    batch: int = 128
    lr: float = 0.02
    n_eval: int = 4096

    def __post_init__(self):
        for name in ("n_keys", "n_values", "n_pairs", "d_head", "steps", "batch", "n_eval"):
            require_positive_int(name, getattr(self, name))
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} must be <= n_keys={self.n_keys} (distinct keys)")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0; got {self.lr}")

    @property
    def d_model(self) -> int:
        return self.n_keys + self.n_values


class RecallTask:
    """Samples recall sequences: ``X`` (B, n_pairs + 1, D) float32 and targets (B,) int64."""

    def __init__(self, config: RecallConfig):
        self.config = config

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        keys = torch.rand(n, c.n_keys, generator=generator).argsort(dim=1)[:, : c.n_pairs]  # distinct keys
        values = torch.randint(c.n_values, (n, c.n_pairs), generator=generator)
        which = torch.randint(c.n_pairs, (n,), generator=generator)  # the pair the query asks for
        rows = torch.arange(n)
        X = torch.zeros(n, c.n_pairs + 1, c.d_model)
        X[rows[:, None], torch.arange(c.n_pairs), keys] = 1.0  # key part of each pair
        X[rows[:, None], torch.arange(c.n_pairs), c.n_keys + values] = 1.0  # value part
        X[rows, c.n_pairs, keys[rows, which]] = 1.0  # the query position: its key only
        return X, values[rows, which]


class RecallModel(nn.Module):
    """One attention head (separate W_Q, W_K, W_V) read from the last position, then a linear readout.

    forward(X: (B, P + 1, D)) -> logits (B, n_values).
    """

    def __init__(self, config: RecallConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.attn = SelfAttention(AttentionConfig(config.d_model, config.d_head), generator=generator)
        self.readout = nn.Linear(config.d_head, config.n_values)
        with torch.no_grad():  # seeded like the head, so tied and untied start from the same numbers
            self.readout.weight.copy_(torch.randn(self.readout.weight.shape, generator=generator) / config.d_head**0.5)
            self.readout.bias.zero_()

    def project(self, X: torch.Tensor):
        return self.attn.project(X)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Q, K, V = self.project(X)  # each (B, P + 1, Dh)
        context = scaled_dot_product_attention(Q[:, -1:], K[:, :-1], V[:, :-1])  # (B, 1, Dh)
        return self.readout(context[:, 0])  # (B, Dh) -> (B, n_values)


class TiedRecallModel(RecallModel):
    """The same model with the values tied to the keys: ``V = X W_K`` (W_V is never used)."""

    def __init__(self, config: RecallConfig, generator: torch.Generator | None = None):
        super().__init__(config, generator)
        self.attn.W_V.requires_grad_(False)

    def project(self, X: torch.Tensor):
        Q, K, _ = self.attn.project(X)
        return Q, K, K


@dataclass(frozen=True)
class RecallResult:
    """Accuracy (fraction in [0, 1]) and mean cross-entropy (nats) on fresh sequences, the
    training loss curve (one float per step), and the trained model (in eval mode)."""

    accuracy: float
    loss: float
    losses: list[float]
    model: nn.Module | None = field(default=None, repr=False, compare=False)


def train_recall(model_cls: type[RecallModel], config: RecallConfig = RecallConfig(), seed: int = 0) -> RecallResult:
    """Train ``model_cls`` on the recall task with a fixed seed; evaluate on fresh sequences.

    The seed fixes the initial weights and the training and evaluation data, so
    ``RecallModel`` and ``TiedRecallModel`` see the same numbers. CPU, float32; about a second.
    Runs on one CPU thread (restored afterwards): the matrices are tiny, and several threads only
    wait on each other, which on a busy machine makes the run many times slower.
    """
    with one_thread():
        return _train_recall(model_cls, config, seed)


def _train_recall(model_cls: type[RecallModel], config: RecallConfig, seed: int) -> RecallResult:
    init = torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(seed + 10_000)
    task = RecallTask(config)
    model = model_cls(config, generator=init)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    losses = []
    for _ in range(config.steps):
        X, y = task.sample(config.batch, data)
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    X, y = task.sample(config.n_eval, torch.Generator().manual_seed(seed + 20_000))
    with torch.no_grad():
        logits = model(X)
    return RecallResult(
        accuracy=float((logits.argmax(dim=1) == y).float().mean()),
        loss=float(nn.functional.cross_entropy(logits, y)),
        losses=losses,
        model=model.eval(),
    )
