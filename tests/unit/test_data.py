"""selfattn.data: the offline corpus, its licence, the character tokenizer and the window sampler."""

from __future__ import annotations

import pytest
import torch

from selfattn.data import CORPUS_INFO, CharTokenizer, load_corpus, random_windows


def test_corpus_is_real_prose_from_the_stdlib_with_a_licence():
    from pydoc_data.topics import topics  # the source: shipped with CPython

    text = load_corpus()
    assert 100_000 < len(text) < 1_000_000
    # Every paragraph of the corpus is a piece of the installed Python documentation.
    first = text.split("\n")[1]
    assert first.split(" ")[0] in topics["assert"]
    assert "conditional execution" in text
    assert "PSF License" in CORPUS_INFO.licence
    assert "pydoc_data" in CORPUS_INFO.source


def test_corpus_is_printable_ascii_and_has_no_code_blocks():
    text = load_corpus()
    assert all(ch == "\n" or " " <= ch <= "~" for ch in text)
    assert not any(line.startswith(" ") for line in text.split("\n"))
    assert "******" not in text and "=====" not in text


def test_corpus_is_deterministic():
    assert load_corpus() == load_corpus()


def test_tokenizer_round_trip_and_sorted_vocabulary():
    tok = CharTokenizer("hello world")
    assert tok.chars == " dehlorw"
    assert tok.vocab_size == 8
    ids = tok.encode("world hello")
    assert ids.dtype == torch.int64 and ids.shape == (11,)
    assert tok.decode(ids) == "world hello"
    assert ids.tolist()[:3] == [tok.chars.index("w"), tok.chars.index("o"), tok.chars.index("r")]


def test_tokenizer_on_the_corpus_is_small():
    tok = CharTokenizer(load_corpus())
    assert 60 <= tok.vocab_size <= 96


def test_tokenizer_errors_name_the_problem():
    with pytest.raises(TypeError, match="text must be a str"):
        CharTokenizer(b"bytes")
    with pytest.raises(ValueError, match="must not be empty"):
        CharTokenizer("")
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.encode("abz")
    with pytest.raises(ValueError, match=r"\[0, vocab_size=3\)"):
        tok.decode([0, 3])


def test_random_windows_targets_are_inputs_shifted_by_one():
    ids = torch.arange(100)
    gen = torch.Generator().manual_seed(0)
    inputs, targets = random_windows(ids, 5, 8, gen)
    assert inputs.shape == targets.shape == (5, 8)
    torch.testing.assert_close(targets, inputs + 1, rtol=0, atol=0)
    torch.testing.assert_close(
        inputs[:, 1:], inputs[:, :-1] + 1, rtol=0, atol=0
    )  # contiguous windows
    assert int(targets.max()) <= 99


def test_random_windows_is_reproducible_with_a_seed():
    ids = torch.arange(1000)
    a = random_windows(ids, 4, 16, torch.Generator().manual_seed(3))
    b = random_windows(ids, 4, 16, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)


def test_random_windows_rejects_bad_input():
    with pytest.raises(ValueError, match=r"more than block_size=8"):
        random_windows(torch.arange(8), 2, 8)
    with pytest.raises(ValueError, match="ids"):
        random_windows(torch.zeros(3, 4, dtype=torch.int64), 2, 2)
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        random_windows(torch.arange(100), 0, 8)
