"""A multi-head checkpoint converted to grouped-query attention, on the real MiniLM, without retraining.

Ainslie et al. (2023, section 2.1) build a grouped-query model from a multi-head checkpoint by
mean-pooling the key and value projection matrices of each group of query heads, then "uptrain" it
on a few percent of the pre-training compute. This module does the first step only, on
all-MiniLM-L6-v2 (6 layers, 12 heads of width Dh = 32), and measures what it changes in the
model's sentence embeddings.

How the conversion is computed. A grouped-query layer whose query head h reads key/value head
``h // G`` (G = n_heads // n_kv_heads; the order of :func:`selfattn.gqa.repeat_kv`) computes exactly
what a multi-head layer computes whose key and value heads are those shared heads, repeated G times.
So the converted model is the package's own :class:`~selfattn.encoder.Encoder` with each layer's
``W_K``, ``b_K``, ``W_V``, ``b_V`` replaced by their group means expanded back to 12 heads
(:func:`expand_pooled_kv`); that equality is tested against
:meth:`selfattn.gqa.GroupedQueryAttention.from_mha` (float64, 1e-12), and ``n_kv_heads = 12``
gives back the original embeddings exactly (claim 26, first half). The cache it needs is
:func:`selfattn.gqa.kv_cache_bytes_per_token` with ``n_kv_heads`` (claim 26, second half).

Biases (BERT has them): key/value head g's bias is the mean of its group's biases, the same mean as
the weights. Why that is the consistent choice: the key of head h is the affine map
``x W_K^h + b_K^h``; averaging weights and biases alike makes the pooled key the mean of the group's
keys for every input x, ``mean_h(x W_K^h + b_K^h) = x mean_h(W_K^h) + mean_h(b_K^h)``; pooling only
the weights (or taking one head's bias) would not. Two consequences worth knowing (both tested): a
key bias adds ``q_i . b_K`` to every score of query row i, the same for every key, so the softmax
never sees it, before or after pooling; the value bias does matter: every weight row sums to one, so
head h's context gains exactly ``b_V`` of the head it reads, which pooling changes from ``b_V^h`` to
the group mean.

Sentence embeddings as :meth:`selfattn.pretrained.MiniLM.sentence_embedding`: the mean of the last
layer's vectors over the real tokens (attention mask 1), L2-normalised (tested equal).

Source: Ainslie et al. 2023 (GQA), section 2.1; chapter 11 (issue 12).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from .._validate import require_positive_int, require_tensor, shape_of
from ..encoder import Encoder
from ..gqa import GQAConfig, kv_cache_bytes_per_token

__all__ = [
    "SENTENCES",
    "PARAPHRASE_PAIRS",
    "N_KV_HEADS",
    "pool_kv_heads",
    "expand_pooled_kv",
    "convert_encoder_to_gqa",
    "sentence_embeddings",
    "spearman",
    "GQAConversionRow",
    "GQAConversionResult",
    "gqa_conversion_sweep",
]

# Sentences the course already reads (chapters 01, 03, 05, 06, 07, 11), then plain-English ones on a
# few topics; the last twelve are six paraphrase pairs (PARAPHRASE_PAIRS) for a retrieval check.
SENTENCES: tuple[str, ...] = (
    "I sat on the river bank.",
    "I opened a bank account.",
    "Thieves robbed the bank and took the cash.",
    "Yesterday the central bank raised interest rates.",
    "The chef added salt because the soup tasted bland.",
    "The animal didn't cross the street because it was too tired.",
    "The cat sat on the mat.",
    "She sat on the river bank and watched the boats.",
    "Attention is all you need.",
    "The train to the airport leaves every twenty minutes.",
    "Regular exercise lowers the risk of heart disease.",
    "The orchestra played a symphony by Beethoven.",
    # paraphrase pairs: (12, 13), (14, 15), ...
    "The doctor told him to get more sleep.",
    "His physician advised him to rest more at night.",
    "It rained heavily all afternoon in the city.",
    "There was a downpour in town for the whole afternoon.",
    "The company reported record profits this quarter.",
    "This quarter the firm earned more money than ever before.",
    "She plays the violin in a string quartet.",
    "She is a violinist in a quartet of string players.",
    "The goalkeeper saved the penalty in the last minute.",
    "In the final minute the keeper stopped the penalty kick.",
    "My laptop battery dies after two hours.",
    "The battery of my notebook computer runs out within two hours.",
)
PARAPHRASE_PAIRS: tuple[tuple[int, int], ...] = tuple((i, i + 1) for i in range(12, 24, 2))

# Every divisor of MiniLM's 12 heads: 12 is multi-head attention, 1 multi-query attention.
N_KV_HEADS: tuple[int, ...] = (12, 6, 4, 3, 2, 1)


def _check_n_kv_heads(n_kv_heads, n_heads: int) -> int:
    """n_kv_heads as an int, validated: a positive int (not a bool) dividing n_heads."""
    n_kv_heads = require_positive_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        divisors = [d for d in range(1, n_heads + 1) if n_heads % d == 0]
        raise ValueError(
            f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads} (each key/value head serves a group of "
            f"n_heads // n_kv_heads query heads); choose one of {divisors}"
        )
    return n_kv_heads


def pool_kv_heads(W: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Mean of each group's key (or value) heads: (..., H * Dh) -> (..., n_kv_heads * Dh).

    ``W`` is a projection in the maths' layout, heads along the last axis (``W_K`` (D, H*Dh) or a bias
    ``b_K`` (H*Dh,)): head h owns columns ``h*Dh:(h+1)*Dh``. Output head g is the mean of heads
    ``g*G .. (g+1)*G - 1``, G = n_heads // n_kv_heads, the pooling of
    :meth:`selfattn.gqa.GroupedQueryAttention.from_mha`. Same dtype and device as ``W``.

    Raises:
        TypeError: ``W`` not a tensor; ``n_heads`` or ``n_kv_heads`` not an int (a bool is refused).
        ValueError: ``n_kv_heads`` <= 0 or not dividing ``n_heads``; last dim not divisible by n_heads.

    Source: Ainslie et al. 2023, section 2.1; chapter 11.
    """
    require_tensor("W", W)
    n_heads = require_positive_int("n_heads", n_heads)
    n_kv_heads = _check_n_kv_heads(n_kv_heads, n_heads)
    if W.ndim == 0 or W.shape[-1] % n_heads:
        raise ValueError(f"W must have shape (..., n_heads * d_head) with n_heads={n_heads}; got shape {shape_of(W)}")
    lead, Dh, G = W.shape[:-1], W.shape[-1] // n_heads, n_heads // n_kv_heads
    grouped = W.reshape(*lead, n_kv_heads, G, Dh)  # (..., H*Dh) -> (..., Hkv, G, Dh): group g = heads gG..gG+G-1
    return grouped.mean(dim=-2).reshape(*lead, n_kv_heads * Dh)  # (..., Hkv, Dh) -> (..., Hkv*Dh)


