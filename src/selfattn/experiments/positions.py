"""Which position schemes run past the training length? One model size, one budget, five schemes.

:func:`compare_position_schemes` trains the same small :class:`~selfattn.models.gpt.GPT` once per
scheme of :data:`selfattn.positions.POSITION_SCHEMES` (learned, sinusoidal, RoPE, ALiBi, none), on
the same batches, for the same number of steps, from the same initial weights (the scheme is built
last, see :class:`~selfattn.models.gpt.GPT`), at one training length T = ``train_length``. Then
every model reads the same fixed validation windows at several lengths, some longer than anything
it was trained on: the mean next-token loss at each length (None where the scheme cannot run: a
learned table has no row past ``train_length``), and the loss at every position of the longest
windows, which shows where a scheme breaks. The RoPE model is also evaluated, without any
fine-tuning, with the two standard rescalings of its angles (:func:`evaluate_rope_scaling`):
position interpolation (Chen et al. 2023) and the NTK-aware base (bloc97 2023).

:func:`validation_windows` and :func:`position_losses` are the pieces: fixed, evenly spaced windows
of a token sequence, and a model's loss at each position of them.

Introduced in chapter 08 (claim 24).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._runcache import shared_run
from .._validate import require_flag, require_positive_int, require_rank, require_tensor, shape_of
from ..models.gpt import GPT, GPTConfig, train_lm, unigram_cross_entropy
from ..positions import POSITION_SCHEMES, RotaryPositions, ntk_scaled_base

__all__ = [
    "ExtrapolationResult",
    "compare_position_schemes",
    "validation_windows",
    "position_losses",
    "evaluate_rope_scaling",
    "ROPE_SCALINGS",
]

#: The rescalings of RoPE that :func:`evaluate_rope_scaling` applies to a model trained at length
#: T, for an evaluation length L > T: ``"interpolation"`` divides every position by L / T (Chen et
#: al. 2023); ``"ntk"`` raises the base to ``ntk_scaled_base(base, L / T, d_head)`` (bloc97 2023).
ROPE_SCALINGS = ("interpolation", "ntk")


def _require_ids(name: str, ids, vocab_size: int | None = None) -> None:
    require_tensor(name, ids)
    require_rank(name, ids, 1, "(N,)")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError(f"{name} must hold integer token ids; got dtype {ids.dtype}")
    if vocab_size is not None and ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab_size):
        raise ValueError(
            f"{name} must hold ids in [0, vocab_size={vocab_size}); got values in "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )


def validation_windows(ids: torch.Tensor, length: int, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_windows`` fixed windows of ``length`` tokens, evenly spaced over ``ids``, and their targets.

    No randomness: window w starts at ``round(w * (N - length - 1) / (n_windows - 1))``, so every
    call (and every model) reads the same text. Windows of a shorter length are prefixes of these
    (take ``inputs[:, :L]``).

    Args:
        ids: (N,) integer token ids, N > ``length``. length: L (> 0). n_windows: W (> 0).

    Returns:
        ``(inputs, targets)``, each (W, L) int64; ``targets[w, t]`` is the token after ``inputs[w, t]``.

    Raises:
        TypeError / ValueError: ``ids`` not a 1-D integer tensor or not longer than ``length``;
        sizes not positive ints.

    Source: chapter 08.
    """
    _require_ids("ids", ids)
    L = require_positive_int("length", length)
    W = require_positive_int("n_windows", n_windows)
    N = ids.numel()
    if N <= L:
        raise ValueError(f"ids must hold more than length={L} tokens; got shape {shape_of(ids)}")
    last = N - L - 1  # the last start with a target after the window
    starts = torch.tensor([round(w * last / max(1, W - 1)) for w in range(W)], dtype=torch.int64)  # (W,)
    positions = starts[:, None] + torch.arange(L)[None, :]  # (W, 1) + (1, L) -> (W, L)
    ids = ids.to(torch.int64)
    return ids[positions], ids[positions + 1]


