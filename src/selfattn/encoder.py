"""A BERT-style encoder: input embeddings, then a stack of post-norm Transformer blocks.

With the weights of all-MiniLM-L6-v2 loaded (``selfattn.pretrained.MiniLM.encoder``), it reproduces
the real model layer by layer (tests/parity/test_parity_minilm.py). Introduced in chapter 07.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._validate import (
    require_flag,
    require_positive_int,
    require_probability,
    require_rank,
    require_tensor,
    shape_of,
)
from .block import BlockConfig, PostNormTransformerBlock
from .embeddings import BertEmbeddings
from .masks import from_hf_attention_mask

__all__ = ["EncoderConfig", "EncoderOutput", "Encoder", "hf_bert_state_dict"]


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of a BERT-style encoder, validated at construction.

    Attributes:
        vocab_size: V. d_model: D (divisible by n_heads). n_layers: number of blocks.
        n_heads: H. d_ff: F. max_positions: longest input. type_vocab_size: segments (2).
        layer_norm_eps: epsilon of every layer norm (BERT: 1e-12). dropout: in [0, 1).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "n_layers", "max_positions", "type_vocab_size"):
            require_positive_int(name, getattr(self, name))
        require_probability("dropout", self.dropout)
        # Building the blocks' config validates d_model, n_heads, d_ff and layer_norm_eps.
        BlockConfig(self.d_model, self.n_heads, self.d_ff, self.dropout, self.layer_norm_eps)

    @property
    def block_config(self) -> BlockConfig:
        return BlockConfig(self.d_model, self.n_heads, self.d_ff, self.dropout, self.layer_norm_eps)


@dataclass(frozen=True)
class EncoderOutput:
    """What :class:`Encoder` returns.

    Attributes:
        hidden_states: n_layers + 1 tensors (B, T, D): the embeddings' output, then each block's.
        weights: n_layers tensors (B, H, T, T) of attention weights, or None if not requested.
    """

    hidden_states: tuple[torch.Tensor, ...]
    weights: tuple[torch.Tensor, ...] | None

    @property
    def last_hidden_state(self) -> torch.Tensor:
        """The last block's output (B, T, D)."""
        return self.hidden_states[-1]


class Encoder(nn.Module):
    """``BertEmbeddings`` followed by ``n_layers`` :class:`~selfattn.block.PostNormTransformerBlock`.

    Args:
        config: an :class:`EncoderConfig`.

    Shapes:
        forward(input_ids (B, T) int64, attention_mask (B, T) of 0/1 (Hugging Face convention,
        1 = real token) or None) -> :class:`EncoderOutput`.

    Raises:
        TypeError / ValueError: ids or attention_mask of the wrong type, rank or shape; ids with
        no position (T = 0); ``output_weights`` not a bool.

    Source: Devlin et al. 2019 (BERT); chapter 07.
    """

    def __init__(self, config: EncoderConfig):
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config must be an EncoderConfig; got {type(config).__name__}")
        self.config = config
        c = config
        self.embeddings = BertEmbeddings(
            c.vocab_size, c.d_model, c.max_positions, c.type_vocab_size, c.layer_norm_eps, c.dropout
        )
        self.blocks = nn.ModuleList(
            PostNormTransformerBlock(c.block_config) for _ in range(c.n_layers)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_weights: bool = False,
        *,
        token_type_ids: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Run the encoder; padding keys (attention_mask 0) are masked in every layer.

        Padding positions still get hidden states (they attend to the real tokens); read only the
        real positions.
        """
        output_weights = require_flag("output_weights", output_weights)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T) -> (B, T, D); validates the ids
        if input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must hold at least one token (T > 0) in (B, T); got shape {shape_of(input_ids)}")
        mask = None
        if attention_mask is not None:
            require_tensor("attention_mask", attention_mask)
            require_rank("attention_mask", attention_mask, 2, "(B, T)")
            if attention_mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask must have the shape of input_ids {shape_of(input_ids)}; "
                    f"got {shape_of(attention_mask)}"
                )
            mask = from_hf_attention_mask(attention_mask)  # (B, T) -> (B, 1, 1, T): keys only
        hidden_states, weights = [x], []
        for block in self.blocks:
            x, w = block(x, mask, return_weights=True)  # (B, T, D), (B, H, T, T)
            hidden_states.append(x)
            weights.append(w)
        return EncoderOutput(tuple(hidden_states), tuple(weights) if output_weights else None)


def hf_bert_state_dict(
    hf: dict[str, torch.Tensor], n_layers: int
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Map a Hugging Face ``BertModel`` state dict onto :class:`Encoder`'s parameter names.

    ``nn.Linear`` weights (out, in) become our (in, out) ``W_Q``, ``W_K``, ``W_V``, ``W_O`` by a
    transpose; ``ffn.linear1/linear2`` are ``nn.Linear`` too and are copied as they are.

    Args:
        hf: ``{name: tensor}`` with BERT's names (``embeddings.word_embeddings.weight``,
            ``encoder.layer.{i}.attention.self.query.weight``, ...).
        n_layers: number of layers to map.

    Returns:
        ``(state_dict, unused)``: the mapped tensors, and the names in ``hf`` that were not used.

    Raises:
        KeyError: a name the encoder needs is missing from ``hf``.

    Source: chapter 07.
    """
    require_positive_int("n_layers", n_layers)
    used: set[str] = set()

    def take(name: str, transpose: bool = False) -> torch.Tensor:
        if name not in hf:
            raise KeyError(f"the checkpoint has no tensor {name!r} (needed by the encoder)")
        used.add(name)
        return hf[name].T.contiguous() if transpose else hf[name]

    out = {
        "embeddings.token.weight": take("embeddings.word_embeddings.weight"),
        "embeddings.position.weight": take("embeddings.position_embeddings.weight"),
        "embeddings.token_type.weight": take("embeddings.token_type_embeddings.weight"),
        "embeddings.layer_norm.weight": take("embeddings.LayerNorm.weight"),
        "embeddings.layer_norm.bias": take("embeddings.LayerNorm.bias"),
    }
    for i in range(n_layers):
        src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            out[f"{dst}attn.W_{ours}"] = take(
                f"{src}attention.self.{theirs}.weight", transpose=True
            )
            out[f"{dst}attn.b_{ours}"] = take(f"{src}attention.self.{theirs}.bias")
        out[f"{dst}attn.W_O"] = take(f"{src}attention.output.dense.weight", transpose=True)
        out[f"{dst}attn.b_O"] = take(f"{src}attention.output.dense.bias")
        pairs = (
            ("ln1", "attention.output.LayerNorm"),
            ("ffn.linear1", "intermediate.dense"),
            ("ffn.linear2", "output.dense"),
            ("ln2", "output.LayerNorm"),
        )
        for ours, theirs in pairs:
            out[f"{dst}{ours}.weight"] = take(f"{src}{theirs}.weight")
            out[f"{dst}{ours}.bias"] = take(f"{src}{theirs}.bias")
    return out, set(hf) - used