def expand_pooled_kv(W: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Pool a key/value projection by group, then repeat each pooled head for its G query heads.

    (..., H * Dh) -> (..., H * Dh): head h of the result is pooled head ``h // G``, the order of
    :func:`selfattn.gqa.repeat_kv`. A multi-head layer with these weights computes what the
    grouped-query layer with the pooled weights computes. ``n_kv_heads == n_heads`` returns a copy
    equal to ``W`` (bit for bit).

    Raises: as :func:`pool_kv_heads`. Source: Ainslie et al. 2023, section 2.1; chapter 11.
    """
    pooled = pool_kv_heads(W, n_heads, n_kv_heads)  # (..., Hkv*Dh)
    lead, Dh, G = W.shape[:-1], W.shape[-1] // n_heads, n_heads // n_kv_heads
    heads = pooled.reshape(*lead, n_kv_heads, 1, Dh).expand(*lead, n_kv_heads, G, Dh)  # (..., Hkv, G, Dh)
    return heads.reshape(*lead, n_heads * Dh).clone()  # (..., H*Dh), head h = pooled head h // G


def convert_encoder_to_gqa(encoder: Encoder, n_kv_heads: int) -> Encoder:
    """A copy of ``encoder`` whose every attention layer is mean-pooled to ``n_kv_heads`` key/value heads.

    Each layer's ``W_K``, ``b_K``, ``W_V``, ``b_V`` become :func:`expand_pooled_kv` of themselves
    (weights and biases pooled alike); queries, outputs, layer norms and feed-forward networks are
    untouched. The copy has the dtype, device and mode of ``encoder``, and no gradient; ``encoder`` is
    not changed. Each layer computes what ``GroupedQueryAttention.from_mha(layer.attn, n_kv_heads)``
    computes (tested, float64, 1e-12); the cache it would need holds ``n_kv_heads`` heads per layer.

    Raises:
        TypeError: ``encoder`` not an :class:`~selfattn.encoder.Encoder`; ``n_kv_heads`` not an int.
        ValueError: ``n_kv_heads`` <= 0 or not dividing the encoder's n_heads.

    Source: Ainslie et al. 2023, section 2.1; chapter 11.
    """
    if not isinstance(encoder, Encoder):
        raise TypeError(f"encoder must be a selfattn.encoder.Encoder; got {type(encoder).__name__}")
    H = encoder.config.n_heads
    n_kv_heads = _check_n_kv_heads(n_kv_heads, H)
    GQAConfig(encoder.config.d_model, H, n_kv_heads, bias=True)  # the layer this stands for is a valid one
    converted = copy.deepcopy(encoder).requires_grad_(False)
    with torch.no_grad():
        for block in converted.blocks:
            attn = block.attn
            for name in ("W_K", "b_K", "W_V", "b_V"):
                param = getattr(attn, name)
                if param is not None:  # an encoder built without biases has none to pool
                    param.copy_(expand_pooled_kv(param, H, n_kv_heads))
    return converted


def sentence_embeddings(encoder: Encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """all-MiniLM-L6-v2's sentence embeddings from ``encoder``: masked mean of the last layer, L2-normalised.

    (B, T) int64 ids and (B, T) 0/1 attention mask -> (B, D) in the encoder's dtype, rows of unit
    length. The pooling of :meth:`selfattn.pretrained.MiniLM.sentence_embedding` (tested equal), for
    any encoder, so the original and the converted model are pooled the same way.

    Raises: as :meth:`selfattn.encoder.Encoder.forward`. Source: Reimers & Gurevych 2019; chapter 11.
    """
    with torch.no_grad():
        hidden = encoder(input_ids, attention_mask).last_hidden_state  # (B, T, D)
    real = attention_mask[..., None].to(hidden.dtype)  # (B, T) -> (B, T, 1)
    mean = (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)  # (B, D) / (B, 1)
    return torch.nn.functional.normalize(mean, p=2.0, dim=-1)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a 1-D array, ties given their average rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(a, b) -> float:
    """Spearman's rank correlation of two 1-D sequences of equal length n >= 2 (ties: average ranks).

    Raises:
        ValueError: different lengths, fewer than two values, a non-finite value, or a constant input.
    """
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"a and b must be 1-D of the same length >= 2; got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a and b must be finite (a NaN has no rank)")
    ra, rb = _ranks(a) - (a.size + 1) / 2, _ranks(b) - (b.size + 1) / 2
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    if denom == 0:
        raise ValueError("a constant input has no rank correlation")
    return float((ra * rb).sum() / denom)


def _nearest_other(embeddings: np.ndarray) -> np.ndarray:
    """Index of each row's most similar other row (cosine; rows are unit length)."""
    sims = embeddings @ embeddings.T  # (N, D) @ (D, N) -> (N, N)
    np.fill_diagonal(sims, -np.inf)
    return sims.argmax(axis=1)


@dataclass(frozen=True)
class GQAConversionRow:
    """One converted model of :func:`gqa_conversion_sweep`.

    Attributes:
        n_kv_heads: key/value heads per layer; group_size: query heads per key/value head.
        cosine_mean, cosine_min: cosine similarity of each sentence's converted embedding to its
            original one, mean and minimum over the sentences (1 = unchanged).
        rank_correlation: Spearman correlation between the original and the converted model's cosine
            similarities of every pair of distinct sentences (1 = the pairs are ranked the same).
        top1_agreement: fraction of sentences whose most similar other sentence is the same as in the
            original model.
        paraphrase_top1: fraction of the paraphrase-pair sentences whose most similar other sentence is
            its paraphrase.
        kv_cache_bytes_per_token: 2 x n_layers x n_kv_heads x d_head x bytes per number.
        cache_saving: n_heads / n_kv_heads, the factor by which the cache shrinks.
    """

    n_kv_heads: int
    group_size: int
    cosine_mean: float
    cosine_min: float
    rank_correlation: float
    top1_agreement: float
    paraphrase_top1: float
    kv_cache_bytes_per_token: int
    cache_saving: float


@dataclass(frozen=True)
class GQAConversionResult:
    """What :func:`gqa_conversion_sweep` measured: one :class:`GQAConversionRow` per ``n_kv_heads``.

    Attributes:
        rows: in the order asked for (default 12, 6, 4, 3, 2, 1).
        sentences: the sentences embedded; paraphrase_pairs: index pairs into them.
        n_layers, n_heads, d_head: the model's sizes (6, 12, 32 for MiniLM).
        bytes_per_number: of the cache (4 for float32); dtype: of the sweep's computation.
        original_paraphrase_top1: the original model's paraphrase retrieval, for comparison.
    """

    rows: tuple[GQAConversionRow, ...]
    sentences: tuple[str, ...]
    paraphrase_pairs: tuple[tuple[int, int], ...]
    n_layers: int
    n_heads: int
    d_head: int
    bytes_per_number: int
    dtype: torch.dtype
    original_paraphrase_top1: float

    def row(self, n_kv_heads: int) -> GQAConversionRow:
        """The row of ``n_kv_heads``. Raises KeyError if it was not measured."""
        for r in self.rows:
            if r.n_kv_heads == n_kv_heads:
                return r
        raise KeyError(f"n_kv_heads={n_kv_heads!r} was not measured; measured {[r.n_kv_heads for r in self.rows]}")

    def table(self) -> str:
        """The rows as a plain-text table (what the chapter prints)."""
        head = (f"{'n_kv_heads':>10} {'group':>5} {'cos mean':>9} {'cos min':>8} {'spearman':>8} "
                f"{'top-1 agr':>9} {'para top-1':>10} {'KV B/token':>10} {'saving':>6}")
        lines = [head]
        for r in self.rows:
            lines.append(f"{r.n_kv_heads:>10} {r.group_size:>5} {r.cosine_mean:>9.4f} {r.cosine_min:>8.4f} "
                         f"{r.rank_correlation:>8.4f} {r.top1_agreement:>9.3f} {r.paraphrase_top1:>10.3f} "
                         f"{r.kv_cache_bytes_per_token:>10} {r.cache_saving:>5.0f}x")
        return "\n".join(lines)


def gqa_conversion_sweep(minilm=None, n_kv_heads=N_KV_HEADS, sentences=SENTENCES,
                         paraphrase_pairs=PARAPHRASE_PAIRS, *, dtype: torch.dtype = torch.float32,
                         bytes_per_number: int = 4) -> GQAConversionResult:
    """Convert the real MiniLM to each ``n_kv_heads`` by mean pooling, and measure its sentence embeddings.

    For every ``n_kv_heads``: :func:`convert_encoder_to_gqa` of MiniLM's encoder (no retraining), the
    sentence embeddings of ``sentences`` (:func:`sentence_embeddings`, each sentence cut to
    MiniLM's ``max_seq_length`` as sentence-transformers does), compared with the original model's:
    per-sentence cosine, rank correlation of all pairwise similarities, nearest-neighbour agreement
    and paraphrase retrieval; and the KV cache bytes per token the converted model would need.

    Args:
        minilm: a :class:`selfattn.pretrained.MiniLM`; default :func:`~selfattn.pretrained.load_minilm`.
        n_kv_heads: the key/value head counts to measure, each dividing 12.
        sentences: at least three strings. paraphrase_pairs: index pairs (i, j) of paraphrases.
        dtype: of the computation (float32 for the chapter; float64 for exactness checks).
        bytes_per_number: of the cache entries, for the bytes per token (4 = float32, 2 = float16).

    Returns:
        A :class:`GQAConversionResult`. Deterministic (no sampling); about 1-2 s on 2 CPU cores.

    Raises:
        TypeError / ValueError: a bad ``n_kv_heads`` (not an int, a bool, <= 0, not dividing 12, or an
        empty list); fewer than three sentences; a pair index out of range.

    Source: Ainslie et al. 2023, section 2.1 (mean pooling, before uptraining); chapter 11.
    """
    from ..pretrained import load_minilm

    minilm = load_minilm() if minilm is None else minilm
    c = minilm.config
    if isinstance(n_kv_heads, (int, np.integer)):
        n_kv_heads = (n_kv_heads,)
    counts = tuple(_check_n_kv_heads(n, c.n_heads) for n in n_kv_heads)
    if not counts:
        raise ValueError("n_kv_heads must list at least one key/value head count")
    sentences = tuple(sentences)
    if len(sentences) < 3 or not all(isinstance(s, str) for s in sentences):
        raise ValueError(f"sentences must be at least three strings; got {len(sentences)} items")
    pairs = tuple((int(i), int(j)) for i, j in paraphrase_pairs)
    if any(not (0 <= i < len(sentences) and 0 <= j < len(sentences)) or i == j for i, j in pairs):
        raise ValueError(f"paraphrase_pairs must hold pairs of distinct indices into the {len(sentences)} sentences")

    batch = minilm.tokenize(list(sentences), minilm.max_seq_length)
    original_encoder = copy.deepcopy(minilm.encoder()).to(dtype)  # the cached encoder stays float32
    original = sentence_embeddings(original_encoder, batch.input_ids, batch.attention_mask).double().numpy()
    iu = np.triu_indices(len(sentences), k=1)  # every pair of distinct sentences once
    original_pairs = (original @ original.T)[iu]
    original_nearest = _nearest_other(original)
    partner = {i: j for i, j in pairs} | {j: i for i, j in pairs}

    def paraphrase_top1(nearest: np.ndarray) -> float:
        return float(np.mean([nearest[i] == j for i, j in partner.items()])) if partner else float("nan")

    rows = []
    for n in counts:
        emb = sentence_embeddings(convert_encoder_to_gqa(original_encoder, n), batch.input_ids,
                                  batch.attention_mask).double().numpy()  # (N, D)
        if not np.isfinite(emb).all():
            raise FloatingPointError(f"n_kv_heads={n}: the converted model produced a non-finite embedding")
        cosines = np.einsum("nd,nd->n", emb, original)  # (N,): rows are unit length
        nearest = _nearest_other(emb)
        rows.append(GQAConversionRow(
            n_kv_heads=n, group_size=c.n_heads // n,
            cosine_mean=float(cosines.mean()), cosine_min=float(cosines.min()),
            rank_correlation=spearman(original_pairs, (emb @ emb.T)[iu]),
            top1_agreement=float(np.mean(nearest == original_nearest)),
            paraphrase_top1=paraphrase_top1(nearest),
            kv_cache_bytes_per_token=kv_cache_bytes_per_token(c.n_layers, n, c.d_head, bytes_per_number),
            cache_saving=c.n_heads / n,
        ))  # fmt: skip
    return GQAConversionResult(
        rows=tuple(rows), sentences=sentences, paraphrase_pairs=pairs, n_layers=c.n_layers, n_heads=c.n_heads,
        d_head=c.d_head, bytes_per_number=bytes_per_number, dtype=dtype,
        original_paraphrase_top1=paraphrase_top1(original_nearest),
    )  # fmt: skip

