"""Launch buttons and the Colab install step all derive from ``_config.yml``'s ``repository.url``
(issue 6), and the README says how to publish the book.

The notebook side (each setup cell installs ``git+<repository.url>`` on Colab only, and not torch)
is checked by ``tests/unit/test_notebooks_stored.py``; here: the built pages' buttons, and that the
install cannot replace Colab's torch or numpy.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest
import yaml

from .browser_support import ROOT, chapter_pages, page_id

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
BRANCH = CONFIG["repository"].get("branch", "main")
BOOK_PATH = (CONFIG["repository"].get("path_to_book") or "").strip("/")
OWNER_REPO = urlparse(REPO_URL).path.strip("/")
CHAPTERS = chapter_pages()


def _hrefs(html: str) -> list[str]:
    return [h.replace("&amp;", "&") for h in re.findall(r'href="([^"]+)"', html)]


def _in_repo(page: str) -> str:
    return f"{BOOK_PATH}/{page}.ipynb" if BOOK_PATH else f"{page}.ipynb"


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_launch_buttons_open_this_notebook_of_the_configured_repository(built_html, page):
    hrefs = _hrefs((built_html / f"{page}.html").read_text())
    colab = f"{CONFIG['launch_buttons']['colab_url'].rstrip('/')}/github/{OWNER_REPO}/blob/{BRANCH}/{_in_repo(page)}"
    interface = "lab/tree" if CONFIG["launch_buttons"].get("notebook_interface") == "jupyterlab" else "tree"
    binder = f"{CONFIG['launch_buttons']['binderhub_url'].rstrip('/')}/v2/gh/{OWNER_REPO}/{BRANCH}?urlpath={interface}/{_in_repo(page)}"
    assert colab in hrefs, f"{page}: no Colab button to {colab}"
    assert binder in hrefs, f"{page}: no Binder button to {binder}"
    assert REPO_URL in hrefs, f"{page}: no repository button to {REPO_URL}"
    launches = [h for h in hrefs if "colab.research.google.com" in h or "mybinder.org" in h]
    assert all(OWNER_REPO in h for h in launches), launches


def _install_lines(path) -> list[str]:
    nb = json.loads(path.read_text())
    first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    return [line for line in first.splitlines() if re.search(r"\bpip\b.*\binstall\b", line)]


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_colab_install_step_uses_the_repository_and_leaves_torch_and_numpy_alone(page):
    lines = _install_lines(ROOT / f"{page}.ipynb")
    assert len(lines) == 1 and f"git+{REPO_URL}" in lines[0], lines
    for forbidden in ("torch", "numpy", " -U", "--upgrade", "--force-reinstall", "--no-deps"):
        assert forbidden not in lines[0], f"{page}: the Colab install step has {forbidden!r}"


def test_the_package_asks_only_lower_bounds_of_torch_and_numpy():
    """pip keeps Colab's torch and numpy when they meet the lower bound: no pin, no upper bound."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in ("torch", "numpy"):
        spec = next(d for d in deps if re.match(rf"{name}\b", d))
        assert re.fullmatch(rf"{name}>=[\d.]+", spec.replace(" ", "")), spec
    requirements = (ROOT / "requirements.txt").read_text()
    for line in requirements.splitlines():
        if re.match(r"(torch|numpy)\b", line):
            assert re.fullmatch(r"(torch|numpy)>=[\d.]+", line.split("#")[0].strip().replace(" ", "")), line


def test_readme_says_how_to_publish_the_book():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Publishing the book", 1)
    assert len(section) == 2, "README.md has no 'Publishing the book' section"
    assert "_build/html" in section[1]


def test_binder_installs_the_requirements_and_the_package():
    """The Binder button opens a notebook that imports selfattn: binder/ installs the course's
    requirements (CPU torch) and then the package from the repository itself."""
    requirements = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("torch==") and line.endswith("+cpu") for line in requirements)
    assert not any(line.startswith("selfattn") for line in requirements)  # postBuild installs it
    assert any(line.startswith("--extra-index-url https://download.pytorch.org/whl/cpu") for line in requirements)
    post_build = ROOT / "binder" / "postBuild"
    assert post_build.stat().st_mode & 0o111, "binder/postBuild must be executable"
    assert "pip install --no-deps ." in post_build.read_text()
