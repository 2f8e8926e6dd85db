"""Attention in today's open models (chapter 11b): multi-head latent attention (DeepSeek-V2/V3),
trained sparse selection (DeepSeek-V3.2's lightning indexer) and local/global stacks (Gemma 3,
Longformer's global tokens).

Modules: :mod:`.mla`, :mod:`.sparse`, :mod:`.local_global`.
"""

from . import local_global, mla, sparse

__all__ = ["mla", "sparse", "local_global"]