@torch.no_grad()
def position_losses(model: GPT, inputs: torch.Tensor, targets: torch.Tensor, *, batch_size: int = 32) -> torch.Tensor:
    """The next-token loss (nats) at every position, averaged over the windows: (L,) float64.

    Entry t is the mean over the W windows of ``-log p(targets[w, t] | inputs[w, :t + 1])``: how
    well the model predicts with t + 1 tokens of context, at absolute position t. Its mean is the
    ordinary loss on windows of length L.

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` (run in eval mode, left as it was).
        inputs, targets: (W, L) int64, e.g. from :func:`validation_windows`.
        batch_size: windows per forward pass (> 0; only memory depends on it).

    Raises:
        TypeError / ValueError: bad shapes; everything :meth:`GPT.forward` raises (learned positions
        past their table).

    Source: chapter 08.
    """
    for name, x in (("inputs", inputs), ("targets", targets)):
        require_tensor(name, x)
        require_rank(name, x, 2, "(W, L)")
    if inputs.shape != targets.shape:
        raise ValueError(f"inputs and targets must have one shape (W, L); got {shape_of(inputs)} and {shape_of(targets)}")
    B = require_positive_int("batch_size", batch_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros(inputs.shape[1], dtype=torch.float64)  # (L,)
    try:
        for i in range(0, inputs.shape[0], B):
            x, y = inputs[i : i + B].to(device), targets[i : i + B].to(device)  # (b, L) each
            logits = model(x)  # (b, L, V)
            nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (b, V, L) -> (b, L)
            total += nll.double().sum(dim=0).cpu()  # (L,)
    finally:
        model.train(was_training)
    return total / inputs.shape[0]


@contextlib.contextmanager
def _positions_swapped(model: GPT, scheme):
    """Run ``model`` with another position scheme object for the duration of the block."""
    original = model.positions
    model.positions = scheme
    try:
        yield model
    finally:
        model.positions = original


def evaluate_rope_scaling(
    model: GPT, inputs: torch.Tensor, targets: torch.Tensor, lengths: Sequence[int], *, train_length: int
) -> dict[str, dict[int, float]]:
    """The loss of a RoPE model, trained at ``train_length``, with its angles rescaled for longer inputs.

    For every L in ``lengths`` greater than ``train_length``, with the factor ``s = L /
    train_length`` and no fine-tuning: position interpolation, ``RotaryPositions(d_head, base,
    layout, interpolation=s)`` (positions 0 .. L-1 are squeezed into the trained range 0 .. T);
    and the NTK-aware base, ``RotaryPositions(d_head, ntk_scaled_base(base, s, d_head), layout)``.
    Each is the mean next-token loss on the windows ``inputs[:, :L]``. The model's own scheme is
    restored afterwards (also on an error).

    Args:
        model: a :class:`~selfattn.models.gpt.GPT` whose ``positions`` is a
            :class:`~selfattn.positions.RotaryPositions` without interpolation.
        inputs, targets: (W, L_max) windows (:func:`validation_windows`), L_max >= max(lengths).
        lengths: evaluation lengths (positive ints); those <= ``train_length`` are skipped.
        train_length: the length the model was trained at (> 0).

    Returns:
        ``{"interpolation": {L: loss}, "ntk": {L: loss}}`` (nats per token) for the lengths above
        ``train_length``, in the order of :data:`ROPE_SCALINGS`.

    Raises:
        TypeError: ``model`` is not a GPT with RoPE positions. ValueError: a length that is not a
        positive int or longer than the windows; ``train_length`` not a positive int.

    Source: Chen et al. 2023 (position interpolation); bloc97 2023 and Peng et al. 2023, section 3.1
    (NTK-aware scaling); chapter 08.
    """
    if not isinstance(model, GPT) or not isinstance(model.positions, RotaryPositions):
        got = type(model.positions).__name__ if isinstance(model, GPT) else type(model).__name__
        raise TypeError(f"model must be a GPT with RotaryPositions (positions='rope'); got {got}")
    T = require_positive_int("train_length", train_length)
    lengths = _require_lengths("lengths", lengths)
    for name, x in (("inputs", inputs), ("targets", targets)):
        require_tensor(name, x)
        require_rank(name, x, 2, "(W, L)")
    if max(lengths) > inputs.shape[1]:
        raise ValueError(f"lengths go up to {max(lengths)}, longer than the windows; got inputs of shape {shape_of(inputs)}")
    rope = model.positions
    result: dict[str, dict[int, float]] = {name: {} for name in ROPE_SCALINGS}
    for L in (L for L in lengths if L > T):
        factor = L / T
        schemes = {
            "interpolation": RotaryPositions(rope.d_head, base=rope.base, layout=rope.layout, interpolation=factor),
            "ntk": RotaryPositions(rope.d_head, base=ntk_scaled_base(rope.base, factor, rope.d_head), layout=rope.layout),
        }
        for name, scheme in schemes.items():
            with _positions_swapped(model, scheme):
                result[name][L] = float(position_losses(model, inputs[:, :L], targets[:, :L]).mean())
    return result


def _require_lengths(name: str, lengths) -> tuple[int, ...]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"{name} must be a non-empty sequence of positive ints; got {lengths!r}")
    values = tuple(require_positive_int(name, L) for L in lengths)
    if list(values) != sorted(set(values)):
        raise ValueError(f"{name} must be increasing, without repeats; got {values}")
    return values


