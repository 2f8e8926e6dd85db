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
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

# What a Colab runtime brings (a snapshot of its usual versions, late 2025, Python 3.11/3.12 images;
# googlecolab/backend-info publishes the full `pip freeze`). torch stands for Colab's own build, which
# the package accepts from 2.1 on (2.13.0 is on this machine's disk, so nothing large is fetched).
# The install step must upgrade or downgrade none of these. Colab's `google-colab` package pins
# ipykernel, ipython and jupyter-client exactly: upgrading them can crash the runtime, which is why
# the package itself sets no ipykernel bound (the book extra and Binder's lock do).
COLAB = {
    "ipywidgets": "7.7.1",
    "ipykernel": "6.17.1",
    "jupyter-client": "6.1.12",
    "numpy": "2.0.2",
    "torch": "2.13.0",
    "tqdm": "4.67.1",
    "plotly": "5.24.1",
    "safetensors": "0.6.2",
    "tokenizers": "0.22.1",
    "huggingface-hub": "0.36.0",
    "transformers": "4.57.1",
    "sentence-transformers": "5.1.2",
    "protobuf": "5.29.5",
    "ml-dtypes": "0.5.3",
}
# Bounds that Colab's other preinstalled packages put on shared dependencies: TensorFlow 2.19's on
# protobuf (onnx 1.23 would need protobuf>=6.31) and on ml_dtypes.
COLAB_BOUNDS = ["protobuf>=3.20.3,<6.0.0dev", "ml-dtypes>=0.5.1,<1.0.0"]
# The transformers major version Colab ships, and the packages it needs at that version.
COLAB_TRANSFORMERS = ["transformers==4.57.1", "huggingface-hub==0.36.0", "tokenizers==0.22.1"]


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
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in COLAB.items())
                           + "".join(f"{bound}\n" for bound in COLAB_BOUNDS))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--disable-pip-version-check", "--report", str(report), "-c", str(constraints), str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"pip cannot install the package beside Colab's {COLAB}:\n{proc.stderr[-3000:]}"
    resolved = {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"]).public
                for i in json.loads(report.read_text())["install"]}
    changed = {name: (version, resolved[name]) for name, version in COLAB.items()
               if name in resolved and resolved[name] != version}
    assert changed == {}
    assert "selfattn" in resolved and "ipywidgets" in resolved


