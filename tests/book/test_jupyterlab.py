"""Hints are folded in JupyterLab too, not only in the book (issue 26.6).

A MyST ``{dropdown}`` is a Jupyter Book directive: JupyterLab, Notebook 7 and Colab showed it as
literal text with the hint in plain sight. The hints are now HTML ``<details>``; this test opens a
stored notebook in a real JupyterLab (served on 127.0.0.1, headless, in Chromium) and checks that
each hint's text is hidden until its summary is clicked, and that its body was rendered from
Markdown (inline code as ``<code>``, no backticks, no ``:::``).

JupyterLab is in the ``test`` extra (so CI runs this test); the test uses ``SELFATTN_JUPYTERLAB``
if set, else the ``jupyter-lab`` next to ``sys.executable`` (the venv's bin), else the PATH's. Set
``SELFATTN_JUPYTERLAB`` to a ``jupyter-lab`` executable (e.g. ``python -m venv /tmp/lab && /tmp/lab/bin/pip install jupyterlab``, then
``SELFATTN_JUPYTERLAB=/tmp/lab/bin/jupyter-lab``), or have ``jupyter-lab`` on the PATH; without one
the test is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Chapter 02: its two hints hold inline code (`keepdims=True`, `np.exp`, `Q.shape`, `d_model`).
NOTEBOOK = ROOT / "notebooks" / "02_similarity_softmax.ipynb"


def _jupyter_lab() -> str:
    beside = Path(sys.executable).parent / "jupyter-lab"  # the venv's bin, where the test extra installs it
    chosen = os.environ.get("SELFATTN_JUPYTERLAB") or (str(beside) if beside.is_file() else shutil.which("jupyter-lab"))
    if not chosen or not Path(chosen).is_file():
        pytest.skip("JupyterLab is not installed (set SELFATTN_JUPYTERLAB to a jupyter-lab executable)")
    return chosen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    """A JupyterLab serving a copy of chapter 02 on 127.0.0.1, with no token, every notebook cell in the
    DOM (windowing off) and no update or news checks (offline)."""
    exe = _jupyter_lab()
    home = tmp_path_factory.mktemp("lab")
    (home / "nb").mkdir()
    shutil.copy(NOTEBOOK, home / "nb" / NOTEBOOK.name)
    settings = home / "settings"
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    announcements = settings / "@jupyterlab" / "apputils-extension"
    announcements.mkdir(parents=True)
    (announcements / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_DATA_DIR": str(home / "data")}
    proc = subprocess.Popen(
        [exe, "--no-browser", "--allow-root", "--LabApp.extension_manager=readonly", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={home / 'nb'}",
         f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=open(home / "lab.log", "w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # up to 60 s for the server to answer (it waits on nothing else)
            if proc.poll() is not None:
                pytest.fail(f"jupyter-lab exited ({proc.returncode}): {(home / 'lab.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"jupyter-lab did not answer: {(home / 'lab.log').read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


HINTS_JS = """() => [...document.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown')]
  .filter((r) => r.textContent.includes('Hint') && (r.querySelector('details') || r.textContent.includes('{dropdown}')))
  .map((r, i) => { r.setAttribute('data-test-hint', i);
    const d = r.querySelector('details');
    return {text: r.textContent, details: !!d, open: d ? d.open : null, summary: d && d.querySelector('summary') ? d.querySelector('summary').textContent.trim() : null,
            code: d ? d.querySelectorAll('code').length : 0, em: d ? d.querySelectorAll('em').length : 0}; })"""


def test_hints_are_hidden_in_jupyterlab_until_clicked(browser, lab_url):
    stored = json.loads(NOTEBOOK.read_text())
    hint_cells = ["".join(c["source"]) for c in stored["cells"] if c["cell_type"] == "markdown" and "Hint" in "".join(c["source"])
                  and ("<details" in "".join(c["source"]) or "{dropdown}" in "".join(c["source"]))]
    assert len(hint_cells) >= 2, "chapter 02 should hold two hints"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    # Offline: only the local server.
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(lab_url) or r.request.url.startswith("data:") else r.abort())
    try:
        tab = context.new_page()
        tab.goto(f"{lab_url}/lab/tree/{NOTEBOOK.name}", wait_until="load", timeout=60000)
        tab.wait_for_selector(".jp-MarkdownCell .jp-RenderedMarkdown", state="attached", timeout=60000)
        # Rendered Markdown is filled in asynchronously: wait until every hint cell has been drawn.
        tab.wait_for_function(f"() => ({HINTS_JS})().length >= {len(hint_cells)}", timeout=60000)
        hints = tab.evaluate(HINTS_JS)
        assert len(hints) == len(hint_cells), hints
        for i, h in enumerate(hints):
            assert "{dropdown}" not in h["text"] and ":::" not in h["text"], f"hint {i} is shown as MyST source: {h['text'][:120]}"
            assert h["details"] and h["open"] is False and h["summary"] == "Hint", f"hint {i} is not a closed <details>: {h}"
            assert h["code"] + h["em"] >= 1 and "`" not in h["text"] and "*" not in h["text"], (
                f"hint {i}'s body is not rendered Markdown: {h['text'][:120]}")
            hint = tab.locator(f'[data-test-hint="{i}"] details')
            hint.scroll_into_view_if_needed()
            summary = hint.locator(":scope > summary")
            body = hint.locator(":scope > :not(summary)").first
            assert summary.is_visible(), f"hint {i}: its summary is not shown"
            assert not body.is_visible(), f"hint {i}: its text is visible before a click: {body.text_content()[:80]}"
            summary.click()
            body.wait_for(state="visible", timeout=5000)
            words = body.inner_text().split()
            assert len(words) >= 5 and all(w in h["text"] for w in words[:5]), f"hint {i} after the click: {words}"
    finally:
        context.close()



SOLUTIONS_JS = """(indices) => { const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
  return indices.map((i) => { const c = cells[i]; if (!c) return null; c.setAttribute('data-test-solution', i);
    const ph = c.querySelector('.jp-InputPlaceholder');
    return {code: c.classList.contains('jp-CodeCell'), placeholder: ph ? ph.textContent.trim() : null}; }); }"""


def test_solutions_are_hidden_in_jupyterlab_until_clicked(browser, lab_url):
    """Each solution cell's code is collapsed (jupyter.source_hidden, issue 27.3): JupyterLab draws a
    one-line placeholder (the ``# @title`` line) instead of the code, and one click on it shows the code."""
    stored = json.loads(NOTEBOOK.read_text())
    solutions = [i for i, c in enumerate(stored["cells"]) if c["cell_type"] == "code" and "".join(c["source"]).startswith("# @title Solution")]
    assert len(solutions) >= 2, "chapter 02 should hold two solutions"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(lab_url) or r.request.url.startswith("data:") else r.abort())
    try:
        tab = context.new_page()
        tab.goto(f"{lab_url}/lab/tree/{NOTEBOOK.name}", wait_until="load", timeout=60000)
        tab.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length == {len(stored['cells'])}", timeout=60000)
        found = tab.evaluate(SOLUTIONS_JS, solutions)
        for i, f in zip(solutions, found, strict=True):
            source = "".join(stored["cells"][i]["source"])
            body = next(line for line in source.splitlines()[1:] if line.strip())  # the solution's first line of code
            assert f and f["code"] and f["placeholder"] == source.splitlines()[0], f"cell {i}: no collapsed input: {f}"
            cell = tab.locator(f'[data-test-solution="{i}"]')
            cell.scroll_into_view_if_needed()
            editor = cell.locator(".jp-InputArea .cm-content")
            assert not editor.is_visible(), f"cell {i}: its code is visible before a click"
            assert body.strip() not in cell.inner_text(), f"cell {i}: its code is visible before a click"
            cell.locator(".jp-InputPlaceholder").click()
            editor.wait_for(state="visible", timeout=5000)
            assert body.strip() in editor.inner_text(), f"cell {i} after the click: {editor.inner_text()[:120]}"
    finally:
        context.close()
