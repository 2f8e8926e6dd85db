"""A tiny encoder-decoder Transformer made of the package's parts, trained to reverse digit strings.

The model is the original Transformer's layout (Vaswani et al. 2017, section 3.1 and figure 1),
written pre-norm and at toy size:

- the **encoder** reads the source digits (token + learned position embeddings) through
  :class:`~selfattn.block.TransformerBlock` layers without a mask, then a final layer norm; its
  output is the *memory*, (B, S, D);
- each **decoder** layer (:class:`DecoderBlock`) runs causal self-attention over the target read so
  far, then **cross-attention** (queries from the decoder, keys and values from the memory), then a
  feed-forward network, each in a pre-norm residual branch;
- a final layer norm and a linear read-out give the next-digit logits.

Both attentions are the package's :class:`~selfattn.multihead.MultiHeadAttention`: cross-attention is
the same module called as ``attn(x_q=decoder_stream, x_kv=memory)``.

The task (:func:`sample_reversal`): the target is the source read backwards, so decoder position
``i`` must read source position ``n - 1 - i``. Nothing tells the model so: if it learns the task,
its cross-attention weights must have learned that alignment. Introduced in chapter 05 (claim 11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._threads import one_thread
from .._validate import require_positive_int, require_rank, require_tensor, shape_of
from ..block import BlockConfig, FeedForward, TransformerBlock
from ..masks import causal_mask
from ..multihead import MultiHeadAttention

__all__ = [
    "Seq2SeqConfig",
    "DecoderBlock",
    "Seq2Seq",
    "sample_reversal",
    "held_out_reversal",
    "greedy_decode",
    "ReversalResult",
    "train_reversal",
    "alignment_score",
]

N_DIGITS = 10
BOS = N_DIGITS  # the decoder's start token: id 10, after the digits 0-9


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Sizes of a :class:`Seq2Seq` and of its training run, validated at construction.

    Attributes:
        length: n, the number of digits of every source (and target) string (> 1).
        d_model: width D (> 0), divisible by ``n_heads``. n_heads: H (> 0). d_ff: feed-forward width F.
        n_enc_layers, n_dec_layers: number of encoder and decoder layers (> 0).
        steps: optimisation steps (Adam). batch: strings per step. lr: learning rate (> 0).
        n_eval: held-out strings, never seen in training, for the accuracy.
    """

    length: int = 8
    d_model: int = 32
    n_heads: int = 2
    d_ff: int = 64
    n_enc_layers: int = 1
    n_dec_layers: int = 1
    steps: int = 200
    batch: int = 64
    lr: float = 3e-3
    n_eval: int = 512

    def __post_init__(self):
        for name in ("length", "n_enc_layers", "n_dec_layers", "steps", "batch", "n_eval"):
            require_positive_int(name, getattr(self, name))
        if self.length < 2:
            raise ValueError(f"length must be >= 2 (a reversal of one digit is the identity); got {self.length}")
        if 2 * self.n_eval > N_DIGITS**self.length:  # else the training sampler, which redraws held-out
            # strings, would find few (or no) strings left to train on, and could loop for ever
            raise ValueError(f"n_eval must be at most half of the {N_DIGITS**self.length} strings of length "
                             f"{self.length}; got n_eval={self.n_eval}")
        BlockConfig(self.d_model, self.n_heads, self.d_ff)  # validates d_model, n_heads, d_ff
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0; got {self.lr!r}")

    @property
    def block_config(self) -> BlockConfig:
        return BlockConfig(self.d_model, self.n_heads, self.d_ff)


