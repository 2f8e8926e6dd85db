"""selfattn: self-attention from first principles, the package behind the course.

``selfattn.ref`` is the NumPy float64 reference; the top level is the torch path that the chapters
use and that runs on a GPU when one is present (``selfattn.device.pick_device``).

Where each chapter's code lives:

==========================================  ==========================================================
chapter                                     modules
==========================================  ==========================================================
01 tokens and embeddings                    ``embeddings``, ``pretrained``, ``experiments.context``
02 similarity and softmax                   ``attention`` (``masked_softmax``), ``ref``, ``ref.attention``,
                                           ``experiments.scaling``, ``experiments.tying`` (its recall task)
03 queries, keys and values                 ``attention`` (``scaled_dot_product_attention``),
                                           ``experiments.tying``
04 causal masking                           ``masks``, ``models.tiny_lm``, ``data``
05 cross-attention and padding              ``masks``, ``attention``, ``models.seq2seq``
06 multi-head attention                     ``multihead``, ``pretrained``, ``experiments.two_lookups``
07 the Transformer block                    ``block``, ``encoder``, ``ref.block``,
                                           ``modern``, ``ref.modern``, ``experiments.qk_norm``,
                                           ``models.gpt`` (the GPT, assembled and checked)
08 positions                                ``positions``, ``ref.positions``, ``experiments.positions``
09 parallel and quadratic                   ``efficient.variants``, ``efficient.memory``, ``experiments``,
                                           ``efficient.depth``, ``models.rnn``, ``efficient.experiments``
10 FlashAttention                           ``efficient.tiled``, ``efficient.triton_kernel``, ``ref.online``,
                                           ``efficient.io_model``, ``efficient.head_groups``,
                                           ``inference.split_kv.merge_partials``, ``inference.split_kv.Partial``,
                                           ``efficient.kv_cache`` (the KV cache)
11 inference                                ``inference`` (``costs``, ``paged``, ``split_kv``, ``streaming``,
                                           ``convert``, ``decode_timing``), ``gqa``, ``sampling``
11b attention in today's open models        ``open_models`` (``mla``, ``sparse``, ``local_global``)
11c sinks and quantized caches              ``sinks``, ``experiments.sinks``, ``inference.quant_cache``
12 attention across devices                 ``distributed`` (``ring``, ``ulysses``, ``layout``, ``launch``)
13 attention explanations                   ``interpret``
14 capstone GPT                             ``models.gpt`` (trained), ``checkpoint``,
                                           ``experiments.induction``, ``live`` (the model in the page)
15 from attention to causes                 ``hooks``, ``circuits``, ``experiments.induction``
                                           (``final_norm=True``), ``viz.circuits``,
                                           ``live`` (the induction heads in the page)
==========================================  ==========================================================

Every chapter also has ``viz.<topic>`` (figures and explorers) and ``exercises.chNN`` (the checks);
``device`` and ``data`` serve every chapter. No chapter's code uses a module of a later row
(tests/unit/test_chapter_order.py reads this table).
"""

from ._workarounds import initialise_mkl_vml

# First, before any computation: MKL's vector maths picks its CPU kernels without a lock, and a
# thread that races the first call can compute with its low-accuracy kernels (selfattn._workarounds).
initialise_mkl_vml()

from . import device, efficient, masks, positions, ref  # noqa: E402
from .attention import AttentionConfig, SelfAttention, masked_softmax, scaled_dot_product_attention  # noqa: E402
from .block import BlockConfig, FeedForward, PostNormTransformerBlock, TransformerBlock  # noqa: E402
from .masks import causal_mask, from_blocked_mask, from_hf_attention_mask, padding_mask  # noqa: E402
from .multihead import MHAConfig, MultiHeadAttention, merge_heads, split_heads  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ref",
    "device",
    "efficient",
    "masks",
    "positions",
    "scaled_dot_product_attention",
    "masked_softmax",
    "AttentionConfig",
    "SelfAttention",
    "causal_mask",
    "padding_mask",
    "from_blocked_mask",
    "from_hf_attention_mask",
    "MHAConfig",
    "MultiHeadAttention",
    "split_heads",
    "merge_heads",
    "BlockConfig",
    "FeedForward",
    "TransformerBlock",
    "PostNormTransformerBlock",
]
