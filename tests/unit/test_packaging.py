"""The requirement files say what they are for and are kept in step with pyproject.toml.

- pyproject.toml: the package's dependencies, lower bounds only (Colab installs from it and keeps
  its own torch, numpy and ipywidgets; `make book` / `make test` install from it).
- requirements.txt: the same lines, for a machine without a GPU, with the PyTorch CPU index (a plain
  `pip install -r requirements.txt` must not pull PyPI's CUDA build of torch).
- binder/requirements.txt: Binder's (Linux x86_64, no GPU): the explicit CPU torch, then the above.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
LINUX = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _requirements(path: Path) -> list[Requirement]:
    return [Requirement(line) for line in _lines(path) if not line.startswith("-")]


def _torch_for(path: Path, env: dict) -> SpecifierSet:
    """The torch specifier that pip applies on a platform (environment markers evaluated)."""
    specs = [r.specifier for r in _requirements(path)
             if r.name == "torch" and (r.marker is None or r.marker.evaluate(env))]
    assert len(specs) == 1, f"{path.name}: {len(specs)} torch requirements for {env['sys_platform']}"
    return specs[0]


def _makefile_torch_version() -> str:
    match = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile names no TORCH ?= torch==VERSION"
    return match.group(1)


def test_requirements_match_pyproject_dependencies():
    deps = _pyproject()["project"]["dependencies"]
    assert sorted(str(r) for r in _requirements(ROOT / "requirements.txt")) == sorted(str(Requirement(d)) for d in deps)


def test_requirements_take_torch_from_the_cpu_index():
    """`pip install -r requirements.txt` sees PyPI's torch X (the CUDA build on Linux) and the CPU
    index's X+cpu, and takes X+cpu: a local version label sorts above the plain version."""
    version = _makefile_torch_version()
    path = ROOT / "requirements.txt"
    assert CPU_INDEX in _lines(path)
    spec = _torch_for(path, LINUX)
    assert spec.contains(f"{version}+cpu")
    assert Version(f"{version}+cpu") > Version(version)  # what makes pip prefer the CPU wheel


def test_binder_gets_the_cpu_torch_explicitly():
    version = _makefile_torch_version()
    path = ROOT / "binder" / "requirements.txt"
    lines = _lines(path)
    assert CPU_INDEX in lines and "-r ../requirements.txt" in lines
    assert [str(r) for r in _requirements(path)] == [f"torch=={version}+cpu"]
    assert not _torch_for(path, LINUX).contains(version)  # never the CUDA build
    # Everything binder reads agrees on torch for Binder's Linux.
    assert _torch_for(ROOT / "requirements.txt", LINUX).contains(f"{version}+cpu")


def test_binder_python_is_one_the_package_supports():
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(3\.\d+)", runtime)
    assert match, runtime
    assert SpecifierSet(_pyproject()["project"]["requires-python"]).contains(match.group(1) + ".0")


def test_binder_post_build_installs_the_package_without_dependencies():
    post = _lines(ROOT / "binder" / "postBuild")
    assert post[-1] == "python -m pip install --no-deps ."


def test_torch_is_a_lower_bound_only():
    deps = _pyproject()["project"]["dependencies"]
    torch = [d for d in deps if d.startswith("torch")]
    assert torch and all(">=" in d and "==" not in d and "<" not in d for d in torch)


def test_jupyter_book_is_pinned_below_2():
    extras = _pyproject()["project"]["optional-dependencies"]
    jb = [d for d in extras["book"] if d.startswith("jupyter-book")]
    assert jb == ["jupyter-book>=1.0.4.post1,<2"]


@pytest.mark.slow
def test_pip_reads_binders_requirements_and_picks_the_cpu_torch(tmp_path):
    """pip itself parses both files (the relative -r, the markers, the index option) and resolves
    torch to the CPU build (here from this machine's disk when the PyTorch index is out of reach)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "-q",
         "--disable-pip-version-check", "--retries", "0", "--report", str(report),
         "-r", str(ROOT / "binder" / "requirements.txt")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert resolved["torch"] == f"{_makefile_torch_version()}+cpu"
    names = {Requirement(d).name.lower() for d in _pyproject()["project"]["dependencies"]}
    assert names <= set(resolved)
