"""``selfattn.ref``: the NumPy float64 reference, one plain function per equation in the text.

It is the oracle that the torch path is tested against and shares no code with it. Add a topic as
its own submodule and re-export its public names here.
"""

from . import positions
from .attention import causal_mask, scaled_dot_product_attention, softmax
from .block import feed_forward, gelu, layer_norm, post_norm_block, pre_norm_block
from .modern import modern_block, rms_norm, silu, swiglu
from .multihead import multi_head_attention
from .online import logsumexp, online_attention, online_softmax
from .positions import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    ntk_scaled_base,
    rope_frequencies,
    rope_interleaved_to_half,
    rope_rotation_matrix,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)

__all__ = [
    "softmax",
    "causal_mask",
    "scaled_dot_product_attention",
    "multi_head_attention",
    "layer_norm",
    "gelu",
    "feed_forward",
    "post_norm_block",
    "pre_norm_block",
    "rms_norm",
    "silu",
    "swiglu",
    "modern_block",
    "online_softmax",
    "online_attention",
    "logsumexp",
    "positions",
    "sinusoidal_encoding",
    "sinusoidal_shift_matrix",
    "rope_frequencies",
    "rope_rotation_matrix",
    "apply_rope",
    "rope_interleaved_to_half",
    "ntk_scaled_base",
    "alibi_slopes",
    "alibi_bias",
]
