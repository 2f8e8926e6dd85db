"""No main-line paragraph longer than 120 words, and no lab notes in the main line of chapters 09-14
(issue 26, item 2).

The parser (tests/book/paragraphs.py) is a pure function, tested here on small HTML strings first:
the rule fails on a 130-word paragraph and on a paragraph that speaks of a load average, and leaves
collapsed boxes, admonitions, code and printed outputs alone. Then it runs on every built chapter.
"""

from __future__ import annotations

import pytest

from .browser_support import chapter_pages
from .paragraphs import (
    MAX_WORDS,
    lab_note_words,
    main_line_paragraphs,
    offending_paragraphs,
    word_count,
)


def _words(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


def _page(body: str) -> str:
    return f"<html><body><nav><p>{_words(200)}</p></nav><article>{body}</article></body></html>"


def test_a_130_word_main_line_paragraph_fails():
    html = _page(f"<section><p>{_words(130)}</p><p>{_words(120)}</p></section>")
    found = offending_paragraphs(html, lab_notes=False)
    assert len(found) == 1 and found[0].startswith("130 words"), found  # 120 words is the limit, allowed


def test_generated_markdown_output_is_main_line():
    # a cell's generated Markdown is parsed as MyST and lands in div.cell_output without the output class
    html = _page(f'<div class="cell_output docutils container"><p>{_words(MAX_WORDS + 1)}</p></div>')
    assert word_count(main_line_paragraphs(html)[0]) == MAX_WORDS + 1
    assert len(offending_paragraphs(html, lab_notes=False)) == 1


@pytest.mark.parametrize("box", [
    '<details class="selfattn-labnotes"><summary>Lab notes</summary><p>{}</p></details>',
    '<div class="admonition tip"><p class="admonition-title">Verified facts</p><p>{}</p></div>',
    '<div class="cell_output docutils container"><div class="output stream"><pre>{}</pre><p>{}</p></div></div>',
    '<div class="cell docutils container"><div class="cell_input docutils container"><p>{}</p></div></div>',
])
def test_boxes_code_and_printed_outputs_are_not_main_line(box):
    html = _page(box.replace("{}", _words(300) + " the load average was 2.1"))
    assert main_line_paragraphs(html) == []
    assert offending_paragraphs(html, lab_notes=True) == []


def test_nested_markup_inside_a_paragraph_counts_and_maths_does_not():
    html = _page('<p>The <em>tiled</em> loop, <code>tiled_attention</code>, moves '
                 '<span class="math notranslate nohighlight">\\(T^2 d^2 / M\\)</span> numbers.</p>')
    assert main_line_paragraphs(html) == ["The tiled loop, tiled_attention, moves numbers."]
    assert word_count("The tiled loop, tiled_attention, moves numbers.") == 6


@pytest.mark.parametrize("sentence, expected", [
    ("with a load average of 1.2 on the machine", ["load average"]),
    ("the spread between repeats was 40%", ["spread between repeats"]),
    ("a stopwatch around each operation", ["stopwatch"]),
    ("MKL's threads race on the buffer", ["MKL's threads race"]),
    ("decode is limited by memory traffic", []),
])
def test_lab_note_words(sentence, expected):
    assert lab_note_words(sentence) == expected


def test_lab_note_words_fail_only_in_chapters_09_to_14():
    html = _page("<p>The runs were interleaved, and the load average was 3.</p>")
    assert offending_paragraphs(html, lab_notes=False) == []
    assert len(offending_paragraphs(html, lab_notes=True)) == 1


def test_not_a_string():
    with pytest.raises(TypeError, match="html must be a str"):
        main_line_paragraphs(b"<p>bytes</p>")


@pytest.mark.parametrize("page", chapter_pages())
def test_built_chapter_main_line(built_html, page):
    number = int(page.split("/")[-1][:2])
    found = offending_paragraphs((built_html / f"{page}.html").read_text(), lab_notes=9 <= number <= 14)
    assert not found, f"{page}: main-line paragraphs over {MAX_WORDS} words or with lab notes:\n" + "\n".join(found)
