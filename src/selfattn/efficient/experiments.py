"""Small experiments of chapters 09-10: real queries/keys/values, a lookup task, errors of variants.

Kept here (not in the notebooks) so that the chapter and its claim tests run the same code.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validate import require_flag, require_positive_int
from ..attention import scaled_dot_product_attention
from .variants import linear_attention, sliding_window_attention

__all__ = ["sdpa_comparison_text", "tied_with_fastest", "minilm_qkv", "relative_error", "variant_errors", "lookup_task", "target_weight", "fitted_slope",
           "compare_times"]


def minilm_qkv(n_tokens: int = 128, layer: int = 0):
    """Real queries, keys and values: the first ``n_tokens`` WordPiece tokens of the course corpus
    (``selfattn.data.load_corpus``) through the real model's embedding table and the projections
    ``W_Q, W_K, W_V`` of one layer of all-MiniLM-L6-v2 (``selfattn.pretrained.load_minilm``).

    Returns:
        ``(q, k, v)``, each (1, 12, n_tokens, 32) float32, and the list of tokens.

    Raises:
        ValueError: ``n_tokens`` not in [1, 512] or ``layer`` not in [0, 5].

    Source: chapter 09 (claim 18).
    """
    from ..data import load_corpus
    from ..pretrained import load_minilm

    n_tokens = require_positive_int("n_tokens", n_tokens)
    if n_tokens > 512:
        raise ValueError(f"n_tokens must be <= 512 (the model's positions); got {n_tokens}")
    if not 0 <= layer < 6:
        raise ValueError(f"layer must be in [0, 5]; got {layer}")
    model = load_minilm()
    batch = model.tokenize(load_corpus()[: 8 * n_tokens])
    ids = batch.input_ids[:, :n_tokens]  # (1, T)
    X = model.token_embeddings(ids)  # (1, T, D)
    sd, H = model.state_dict, model.config.n_heads
    prefix = f"encoder.layer.{layer}.attention.self."

    def project(name):
        W, b = sd[prefix + name + ".weight"], sd[prefix + name + ".bias"]  # nn.Linear layout: (out, in)
        Y = X @ W.T + b  # (1, T, D) @ (D, D) -> (1, T, D)
        return Y.reshape(1, ids.shape[1], H, -1).transpose(1, 2)  # (1, T, D) -> (1, H, T, Dh)

    return project("query"), project("key"), project("value"), batch.tokens[0][:n_tokens]


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norms over everything)."""
    return float((approx - exact).norm() / exact.norm())


def variant_errors(q, k, v, windows=(4, 16, 64), causal: bool = True) -> dict[str, float]:
    """Relative error of each approximate variant against exact attention on the same inputs.

    Returns a dict: ``"window=w"`` for each sliding window and ``"linear (elu+1)"``.
    Source: chapter 09 (claim 18).
    """
    causal = require_flag("causal", causal)
    T = q.shape[-2]
    keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else None
    exact = scaled_dot_product_attention(q, k, v, keep)
    errors = {f"window={w}": relative_error(sliding_window_attention(q, k, v, w, causal), exact) for w in windows}
    errors["linear (elu+1)"] = relative_error(linear_attention(q, k, v, causal=causal), exact)
    return errors


def lookup_task(T: int = 64, d_head: int = 32, seed: int = 0):
    """A sharp lookup: query i is a copy (times ``2 d_head``) of the key at a random position
    ``targets[i]``; keys are random unit vectors; values are one-hot positions (V = I), so each
    output row *is* the attention weights and ``out[i, targets[i]]`` is the weight on the right key.

    Returns:
        ``(q, k, v, targets)``: (T, d_head), (T, d_head), (T, T) float64 and (T,) int64.

    Source: chapter 09 (claim 18: the approximation visibly fails).
    """
    T, d_head = require_positive_int("T", T), require_positive_int("d_head", d_head)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, d_head, generator=g, dtype=torch.float64)
    k = k / k.norm(dim=-1, keepdim=True)
    targets = torch.randint(0, T, (T,), generator=g)
    q = 2.0 * d_head * k[targets]  # score of the target: 2 d_head / sqrt(d_head) = 2 sqrt(d_head)
    return q, k, torch.eye(T, dtype=torch.float64), targets


