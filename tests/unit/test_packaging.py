"""requirements.txt (for Colab and Binder) is kept in step with pyproject.toml."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_requirements_match_pyproject_dependencies():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = [
        line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert sorted(lines) == sorted(deps)


def test_torch_is_a_lower_bound_only():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = [d for d in deps if d.startswith("torch")]
    assert torch and all(">=" in d and "==" not in d and "<" not in d for d in torch)


def test_jupyter_book_is_pinned_below_2():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    jb = [d for d in extras["book"] if d.startswith("jupyter-book")]
    assert jb == ["jupyter-book>=1.0.4.post1,<2"]
