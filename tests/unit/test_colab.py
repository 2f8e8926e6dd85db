"""Colab: the explorers and progress bars show there.

Colab ships ipywidgets 7.7.1 with its own widget manager. The chapters' install step
(``%pip install git+...``) must leave that ipywidgets alone (the package's range admits it), and
importing ``selfattn.viz`` (every chapter's setup cell does) turns on Colab's custom widget manager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

# What a Colab runtime brings (its usual versions; torch stands for Colab's own build, which the
# package accepts from 2.1 on). The install step must upgrade or downgrade none of them.
COLAB = {
    "ipywidgets": "7.7.1",
    "numpy": "2.0.2",
    "torch": "2.13.0",
    "tqdm": "4.67.1",
    "plotly": "5.24.1",
    "safetensors": "0.5.3",
    "tokenizers": "0.21.1",
}


def _dependencies() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name: Requirement(d) for d in deps}


def test_the_package_admits_colabs_versions():
    deps = _dependencies()
    refused = {name: str(deps[name].specifier) for name, version in COLAB.items()
               if name in deps and not deps[name].specifier.contains(version, prereleases=True)}
    assert refused == {}, f"the Colab install step would replace Colab's {refused}"
    assert {"ipywidgets", "numpy", "torch", "tqdm", "plotly"} <= set(deps)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("SELFATTN_PLOTLY_RENDERER", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


FAKE_COLAB = """
import sys, types
calls = []
google = types.ModuleType("google")
colab = types.ModuleType("google.colab")
output = types.ModuleType("google.colab.output")
output.enable_custom_widget_manager = lambda: calls.append("enable_custom_widget_manager")
colab.output = output
google.colab = colab
sys.modules.update({"google": google, "google.colab": colab, "google.colab.output": output})
"""


def test_importing_viz_on_colab_enables_the_custom_widget_manager():
    proc = _run(FAKE_COLAB + """
import plotly.io as pio
import selfattn.viz
print(calls, pio.renderers.default)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['enable_custom_widget_manager']", "colab"]


def test_importing_viz_elsewhere_enables_nothing():
    proc = _run("""
import sys
import selfattn.viz
print(selfattn.viz.enable_colab_widgets(), "google.colab" in sys.modules)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_a_colab_without_the_custom_manager_still_imports():
    proc = _run(FAKE_COLAB + """
del output.enable_custom_widget_manager
import selfattn.viz
print(selfattn.viz.enable_colab_widgets())
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


@pytest.mark.slow
def test_installing_the_package_on_colab_replaces_none_of_its_packages(tmp_path):
    """What the chapters' `%pip install git+...` does on Colab, resolved (not installed) by pip.

    Colab's versions are pinned as constraints, so the resolution fails if the package needs any of
    them upgraded or downgraded. torch 2.13.0 resolves from this machine's disk (the CPU wheel the
    Makefile installs), so nothing large is downloaded; the rest is metadata from the registry.
    """
    constraints = tmp_path / "colab-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in COLAB.items()))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--disable-pip-version-check", "--report", str(report), "-c", str(constraints), str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"pip cannot install the package beside Colab's {COLAB}:\n{proc.stderr[-3000:]}"
    resolved = {Requirement(i["metadata"]["name"]).name.lower(): Version(i["metadata"]["version"]).public
                for i in json.loads(report.read_text())["install"]}
    changed = {name: (version, resolved[name]) for name, version in COLAB.items()
               if name in resolved and resolved[name] != version}
    assert changed == {}
    assert "selfattn" in resolved and "ipywidgets" in resolved