def target_weight(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The weight each query puts on its target (rows of ``out`` are weights when V = I): (T,)."""
    return out.gather(-1, targets[:, None])[:, 0]


def fitted_slope(sizes, values) -> float:
    """Least-squares slope of ``log(values)`` against ``log(sizes)``: the exponent p in
    ``value ~ size^p`` (2 quadratic, 1 linear). Source: chapter 09 (claim 16)."""
    x, y = np.log(np.asarray(sizes, dtype=float)), np.log(np.asarray(values, dtype=float))
    return float(np.polyfit(x, y, 1)[0])


def compare_times(time: float, reference: float, *, within: float = 0.15) -> str:
    """``"less"``, ``"about the same"`` or ``"more"``: how ``time`` compares with ``reference`` (both
    positive, any one unit), "about the same" when ``time / reference`` lies in
    ``[1 - within, 1 + within]``. The cases are symmetric, so that a sentence chosen by them is true
    for whatever numbers a machine measures (chapter 10 compares SDPA's time with the tiled loop's
    matrix products). Raises ``ValueError`` for a time or reference that is not a positive finite
    number, or ``within`` outside [0, 1). Source: chapter 10."""
    for name, value in (("time", time), ("reference", reference)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    if not 0 <= within < 1:
        raise ValueError(f"within must be in [0, 1), got {within!r}")
    ratio = time / reference
    return "less" if ratio < 1 - within else "more" if ratio > 1 + within else "about the same"


def tied_with_fastest(samples) -> tuple[object, list, dict]:
    """Which configurations tie with the fastest, from their repeated timings.

    Args: ``samples``: {name: sequence of seconds}, each at least one positive finite time (the repeats
    of one configuration, e.g. a block size).

    Returns ``(fastest, tied, spread)``: the name with the least best (minimum) time; the names, in the
    order given, whose best time is within the spread of *both* of the two compared, that is
    ``best[b] / best[fastest] - 1 <= min(spread[b], spread[fastest])``, the fastest included; and
    ``spread[name] = max / min - 1`` of its repeats. A pair is a tie only when its gap is no larger than
    the repeats of each of the two vary: a noisy size (the fastest or another) cannot tie a steady one
    by its own noise alone, and the gap between two sizes is judged against the noise of those two, not
    the worst noise of every size measured.

    Raises: ValueError: empty ``samples``, or a name with no time or a time that is not positive and
    finite. Source: chapter 10 (block sizes against the caches).
    """
    if not samples:
        raise ValueError("samples must hold at least one configuration's timings, got none")
    spread, best = {}, {}
    for name, times in samples.items():
        times = list(times)
        if not times or not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in times):
            raise ValueError(f"samples[{name!r}] must be positive finite seconds, got {times!r}")
        best[name], spread[name] = min(times), max(times) / min(times) - 1
    fastest = min(best, key=best.get)
    tied = [b for b in best if best[b] / best[fastest] - 1 <= min(spread[b], spread[fastest])]
    return fastest, tied, spread


def sdpa_comparison_text(tiled_s: float, sdpa_s: float, products_s: float, noise: float,
                         between_share: float) -> tuple[str, str]:
    """(main, notes): chapter 10's sentences on the tiled loop against SDPA on a CPU, and the caveats
    for its collapsed "Lab notes" box. The text follows the numbers.

    Args: ``tiled_s``, ``sdpa_s``: the fastest repeat of each (seconds). ``products_s``: the loop's two
    matrix products per tile replayed alone. ``noise``: how much the repeats of the two differ (e.g. 0.2
    for 20 %). ``between_share``: the share of the loop's operation time outside the products (0-1).

    The rule (issue 26): a conclusion is drawn only from a difference larger than ``noise``. When the
    loop and SDPA differ by less, the text says this run cannot tell which is faster and draws no
    conclusion about fusion; the fusion reading (the loop runs its softmax passes as separate operations
    on each tile, SDPA fuses them into its tile loop) is given only when SDPA is measurably faster *and*
    its whole call takes about as long as the loop's products alone (:func:`compare_times`, within
    15 %), or less. What limits those separate passes (memory traffic or their fixed cost per call) is
    not measured by the run, and the text says so instead of naming one.

    Raises: ValueError: a time that is not a positive finite number, a negative or non-finite noise, a
    share outside [0, 1]. Source: chapter 10.
    """
    for name, value in (("tiled_s", tiled_s), ("sdpa_s", sdpa_s), ("products_s", products_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0 (a relative spread), got {noise!r}")
    if not (isinstance(between_share, (int, float)) and 0 <= between_share <= 1):
        raise ValueError(f"between_share must be in [0, 1], got {between_share!r}")
    ratio = tiled_s / sdpa_s
    versus_products = compare_times(sdpa_s, products_s)
    notes = (f"Times are the fastest of interleaved repeats; the two fastest repeats of the loop and of SDPA differ "
             f"by up to {noise:.0%}. Replayed alone, the loop's two matrix products per tile take "
             f"{products_s * 1e3:.0f} ms of its {tiled_s * 1e3:.0f} ms, and the stopwatch puts "
             f"{between_share:.0%} of its operation time between them; SDPA's whole call takes {sdpa_s * 1e3:.0f} ms. "
             "To check: run the stopwatch cell with other block sizes, or time `torch.exp2` on a tile-sized tensor "
             "against `torch.bmm` of the same tile.")
    if abs(ratio - 1) <= noise:
        main = (f"In this run the loop took {ratio:.2f} times SDPA's time, a difference smaller than the repeats "
                "vary: this run cannot tell which is faster, nor what separates them.")
    elif ratio < 1:
        main = (f"In this run the loop was the faster, at {ratio:.2f} times SDPA's time: this run shows no gain from "
                "SDPA's fusion.")
    elif versus_products == "more":
        main = (f"In this run the loop took {ratio:.2f} times SDPA's time, but SDPA's whole call took longer than the "
                "loop's products alone, so this run does not show where SDPA gains.")
    else:
        main = (f"In this run the loop took {ratio:.2f} times SDPA's time, and SDPA's whole call took "
                + ("about as long as" if versus_products == "about the same" else "less than")
                + " the loop's matrix products alone. The loop pays for its softmax passes as separate operations on "
                "each tile; SDPA fuses them into its tile loop, as FlashAttention's kernel does on a GPU. What limits "
                "those passes, memory traffic or their cost per call, this run does not measure.")
        if versus_products == "less":
            main += " Its products also run faster than the loop's, so fusion is not the whole gap."
    return main, notes