class DecoderBlock(nn.Module):
    """Pre-norm decoder layer: causal self-attention, cross-attention, feed-forward network.

    ``x = x + self_attn(ln1(x), causal)``; ``x = x + cross_attn(ln2(x), memory)``;
    ``x = x + ffn(ln3(x))`` (Vaswani et al. 2017, section 3.1, with the norms moved in front of
    each branch as in :class:`~selfattn.block.TransformerBlock`).

    Shapes:
        forward(x: (B, T, D), memory: (B, S, D), memory_mask: optional boolean keep-mask
        broadcastable to (B, H, T, S)) -> ``(x, cross_weights)``, x (B, T, D), cross_weights
        (B, H, T, S): how much each decoder position reads each source position.

    Raises:
        TypeError: ``config`` not a :class:`~selfattn.block.BlockConfig`; at call time, every error of
        :class:`~selfattn.multihead.MultiHeadAttention` (wrong ranks, widths, dtypes, batch sizes).

    Source: chapter 05.
    """

    def __init__(self, config: BlockConfig):
        super().__init__()
        if not isinstance(config, BlockConfig):
            raise TypeError(f"config must be a BlockConfig; got {type(config).__name__}")
        D = config.d_model
        self.self_attn = MultiHeadAttention(config.mha_config)
        self.cross_attn = MultiHeadAttention(config.mha_config)
        self.ffn = FeedForward(D, config.d_ff)
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(D, eps=config.layer_norm_eps) for _ in range(3))

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None):
        T = x.shape[1]
        x = x + self.self_attn(self.ln1(x), mask=causal_mask(T, device=x.device))  # (B, T, D): reads its past only
        # Cross-attention: queries from the decoder stream, keys and values from the encoder's memory.
        read, cross_weights = self.cross_attn(self.ln2(x), memory, mask=memory_mask, return_weights=True)
        x = x + read  # (B, T, D)
        x = x + self.ffn(self.ln3(x))  # (B, T, D)
        return x, cross_weights  # cross_weights (B, H, T, S)


class Seq2Seq(nn.Module):
    """Encoder-decoder Transformer over digit strings (ids 0-9; the decoder also reads BOS = 10).

    Args:
        config: a :class:`Seq2SeqConfig`.

    Shapes:
        encode(src: (B, S) int64) -> memory (B, S, D).
        forward(src: (B, S), tgt_in: (B, T) int64, ``T <= S``) -> ``(logits, cross_weights)``:
        logits (B, T, 10) for the next target digit at each decoder position, and a tuple with one
        (B, H, T, S) cross-attention weight tensor per decoder layer.

    Raises:
        TypeError / ValueError: ``config`` not a :class:`Seq2SeqConfig`; ids not 2-D int64 tensors,
        out of range, longer than ``config.length``, or batches of different sizes.

    Source: Vaswani et al. 2017 (encoder-decoder); chapter 05.
    """

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        if not isinstance(config, Seq2SeqConfig):
            raise TypeError(f"config must be a Seq2SeqConfig; got {type(config).__name__}")
        self.config = config
        D, n = config.d_model, config.length
        self.src_embed = nn.Embedding(N_DIGITS, D)
        self.tgt_embed = nn.Embedding(N_DIGITS + 1, D)  # + BOS
        self.src_pos = nn.Embedding(n, D)  # learned positions, one table per side
        self.tgt_pos = nn.Embedding(n, D)
        self.encoder = nn.ModuleList(TransformerBlock(config.block_config) for _ in range(config.n_enc_layers))
        self.enc_ln = nn.LayerNorm(D)  # a pre-norm stack needs a final norm (chapter 07)
        self.decoder = nn.ModuleList(DecoderBlock(config.block_config) for _ in range(config.n_dec_layers))
        self.dec_ln = nn.LayerNorm(D)
        self.readout = nn.Linear(D, N_DIGITS)

    def _check_ids(self, name: str, ids, upper: int) -> None:
        require_tensor(name, ids)
        require_rank(name, ids, 2, "(B, T)")
        if ids.dtype != torch.int64:
            raise TypeError(f"{name} must be an int64 tensor of token ids; got dtype {ids.dtype}")
        if not 0 < ids.shape[1] <= self.config.length:
            raise ValueError(f"{name} must hold 1 to length={self.config.length} positions; got shape {shape_of(ids)}")
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < upper):
            raise ValueError(f"{name} ids must lie in [0, {upper}); got min {int(ids.min())}, max {int(ids.max())}")

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """The encoder's output, the memory the decoder reads: (B, S) ids -> (B, S, D)."""
        self._check_ids("src", src, N_DIGITS)
        x = self.src_embed(src) + self.src_pos.weight[: src.shape[1]]  # (B, S, D) + (S, D)
        for block in self.encoder:
            x = block(x)  # no mask: every source position reads every other
        return self.enc_ln(x)

    def decode(self, memory: torch.Tensor, tgt_in: torch.Tensor):
        """Logits (B, T, 10) and the per-layer cross-attention weights (B, H, T, S)."""
        self._check_ids("tgt_in", tgt_in, N_DIGITS + 1)
        if tgt_in.shape[0] != memory.shape[0]:
            raise ValueError(f"tgt_in and src must have the same batch size; got {shape_of(tgt_in)} and {shape_of(memory)}")
        x = self.tgt_embed(tgt_in) + self.tgt_pos.weight[: tgt_in.shape[1]]  # (B, T, D) + (T, D)
        weights = []
        for block in self.decoder:
            x, w = block(x, memory)
            weights.append(w)
        return self.readout(self.dec_ln(x)), tuple(weights)  # (B, T, D) @ (D, 10) -> (B, T, 10)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor):
        return self.decode(self.encode(src), tgt_in)


