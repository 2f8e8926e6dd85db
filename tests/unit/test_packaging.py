"""The requirement files say what they are for and are kept in step with pyproject.toml.

- pyproject.toml: the package's dependencies, lower bounds only (Colab installs from it and keeps
  its own torch, numpy and ipywidgets; `make book` / `make test` install from it).
- requirements.txt: the same lines, for a machine without a GPU, with the PyTorch CPU index (a plain
  `pip install -r requirements.txt` must not pull PyPI's CUDA build of torch).
- binder/requirements.txt: Binder's (Linux x86_64, no GPU): a lock file (scripts/lock_binder.py), every
  package pinned, the CPU torch named explicitly, and a kernel recent enough for the figure cells.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
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


def _lock() -> dict[str, Version]:
    """binder/requirements.txt as {canonical name: pinned version}; every line must be a pin."""
    pins = {}
    for req in _requirements(ROOT / "binder" / "requirements.txt"):
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==" and req.marker is None, (
            f"binder/requirements.txt: {req} is not a pin (name==version): Binder would pick any release")
        pins[canonicalize_name(req.name)] = Version(specs[0].version)
    return pins


def test_binder_gets_the_cpu_torch_explicitly():
    version = _makefile_torch_version()
    path = ROOT / "binder" / "requirements.txt"
    lines = _lines(path)
    assert CPU_INDEX in lines
    assert not any(line.startswith("-r") for line in lines), "the lock must not pull in unpinned files"
    assert _lock()["torch"] == Version(f"{version}+cpu")
    assert not _torch_for(path, LINUX).contains(version)  # never the CUDA build
    # Everything binder reads agrees on torch for Binder's Linux.
    assert _torch_for(ROOT / "requirements.txt", LINUX).contains(f"{version}+cpu")


def test_binders_lock_admits_the_package_ranges_and_pins_a_recent_kernel():
    """Each run-time dependency of pyproject.toml is pinned inside its range, and so is the book
    extra's ipykernel (below 6.29 Binder's figure cells in chapters 07, 11 and 14 were seen to fail)."""
    lock = _lock()
    extras = _pyproject()["project"]["optional-dependencies"]["book"]
    kernel = [Requirement(d) for d in extras if Requirement(d).name == "ipykernel"]
    wanted = [Requirement(d) for d in _pyproject()["project"]["dependencies"]] + kernel
    outside = {str(r): str(lock.get(canonicalize_name(r.name))) for r in wanted
               if canonicalize_name(r.name) not in lock
               or not r.specifier.contains(lock[canonicalize_name(r.name)], prereleases=True)}
    assert outside == {}, f"binder/requirements.txt pins these outside pyproject.toml's ranges: {outside}"
    assert lock["ipykernel"] >= Version("6.29")


def _requires(dist: importlib.metadata.Distribution) -> list[Requirement]:
    """A distribution's requirements that apply on Binder (Linux x86_64, CPython 3.11, no extras)."""
    env = {**LINUX, "python_version": "3.11", "python_full_version": "3.11.0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    return [r for r in map(Requirement, dist.requires or []) if r.marker is None or r.marker.evaluate(env)]


def test_binders_lock_is_closed_under_the_requirements_of_what_it_pins():
    """No package Binder installs is left unpinned: for every pinned package whose very version is
    installed here (the lock is made from the same resolution), each of its requirements is pinned
    too, at a version that satisfies it. Packages installed here at another version are not read
    (their requirements may differ from the pinned release's)."""
    lock = _lock()
    read, missing = 0, {}
    for name, version in lock.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != version:
            continue
        read += 1
        for req in _requires(dist):
            pinned = lock.get(canonicalize_name(req.name))
            if pinned is None or not req.specifier.contains(pinned, prereleases=True):
                missing[f"{name}=={version} requires {req}"] = str(pinned)
    assert missing == {}, f"binder/requirements.txt misses or mis-pins: {missing}"
    assert read >= len(lock) // 2, f"only {read} of {len(lock)} pinned versions are installed here to read"


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
    """pip itself parses the lock's index option and its torch pin and resolves torch to the CPU
    build (here from this machine's disk when the PyTorch index is out of reach)."""
    lines = _lines(ROOT / "binder" / "requirements.txt")
    subset = tmp_path / "requirements.txt"
    subset.write_text("\n".join(line for line in lines if line.startswith("-") or line.startswith("torch==")) + "\n")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "-q",
         "--disable-pip-version-check", "--retries", "0", "--report", str(report), "-r", str(subset)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert resolved == {"torch": f"{_makefile_torch_version()}+cpu"}


def test_no_environment_or_build_output_is_tracked():
    """A worktree's `.venv` symlink was once committed (`.gitignore` had `.venv/`, which matches only a
    directory): a clone then ran `make` in another checkout's environment and re-pointed its editable
    install. Nothing under .venv, _build or test-artifacts may be tracked."""
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "--", ".venv", "_build", "test-artifacts"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert tracked == []
    # ignored as a symlink too (a worktree's .venv may be one), not only as a directory
    ignored = subprocess.run(["git", "check-ignore", "--no-index", ".venv"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert ignored == [".venv"]
