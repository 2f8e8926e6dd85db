"""The explorers build under ipywidgets 7.7.1, Colab's version (the package admits it since the
chapters' Colab install step must not replace it; see tests/unit/test_colab.py).

ipywidgets 7.7.1 (and ipython_genutils, which 7.x imports) is installed from the package registry
into a temporary folder that is put first on PYTHONPATH, so it shadows this environment's ipywidgets
8 in a subprocess; the package's own explorer tests and the widget calls the chapters make then run
there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLAB_IPYWIDGETS = "7.7.1"

EXPLORER_TESTS = [
    "tests/unit/test_viz_block.py::test_branch_explorer_builds",
    "tests/unit/test_viz_heads.py::test_live_explorer_builds_with_controls",
    "tests/unit/test_viz_interpret.py::test_edge_measures_figure_has_one_panel_per_measure_and_one_frame_per_head",
    "tests/unit/test_viz_training.py::test_retrieval_step_figure_and_widget",
    "tests/unit/test_viz_positions.py::test_rope_explorer_widget_builds_with_two_sliders",
    # the first view in the Output's own state (issue 31: Notebook 6 showed a blank explorer)
    "tests/unit/test_viz_live_output.py::test_chapter_13_explorer_holds_its_first_view_and_follows_its_controls",
    "tests/unit/test_viz_live_output.py::test_live_output_keeps_printed_text_and_shows_a_later_error",
]

# The widget classes, arguments and callbacks the chapters' explorer cells use.
CHAPTER_WIDGETS = """
import ipywidgets as widgets
assert widgets.__version__ == "{version}", widgets.__version__
seen = []
angle = widgets.IntSlider(value=45, min=0, max=360, step=5, description="angle")
length = widgets.FloatSlider(value=1.0, min=0.1, max=1.25, step=0.05, description="|b|")
text = widgets.Text(value="bank", description="A", continuous_update=False, layout={{"width": "90%"}})
choice = widgets.Dropdown(options=["a", "b"], description="sentence", layout={{"width": "500px"}})
d_head = widgets.SelectionSlider(options=[8, 64], value=64, description="d_head")
box = widgets.Checkbox(value=True, description="mask")
toggle = widgets.ToggleButtons(options=["time", "memory"], description="quantity")
out = widgets.interactive_output(lambda angle, length, t, c, d, b, q: seen.append((angle, d, q)),
                                 {{"angle": angle, "length": length, "t": text, "c": choice,
                                   "d": d_head, "b": box, "q": toggle}})
angle.observe(lambda change: seen.append(("observed", change["new"])), names="value")
angle.value = 90
ui = widgets.VBox([widgets.HBox([angle, length]), text, choice, d_head, box, toggle, out])
assert text.layout.width == "90%" and len(ui.children) == 7
assert ("observed", 90) in seen and (90, 64, "time") in seen, seen
print("ok")
"""


@pytest.fixture(scope="module")
def ipywidgets7(tmp_path_factory) -> dict:
    target = tmp_path_factory.mktemp("ipywidgets7")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), f"ipywidgets=={COLAB_IPYWIDGETS}", "ipython_genutils==0.2.0"],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, f"could not install ipywidgets {COLAB_IPYWIDGETS}:\n{pip.stderr[-2000:]}"
    path = os.pathsep.join([str(target), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.slow
def test_package_explorers_build_under_ipywidgets_7(ipywidgets7):
    probe = "import ipywidgets, selfattn.viz; print(ipywidgets.__version__)"
    version = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             env=ipywidgets7, cwd=ROOT, timeout=120)
    assert version.stdout.strip() == COLAB_IPYWIDGETS, version.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *EXPLORER_TESTS],
        capture_output=True, text=True, env=ipywidgets7, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"{len(EXPLORER_TESTS)} passed" in proc.stdout


@pytest.mark.slow
def test_chapter_widget_calls_work_under_ipywidgets_7(ipywidgets7):
    code = textwrap.dedent(CHAPTER_WIDGETS.format(version=COLAB_IPYWIDGETS))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=ipywidgets7, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1:] == ["ok"]  # (Output widgets write terminal escapes first)