@dataclass(frozen=True)
class ExtrapolationResult:
    """What :func:`compare_position_schemes` measured. Losses are in nats per token.

    Attributes:
        schemes: the schemes compared, in order. train_length: T, the training length.
        eval_lengths: the evaluation lengths, increasing.
        loss: ``loss[scheme][L]``, the mean next-token loss on the fixed validation windows of length
            L; None where the scheme cannot run (learned positions past their table).
        position_loss: ``position_loss[scheme]``, the loss at each position 0 .. L_max-1 of the
            longest windows, averaged over the windows (a tuple of floats; for learned positions only
            its table's ``train_length`` positions).
        train_loss: ``train_loss[scheme]``, the training loss of every step.
        seconds: ``seconds[scheme]``, wall-clock time of the scheme's training and evaluation
            (RoPE's includes :attr:`rope_scaling`). Depends on the machine and its load; never
            asserted.
        rope_scaling: ``rope_scaling[method][L]`` for method in :data:`ROPE_SCALINGS` and every L >
            T: the RoPE model's loss with rescaled angles, no fine-tuning (empty without "rope").
        uniform: ``log V``. unigram: the unigram model's loss on the windows' targets (fitted on the
            training ids, add-one smoothed).
        settings: the run's settings (model sizes, steps, batch_size, lr, eval_windows, seed) and
            ``n_parameters`` (the learned table adds ``train_length * d_model`` to it).
        models: ``models[scheme]``, the trained :class:`~selfattn.models.gpt.GPT` (eval mode, CPU),
            to sample from or look inside; not part of the result's equality or repr.
    """

    schemes: tuple[str, ...]
    train_length: int
    eval_lengths: tuple[int, ...]
    loss: dict[str, dict[int, float | None]]
    position_loss: dict[str, tuple[float, ...]]
    train_loss: dict[str, tuple[float, ...]]
    seconds: dict[str, float]
    rope_scaling: dict[str, dict[int, float]]
    uniform: float
    unigram: float
    settings: dict
    models: dict[str, GPT] = field(default_factory=dict, compare=False, repr=False)

    @property
    def total_seconds(self) -> float:
        """The whole comparison's wall-clock time (the sum of :attr:`seconds`)."""
        return float(sum(self.seconds.values()))

    def rows(self) -> list[tuple[str, list[float | None]]]:
        """One row per scheme and one per RoPE rescaling: ``(label, [loss at each eval length])``.

        A rescaling's entry at a length <= T is the plain RoPE loss (the factor would be 1).
        """
        rows = [(name, [self.loss[name][L] for L in self.eval_lengths]) for name in self.schemes]
        for method in self.rope_scaling:
            label = {"interpolation": "rope + interpolation", "ntk": "rope + NTK base"}[method]
            rows.append(
                (label, [self.rope_scaling[method].get(L, self.loss["rope"][L]) for L in self.eval_lengths])
            )
        return rows

    def table(self) -> str:
        """The losses as a text table: rows of :meth:`rows`, a column per evaluation length."""
        head = f"{'loss (nats/token) at length':<28}" + "".join(f"{L:>9}" for L in self.eval_lengths)
        lines = [head]
        for label, values in self.rows():
            cells = "".join(f"{'-':>9}" if v is None else f"{v:>9.3f}" for v in values)
            lines.append(f"{label:<28}{cells}")
        lines.append(f"baselines: unigram {self.unigram:.3f}, uniform (log V) {self.uniform:.3f}")
        return "\n".join(lines)


