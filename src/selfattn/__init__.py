"""selfattn: self-attention from first principles, the package behind the course.

``selfattn.ref`` is the NumPy float64 reference; the top level is the torch path that the chapters
use and that runs on a GPU when one is present (``selfattn.device.pick_device``).
"""

from . import device, efficient, masks, ref
from .attention import AttentionConfig, SelfAttention, masked_softmax, scaled_dot_product_attention
from .block import BlockConfig, FeedForward, PostNormTransformerBlock, TransformerBlock
from .masks import causal_mask, from_blocked_mask, from_hf_attention_mask, padding_mask
from .multihead import MHAConfig, MultiHeadAttention, merge_heads, split_heads

__version__ = "0.1.0"

__all__ = [
    "ref",
    "device",
    "efficient",
    "masks",
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
