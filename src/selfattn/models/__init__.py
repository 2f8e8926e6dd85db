"""Small models built from the package's own pieces, trained in the chapters.

``tiny_lm``: a character-level next-token model (token and learned position embeddings, pre-norm
Transformer blocks, a linear read-out), trained with and without the causal mask in chapter 04.
``gpt``: the capstone decoder (chapter 14): causal by construction, with a position scheme from
:mod:`selfattn.positions` (RoPE by default; chapter 08 compares them), a KV-cached generation path,
a training loop with validation.
``rnn``: an Elman recurrent network with its loop over time written out, beside attention in
chapter 09 (claim 15).
``seq2seq``: a tiny encoder-decoder (causal self-attention and cross-attention in the decoder) trained
to reverse digit strings in chapter 05, where its cross-attention learns to read the source.
"""

from .gpt import GPT, GPTConfig, TrainingLog, evaluate_loss, train_lm, unigram_cross_entropy
from .rnn import ElmanRNN
from .seq2seq import DecoderBlock, Seq2Seq, Seq2SeqConfig, train_reversal
from .tiny_lm import TinyLM, TinyLMConfig, blind_next_token_loss, next_token_loss, train_next_token

__all__ = [
    "TinyLMConfig",
    "TinyLM",
    "next_token_loss",
    "blind_next_token_loss",
    "train_next_token",
    "GPTConfig",
    "GPT",
    "TrainingLog",
    "train_lm",
    "evaluate_loss",
    "unigram_cross_entropy",
    "ElmanRNN",
    "Seq2SeqConfig",
    "Seq2Seq",
    "DecoderBlock",
    "train_reversal",
]
