"""Main-line paragraphs of a built chapter page, and the lab-note words they must not use (issue 26, item 2).

A *main-line* paragraph is a ``<p>`` of the page's article that is not inside a collapsed box
(``<details>``: the course's hints and "Lab notes" boxes, sphinx-design dropdowns), an admonition
(``div.admonition``: the "Verified facts" boxes), a code cell's input, or a non-Markdown cell output
(``div.output``: printed streams, figures and widgets). Markdown that a cell *generates* is parsed
as MyST and lands in ``div.cell_output`` without an ``output`` class: it counts as main line, as the
issue asks.

Pure functions on HTML strings (the standard library's parser), unit-tested on small strings in
tests/book/test_paragraphs.py and run there on every built chapter.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

__all__ = ["MAX_WORDS", "LAB_NOTE_PATTERNS", "main_line_paragraphs", "word_count", "lab_note_words",
           "offending_paragraphs"]

#: The longest main-line paragraph allowed (words).
MAX_WORDS = 120

#: What a main-line paragraph of chapters 09-14 must not speak of: load averages, spreads between
#: repeats, stopwatch overhead, a library's race (regular expressions, case-insensitive).
LAB_NOTE_PATTERNS = (
    r"load average", r"\bload on (the|a|this) (shared )?machine", r"\bbusy machine",
    r"\bspreads? (of|between) (the )?(runs|repeats)", r"\bstopwatch", r"\brace condition", r"\bdata race",
    r"\b(mkl|openmp|omp)\b[^.]*\brace", r"thread spinning", r"\bspin(s|ning)? while",
    r"fastest repeats?",
)

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _excluded(tag: str, attrs: dict[str, str]) -> bool:
    classes = set((attrs.get("class") or "").split())
    if tag in {"details", "pre", "script", "style", "template", "svg", "math"}:
        return True
    if tag == "div" and (classes & {"admonition", "cell_input", "output", "sd-dropdown"}):
        return True
    return tag == "span" and "math" in classes  # MathJax source, \( ... \): a formula is not words


class _Paragraphs(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, excluded here or above)
        self.in_article = 0
        self.paragraphs: list[str] = []
        self._current: list[str] | None = None
        self._p_depth = -1

    def _skipping(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            return
        attrs = dict(attrs)
        skip = self._skipping() or _excluded(tag, attrs)
        self.stack.append((tag, skip))
        if tag == "p" and not skip and self._current is None:
            self._current, self._p_depth = [], len(self.stack)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if tag in _VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:  # close up to the matching tag (tolerates unclosed inner tags)
            open_tag, _ = self.stack.pop()
            if self._current is not None and len(self.stack) < self._p_depth:
                self.paragraphs.append(" ".join("".join(self._current).split()))
                self._current, self._p_depth = None, -1
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self._current is not None and not self._skipping():
            self._current.append(data)


def main_line_paragraphs(html: str) -> list[str]:
    """The text of every main-line ``<p>`` of ``html`` (whitespace collapsed), in page order.

    If the page has an ``<article>`` only its content is read (the theme's navigation is not prose)."""
    if not isinstance(html, str):
        raise TypeError(f"html must be a str; got {type(html).__name__}")
    match = re.search(r"<article\b.*?</article>", html, flags=re.S)
    parser = _Paragraphs()
    parser.feed(match.group(0) if match else html)
    parser.close()
    return [p for p in parser.paragraphs if p]


def word_count(paragraph: str) -> int:
    """Words of a paragraph: runs of characters between spaces that hold a letter or a digit."""
    return sum(1 for token in paragraph.split() if re.search(r"\w", token))


def lab_note_words(paragraph: str) -> list[str]:
    """The lab-note phrases (matches of :data:`LAB_NOTE_PATTERNS`) found in ``paragraph``."""
    return [m.group(0) for pattern in LAB_NOTE_PATTERNS
            for m in re.finditer(pattern, paragraph, flags=re.I)]


def offending_paragraphs(html: str, *, lab_notes: bool) -> list[str]:
    """One line per main-line paragraph of ``html`` that is longer than :data:`MAX_WORDS` words or
    (``lab_notes=True``, chapters 09-14) speaks of a lab note; empty when the page is clean."""
    found = []
    for p in main_line_paragraphs(html):
        n = word_count(p)
        if n > MAX_WORDS:
            found.append(f"{n} words: {p[:160]}...")
        words = lab_note_words(p) if lab_notes else []
        if words:
            found.append(f"lab note ({', '.join(words)}): {p[:160]}...")
    return found