def sample_reversal(n: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random digit strings of ``length`` digits and their reversals, both (n, length) int64.

    Raises:
        TypeError / ValueError: ``n`` or ``length`` not positive ints.
    """
    require_positive_int("n", n)
    require_positive_int("length", length)
    src = torch.randint(N_DIGITS, (n, length), generator=generator)
    return src, src.flip(1)


def held_out_reversal(config: Seq2SeqConfig, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation strings for ``seed``: ``config.n_eval`` sources and targets, (n_eval, n) int64.

    :func:`train_reversal` never trains on any of them (it resamples a training string that equals one).
    """
    return sample_reversal(config.n_eval, config.length, torch.Generator().manual_seed(seed + 20_000))


def teacher_forcing_input(tgt: torch.Tensor) -> torch.Tensor:
    """The decoder's input for targets (B, T): BOS, then the target shifted right by one, (B, T)."""
    bos = torch.full_like(tgt[:, :1], BOS)
    return torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, 1) + (B, T - 1) -> (B, T)


@torch.no_grad()
def greedy_decode(model: Seq2Seq, src: torch.Tensor) -> torch.Tensor:
    """Generate the output digit by digit, each time taking the most likely one: (B, S) -> (B, S).

    The decoder sees only what it has generated so far (no teacher forcing): this is how the
    accuracy is measured.
    """
    memory = model.encode(src)
    out = torch.full_like(src[:, :1], BOS)  # (B, 1)
    for _ in range(src.shape[1]):
        logits, _ = model.decode(memory, out)
        out = torch.cat([out, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)  # (B, t) -> (B, t + 1)
    return out[:, 1:]


def alignment_score(cross_weights: torch.Tensor) -> tuple[float, float]:
    """How well cross-attention weights follow the reversal: decoder position i -> source n - 1 - i.

    Args:
        cross_weights: (B, H, T, S) weights of one decoder layer with T = S = n.

    Returns:
        ``(argmax_fraction, mean_weight)``: the fraction of (string, position) rows whose
        head-averaged weights peak at source position n - 1 - i, and the mean head-averaged weight
        on that position. Chance is 1 / n for both.

    Raises:
        ValueError: ``cross_weights`` not 4-D with T == S.
    """
    require_tensor("cross_weights", cross_weights)
    require_rank("cross_weights", cross_weights, 4, "(B, H, T, S)")
    T, S = cross_weights.shape[-2:]
    if T != S:
        raise ValueError(f"cross_weights must have T == S for a reversal; got shape {shape_of(cross_weights)}")
    w = cross_weights.mean(dim=1)  # (B, H, T, S) -> (B, T, S): average over heads
    expected = torch.arange(S - 1, -1, -1)  # decoder position i reads source position n - 1 - i
    argmax_fraction = float((w.argmax(dim=-1) == expected).float().mean())
    mean_weight = float(w[:, torch.arange(T), expected].mean())
    return argmax_fraction, mean_weight


@dataclass(frozen=True)
class ReversalResult:
    """A trained :class:`Seq2Seq` and what was measured on the held-out strings.

    Attributes:
        model: the trained model (eval mode). losses: training cross-entropy per step (nats).
        exact_match: fraction of held-out strings reversed exactly by greedy decoding.
        digit_accuracy: fraction of held-out digits right. alignment_argmax, alignment_weight:
            :func:`alignment_score` of the last decoder layer on the held-out strings.
        cross_weights: that layer's weights (n_eval, H, n, n), teacher-forced.
    """

    model: Seq2Seq
    losses: list[float]
    exact_match: float
    digit_accuracy: float
    alignment_argmax: float
    alignment_weight: float
    cross_weights: torch.Tensor


def train_reversal(config: Seq2SeqConfig = Seq2SeqConfig(), seed: int = 0, *, steps: int | None = None) -> ReversalResult:
    """Train a :class:`Seq2Seq` to reverse digit strings, then evaluate it on held-out strings.

    The seed fixes the initial weights, the training batches and the held-out set. Runs on one CPU
    thread (restored afterwards), so the numbers do not depend on the machine's thread count or
    load. ``steps`` (default ``config.steps``) can cut the run short. CPU, float32.
    """
    steps = config.steps if steps is None else require_positive_int("steps", steps)
    with one_thread():
        return _train_reversal(config, seed, steps)


def _train_reversal(config: Seq2SeqConfig, seed: int, steps: int) -> ReversalResult:
    torch.manual_seed(seed)  # the initial weights
    model = Seq2Seq(config)
    data = torch.Generator().manual_seed(seed + 10_000)
    held_src, held_tgt = held_out_reversal(config, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    losses = []
    for _ in range(steps):
        src, tgt = training_batch(config, data, held_src)
        logits, _ = model(src, teacher_forcing_input(tgt))  # (B, n, 10)
        loss = F.cross_entropy(logits.reshape(-1, N_DIGITS), tgt.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return evaluate_reversal(model.eval(), held_src, held_tgt, losses)


def training_batch(config: Seq2SeqConfig, generator: torch.Generator, held_src: torch.Tensor):
    """One training batch (src, tgt), each (batch, n) int64, with no string from ``held_src``."""
    src, tgt = sample_reversal(config.batch, config.length, generator)
    weights = N_DIGITS ** torch.arange(config.length)  # a string's digits -> one integer, to compare whole strings
    seen = torch.isin(src @ weights, held_src @ weights)
    while bool(seen.any()):  # rare (1e-5 per string for n = 8): resample the held-out ones
        src[seen] = torch.randint(N_DIGITS, (int(seen.sum()), config.length), generator=generator)
        seen = torch.isin(src @ weights, held_src @ weights)
    return src, src.flip(1)


@torch.no_grad()
def evaluate_reversal(model: Seq2Seq, held_src: torch.Tensor, held_tgt: torch.Tensor, losses: list[float]) -> ReversalResult:
    """Greedy-decoding accuracy and cross-attention alignment of ``model`` on held-out strings."""
    predicted = greedy_decode(model, held_src)
    _, weights = model(held_src, teacher_forcing_input(held_tgt))
    argmax_fraction, mean_weight = alignment_score(weights[-1])
    return ReversalResult(
        model=model,
        losses=list(losses),
        exact_match=float((predicted == held_tgt).all(dim=1).float().mean()),
        digit_accuracy=float((predicted == held_tgt).float().mean()),
        alignment_argmax=argmax_fraction,
        alignment_weight=mean_weight,
        cross_weights=weights[-1],
    )
