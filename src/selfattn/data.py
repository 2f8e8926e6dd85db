"""A real, offline text corpus and a character-level tokenizer for the small next-token models.

The corpus is the prose of the Python Language Reference as it ships with every CPython
installation, in the standard-library module ``pydoc_data.topics`` (the text ``help("if")``
prints). Nobody on this project wrote it, it needs no download and no extra package, and its
licence is the PSF License Agreement (see :data:`CORPUS_INFO`). Only the prose paragraphs are
kept: indented code and grammar blocks, tables and heading underlines are dropped, the lines of a
paragraph are joined, and the few non-ASCII characters are mapped to ASCII (curly quotes to
straight ones) or dropped, so the vocabulary is small (about 90 characters).

Introduced in chapter 04 (training the same model with and without the causal mask).
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from functools import lru_cache

import torch

from ._validate import require_positive_int, require_rank, require_tensor, shape_of

__all__ = ["CorpusInfo", "CORPUS_INFO", "load_corpus", "CharTokenizer", "random_windows"]


@dataclass(frozen=True)
class CorpusInfo:
    """Where the corpus comes from and under which terms.

    Attributes:
        name: a short title. source: how to find it on any machine. licence: its licence.
        url: where the licence and the original text can be read online.
    """

    name: str
    source: str
    licence: str
    url: str


CORPUS_INFO = CorpusInfo(
    name=f"The Python Language Reference, prose of the help() topics (Python {platform.python_version()})",
    source="the standard-library module pydoc_data.topics, shipped with every CPython installation",
    licence="PSF License Agreement; Copyright (c) 2001 Python Software Foundation, all rights reserved",
    url="https://docs.python.org/3/license.html",
)

# Typographic characters of the docs mapped to ASCII; any other non-ASCII character is dropped.
_ASCII = str.maketrans(
    {
        "\u201c": '"',
        "\u201d": '"',
        "\u2018": "'",
        "\u2019": "'",
        "\u2013": "-",
        "\u2014": "-",
        "\u2026": "...",
    }
)
_UNDERLINE = re.compile(r"^[*=\-~^\"#+]{3,}$")


def _prose_paragraphs(topic: str) -> list[str]:
    """The unindented paragraphs of one help topic, each joined into one line (no tables)."""
    paragraphs, current = [], []
    for line in topic.split("\n"):
        text = line.strip()
        prose = bool(text) and not line.startswith((" ", "+", "|")) and not _UNDERLINE.match(text)
        if prose:
            current.append(text)
        elif current:  # a blank, indented or underline line ends the paragraph
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


@lru_cache(maxsize=1)
def load_corpus() -> str:
    """The corpus as one string: prose paragraphs separated by newlines (about 260,000 characters).

    Deterministic for a given Python version (the text is the installed ``pydoc_data.topics``);
    topics are taken in sorted order of their names. Printable ASCII and ``"\\n"`` only.

    Returns:
        ``str``. Its origin and licence are in :data:`CORPUS_INFO`.

    Raises:
        RuntimeError: the Python installation lacks ``pydoc_data`` (some minimal distributions
        strip it), with the way out in the message.

    Source: chapter 04.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # pragma: no cover - only on stripped-down Pythons
        raise RuntimeError(
            "the corpus is Python's own pydoc_data.topics, missing from this Python installation; "
            "install the full standard library (e.g. Debian's libpython3-stdlib)"
        ) from err
    paragraphs = [p for name in sorted(topics) for p in _prose_paragraphs(topics[name])]
    text = "\n".join(paragraphs).translate(_ASCII)
    return "".join(ch for ch in text if ch == "\n" or " " <= ch <= "~")


class CharTokenizer:
    """Character-level tokenizer: one id per distinct character of a text, in sorted order.

    Args:
        text: the text whose characters form the vocabulary (non-empty ``str``).

    Attributes:
        chars: the vocabulary, a sorted string of distinct characters; ``vocab_size`` = its length.

    Raises:
        TypeError: ``text`` not a string. ValueError: empty ``text``.

    Source: chapter 04.
    """

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        if not text:
            raise ValueError("text must not be empty: the vocabulary is made of its characters")
        self.chars = "".join(sorted(set(text)))
        self._index = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> 1-D int64 tensor of ids, shape (len(text),).

        Raises:
            TypeError: not a string. ValueError: a character outside the vocabulary (named).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        unknown = sorted(set(text) - self._index.keys())
        if unknown:
            raise ValueError(f"text holds characters outside the vocabulary: {unknown[:10]!r}{self._vocabulary_hint()}")
        return torch.tensor([self._index[ch] for ch in text], dtype=torch.int64)

    def _vocabulary_hint(self) -> str:
        return ""  # a vocabulary taken from a text can be long; a subclass with a short one names it

    def decode(self, ids) -> str:
        """1-D ids (tensor or sequence of ints in [0, vocab_size)) -> the string.

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        ids = torch.as_tensor(ids).reshape(-1).tolist()
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids must be in [0, vocab_size={self.vocab_size}); got {bad[:10]}")
        return "".join(self.chars[i] for i in ids)


def random_windows(
    ids: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random windows for next-token training: inputs and the inputs shifted by one.

    ``targets[b, t] = ids[start_b + t + 1]``: the token that follows ``inputs[b, t]``.

    Args:
        ids: 1-D int64 tensor of token ids, longer than ``block_size``.
        batch_size: B (> 0). block_size: T (> 0).
        generator: a ``torch.Generator`` for reproducible starts.

    Returns:
        ``(inputs, targets)``, each (B, T) int64.

    Raises:
        TypeError / ValueError: ``ids`` not a 1-D tensor with more than ``block_size`` entries;
        sizes not positive ints.

    Source: chapter 04.
    """
    require_tensor("ids", ids)
    require_rank("ids", ids, 1, "(N,)")
    B = require_positive_int("batch_size", batch_size)
    T = require_positive_int("block_size", block_size)
    if ids.numel() <= T:
        raise ValueError(
            f"ids must hold more than block_size={T} tokens; got shape {shape_of(ids)}"
        )
    starts = torch.randint(0, ids.numel() - T, (B,), generator=generator)  # (B,)
    offsets = torch.arange(T)  # (T,)
    positions = starts[:, None] + offsets[None, :]  # (B, 1) + (1, T) -> (B, T)
    return ids[positions], ids[positions + 1]
