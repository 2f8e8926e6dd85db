"""Small models built from the package's own pieces, trained in the chapters.

``tiny_lm``: a character-level next-token model (token and position embeddings, pre-norm
Transformer blocks, a linear read-out), trained with and without the causal mask in chapter 04.
"""

from .tiny_lm import TinyLM, TinyLMConfig, blind_next_token_loss, next_token_loss, train_next_token

__all__ = ["TinyLMConfig", "TinyLM", "next_token_loss", "blind_next_token_loss", "train_next_token"]
