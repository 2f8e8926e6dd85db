"""selfattn: self-attention from first principles, the package behind the course.

``selfattn.ref`` is the NumPy float64 reference; the top level is the torch path that the chapters
use and that runs on a GPU when one is present (``selfattn.device.pick_device``).
"""

from ._workarounds import initialise_mkl_vml

# First, before any computation: MKL's vector maths picks its CPU kernels without a lock, and a
# thread that races the first call can compute with its low-accuracy kernels (selfattn._workarounds).
initialise_mkl_vml()

from . import device, efficient, masks, ref  # noqa: E402
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