@shared_run
def compare_position_schemes(
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    vocab_size: int,
    *,
    schemes: Sequence[str] = POSITION_SCHEMES,
    train_length: int = 64,
    eval_lengths: Sequence[int] = (64, 128, 256),
    steps: int = 250,
    batch_size: int = 24,
    d_model: int = 64,
    n_heads: int = 4,
    n_layers: int = 2,
    d_ff: int = 128,
    lr: float = 3e-3,
    eval_windows: int = 48,
    seed: int = 0,
    progress: bool = True,
) -> ExtrapolationResult:
    """Train one GPT per position scheme at length ``train_length``; measure the loss at ``eval_lengths``.

    Every scheme gets the same model sizes, the same initial weights (``torch.manual_seed(seed)``
    before each model; the scheme is built after the other parameters), the same batches
    (:func:`~selfattn.models.gpt.train_lm` with ``seed``) and the same number of steps. Then each
    model reads the same ``eval_windows`` windows of :func:`validation_windows` (``max(eval_lengths)``
    tokens, evenly spaced over ``val_ids``): the mean loss on their first L tokens for each L in
    ``eval_lengths``, and the loss at each position. The RoPE model is evaluated again with position
    interpolation and the NTK-aware base (:func:`evaluate_rope_scaling`) at every L > ``train_length``.

    The defaults (d_model 64, 2 layers, 4 heads, d_ff 128, 250 steps of 24 windows) run the whole
    comparison in about a minute on one CPU thread. Deterministic on the CPU for a given seed (and
    thread count); the global torch seed is left advanced.

    Args:
        train_ids, val_ids: 1-D integer token ids (e.g. chapter 14's 90 % / 10 % split of
            :func:`selfattn.data.load_corpus` encoded by :class:`selfattn.data.CharTokenizer`).
        vocab_size: V (> 0); every id is in [0, V).
        schemes: names from :data:`~selfattn.positions.POSITION_SCHEMES`, without repeats.
        train_length: T (> 0), the training length and the learned table's size.
        eval_lengths: increasing positive ints; ``val_ids`` must be longer than the largest.
        steps, batch_size, d_model, n_heads, n_layers, d_ff: as :func:`train_lm` and :class:`GPTConfig`.
        lr: peak learning rate (finite, > 0). eval_windows: W (> 0) validation windows.
        seed: initial weights and batches. progress: a tqdm bar over the schemes.

    Returns:
        An :class:`ExtrapolationResult`.

    Raises:
        TypeError / ValueError: ids not 1-D integer tensors in [0, V), or too short; an unknown or
        repeated scheme; lengths not increasing positive ints; sizes not positive ints; a bad lr.

    Source: Press et al. 2022 (figure 1, the same comparison at scale); chapter 08 (claim 24).
    """
    progress = require_flag("progress", progress)
    V = require_positive_int("vocab_size", vocab_size)
    _require_ids("train_ids", train_ids, V)
    _require_ids("val_ids", val_ids, V)
    if isinstance(schemes, str) or not isinstance(schemes, Sequence) or not schemes:
        raise ValueError(f"schemes must be a non-empty sequence of names from {POSITION_SCHEMES}; got {schemes!r}")
    for name in schemes:
        if name not in POSITION_SCHEMES:
            raise ValueError(f"schemes must hold names from {POSITION_SCHEMES}; got {name!r}")
    if len(set(schemes)) != len(schemes):
        raise ValueError(f"schemes must not repeat a name; got {tuple(schemes)}")
    T = require_positive_int("train_length", train_length)
    lengths = _require_lengths("eval_lengths", eval_lengths)
    L_max = lengths[-1]
    if train_ids.numel() <= T:
        raise ValueError(f"train_ids must hold more than train_length={T} tokens; got shape {shape_of(train_ids)}")
    if val_ids.numel() <= L_max:
        raise ValueError(
            f"val_ids must hold more than max(eval_lengths)={L_max} tokens; got shape {shape_of(val_ids)}"
        )
    for name, value in (("steps", steps), ("batch_size", batch_size), ("eval_windows", eval_windows)):
        require_positive_int(name, value)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0; got {lr!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int; got {seed!r}")
    configs = {
        name: GPTConfig(vocab_size=V, block_size=T, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                        d_ff=d_ff, positions=name)
        for name in schemes
    }  # validates the sizes for every scheme before any training starts
    from tqdm.auto import tqdm

    train_ids, val_ids = train_ids.to(torch.int64), val_ids.to(torch.int64)
    inputs, targets = validation_windows(val_ids, L_max, eval_windows)  # (W, L_max) each
    loss, position_loss, train_loss, seconds, models = {}, {}, {}, {}, {}
    rope_scaling: dict[str, dict[int, float]] = {}
    n_parameters = {}
    bar = tqdm(schemes, desc="position schemes", disable=not progress)
    for name in bar:
        bar.set_postfix(scheme=name)
        start = time.perf_counter()
        torch.manual_seed(seed)
        model = GPT(configs[name])
        n_parameters[name] = sum(p.numel() for p in model.parameters())
        log = train_lm(model, train_ids, val_ids, steps=steps, batch_size=batch_size, lr=lr, eval_every=steps,
                       eval_batches=1, seed=seed, progress=False)
        limit = model.positions.max_positions
        runnable = L_max if limit is None else min(L_max, limit)
        curve = position_losses(model, inputs[:, :runnable], targets[:, :runnable])  # (runnable,)
        position_loss[name] = tuple(float(v) for v in curve)
        # Each length's loss from a forward pass on the windows' first L tokens (the longest one's
        # is the curve's own pass).
        loss[name] = {
            L: (None if L > runnable
                else float(curve.mean()) if L == runnable
                else float(position_losses(model, inputs[:, :L], targets[:, :L]).mean()))
            for L in lengths
        }
        train_loss[name] = tuple(log.train_loss)
        if name == "rope":
            rope_scaling = evaluate_rope_scaling(model, inputs, targets, lengths, train_length=T)
        seconds[name] = time.perf_counter() - start
        models[name] = model
    settings = dict(steps=steps, batch_size=batch_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                    d_ff=d_ff, lr=float(lr), eval_windows=eval_windows, seed=seed, n_parameters=n_parameters)
    return ExtrapolationResult(
        schemes=tuple(schemes),
        train_length=T,
        eval_lengths=lengths,
        loss=loss,
        position_loss=position_loss,
        train_loss=train_loss,
        seconds=seconds,
        rope_scaling=rope_scaling,
        uniform=math.log(V),
        unigram=unigram_cross_entropy(train_ids, targets.reshape(-1), V),
        settings=settings,
        models=models,
    )