def _transformers_imports(paths=None) -> list[tuple[str, int, str, bool]]:
    """Every import of transformers in the stored chapters' code: (notebook, cell, statement, guarded).

    A statement is guarded when it sits in a ``try`` whose handlers catch ImportError (or a parent
    of it) or in an ``if`` that tests a version: then a chapter survives its failure."""
    import ast

    catches = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    found = []
    for path in paths or sorted((ROOT / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
            tree = ast.parse(code)

            def visit(node, guarded, path=path, index=index):
                if isinstance(node, ast.Try):
                    names = {ast.unparse(h.type).split(".")[-1] if h.type else "BaseException"
                             for h in node.handlers}
                    inner = guarded or any(n.strip("()").split(",")[0] in catches or
                                           any(c in n for c in catches) for n in names)
                    for child in node.body:
                        visit(child, inner)
                    for child in node.handlers + node.orelse + node.finalbody:
                        visit(child, guarded)
                    return
                if isinstance(node, ast.If) and "version" in ast.unparse(node.test).lower():
                    for child in node.body + node.orelse:
                        visit(child, True)
                    return
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    if module and module.split(".")[0] == "transformers":
                        found.append((path.name, index, ast.unparse(node), guarded))
                for child in ast.iter_child_nodes(node):
                    visit(child, guarded)

            visit(tree, False)
    return found


def test_the_transformers_import_finder_sees_guards(tmp_path):
    """The finder behind the next test, on a notebook written here: a bare import is unguarded; one
    under try/except ImportError or under a version test is guarded; other imports are ignored."""
    cells = [
        "import numpy\nfrom transformers.models.llama.modeling_llama import repeat_kv",
        "try:\n    from transformers import GPTJRotaryEmbedding\nexcept ImportError:\n    pass",
        "%pip install x\nif TRANSFORMERS_VERSION >= (5,):\n    import transformers.models.deepseek_v32",
        "try:\n    import transformers.models.gpt_oss\nexcept KeyError:\n    pass",
    ]
    notebook = tmp_path / "x.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]}))
    assert [(cell, guarded) for _, cell, _, guarded in _transformers_imports([notebook])] == [
        (0, False), (1, True), (2, True), (3, False)]
    assert _transformers_imports(), "no chapter imports transformers: the Colab check would test nothing"


@pytest.mark.slow
def test_every_chapter_imports_what_it_needs_from_colabs_transformers(tmp_path):
    """Colab ships transformers 4.x while `make test` installs the newest (5.x): every name a chapter
    imports from transformers must exist in Colab's version, unless the chapter guards the import
    (try/except ImportError or a version test) and so runs on without it."""
    target = tmp_path / "colab-transformers"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), *COLAB_TRANSFORMERS],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imports = _transformers_imports()
    probe = textwrap.dedent("""
        import json, sys, transformers
        assert transformers.__version__ == sys.argv[1], transformers.__version__
        failed = []
        for statement in json.loads(sys.stdin.read()):
            try:
                exec(statement, {})
            except Exception as error:
                failed.append([statement, f"{type(error).__name__}: {error}"])
        print(json.dumps(failed))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "src")])}
    statements = sorted({statement for _, _, statement, _ in imports})
    version = COLAB_TRANSFORMERS[0].split("==")[1]
    run = subprocess.run([sys.executable, "-c", probe, version], input=json.dumps(statements),
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    failed = dict(json.loads(run.stdout.strip().splitlines()[-1]))
    unguarded = [f"{nb} cell {cell}: {statement} ({failed[statement]})"
                 for nb, cell, statement, guarded in imports if statement in failed and not guarded]
    assert unguarded == [], f"under Colab's transformers {version} these chapters stop:\n" + "\n".join(unguarded)


# Colab's kernel stack: its ipykernel, the jupyter-client it runs with (below 7, ipykernel cleans
# every message for JSON and raises "Can't clean for JSON" on what it cannot encode), and its
# ipywidgets 7 (comm messages through ipykernel's own Comm).
COLAB_KERNEL = ["ipykernel==6.17.1", "jupyter-client==6.1.12", "ipywidgets==7.7.1",
                "widgetsnbextension==3.6.6", "jupyterlab-widgets==1.1.1", "ipython-genutils==0.2.0"]


@pytest.mark.slow
def test_figure_cells_run_under_colabs_kernel(tmp_path):
    """Chapter 07 (figures, explorers, Markdown outputs) executed by a kernel with Colab's ipykernel,
    jupyter-client and ipywidgets: no cell fails and the figures are published. The package sets no
    ipykernel bound because Colab pins its own (tests above); this is what makes that safe."""
    import nbformat
    from nbclient import NotebookClient

    target = tmp_path / "colab-kernel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), *COLAB_KERNEL],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = tmp_path / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python",
        "env": {"PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "src")]), "OMP_NUM_THREADS": "1"},
    }))
    nb = nbformat.read(ROOT / "notebooks" / "07_transformer_block.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        "import ipykernel, jupyter_client, ipywidgets\n"
        "print(ipykernel.__version__, jupyter_client.__version__, ipywidgets.__version__)"))
    old_path = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter")
    try:
        NotebookClient(nb, kernel_name="colab", timeout=600, allow_errors=True,
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    finally:
        if old_path is None:
            os.environ.pop("JUPYTER_PATH")
        else:
            os.environ["JUPYTER_PATH"] = old_path
    versions = "".join(o.get("text", "") for o in nb.cells[0].outputs).split()
    assert versions == [r.split("==")[1] for r in COLAB_KERNEL[:3]], versions
    errors = [(i, o["ename"], o["evalue"][:300]) for i, cell in enumerate(nb.cells)
              for o in cell.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    figures = [o for cell in nb.cells for o in cell.get("outputs", []) if o["output_type"] == "display_data"]
    assert len(figures) >= 5, f"only {len(figures)} figures or explorers were published"
