"""book/references.bib parses strictly, and every key the book cites is in it.

A merge once dropped an entry's closing brace: sphinxcontrib-bibtex then stopped the whole book
build at its first step, after all the unit tests had passed. This test finds that in a second."""

import re
from pathlib import Path

import pybtex.database
import pybtex.errors
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIB = ROOT / "book" / "references.bib"


@pytest.fixture(scope="module")
def entries():
    strict = pybtex.errors.strict
    pybtex.errors.strict = True  # a syntax error raises instead of being reported and skipped
    try:
        return pybtex.database.parse_file(str(BIB)).entries
    finally:
        pybtex.errors.strict = strict


def test_every_entry_parses_and_has_author_title_and_year(entries):
    assert len(entries) > 50
    raw_keys = re.findall(r"^@\w+\{([^,]+),", BIB.read_text(), flags=re.MULTILINE)
    assert sorted(raw_keys) == sorted(entries.keys()), "an entry was swallowed by the one before it"
    for key, entry in entries.items():
        assert "title" in entry.fields and "year" in entry.fields, key
        assert entry.persons.get("author"), key


def test_every_cited_key_is_in_the_bibliography(entries):
    cited = set()
    for path in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("book/*.md")]:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", path.read_text()):
            cited.update(k.strip() for k in group.split(","))
    assert cited, "no citations found: the pattern no longer matches the book's {cite} role"
    assert not cited - set(entries), sorted(cited - set(entries))
