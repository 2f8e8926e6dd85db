"""The book's local Sphinx extension: serve every script the pages need from the book itself.

The published book must read offline (issue 6), so nothing is loaded from a CDN:

- plotly.js: figures are emitted by ``selfattn.viz``'s renderer as a ``text/html`` div that calls
  the global ``Plotly``. This extension copies the ``plotly.min.js`` that ships inside the installed
  ``plotly`` Python package (so its version always matches the figures' JSON) into the built site
  and loads it on every page before any other script, in particular before require.js, which would
  otherwise make plotly.js register as an AMD module instead of a global.
- require.js, the ipywidgets HTML manager and MathJax: fetched (pinned, integrity-checked) from the
  npm registry by ``scripts/vendor_js.py`` (the Makefile's install step) into
  ``<venv>/share/selfattn-vendor``, and copied from there. ``_config.yml`` points ``mathjax_path``
  and ``nb_ipywidgets_js`` at these copies; the build fails if one of them is missing.

Everything lands in ``_build/html/_static/selfattn-vendor/``.

The live model of chapter 14 (``selfattn.live.LivePanel``): a page whose body holds such a panel, and
only such a page, also gets ``selfattn-live.js``, which loads onnxruntime-web (vendored and wrapped by
``scripts/vendor_js.py`` into ``selfattn-vendor/onnxruntime-web/``) when the panel comes into view.

It also loads ``selfattn_parallel_exec`` (same folder): the notebooks are executed two at a time
before Sphinx reads them, instead of one after another while it reads them (see that module).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

VENDOR = "selfattn-vendor"
# Filled by scripts/vendor_js.py; the same default as there.
FETCHED = Path(sys.prefix) / "share" / "selfattn-vendor"


def _local_paths(config) -> list[str]:
    """The paths under _static/selfattn-vendor that the configuration loads (MathJax, widgets)."""
    paths = [str(config.mathjax_path or "")] + [str(p) for p in (config.nb_ipywidgets_js or {})]
    return [p for p in paths if p.startswith(f"{VENDOR}/")]


def _stage_static(app) -> None:
    import plotly

    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not source.is_file():
        raise FileNotFoundError(f"plotly.min.js not found at {source}; reinstall plotly")
    staged = Path(app.outdir).parent / "selfattn_static"
    (staged / VENDOR).mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, staged / VENDOR / "plotly.min.js")
    if FETCHED.is_dir():
        shutil.copytree(FETCHED, staged / VENDOR, dirs_exist_ok=True)
    missing = [p for p in [*_local_paths(app.config), *LIVE_RUNTIME] if not (staged / p).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{missing} are configured in _config.yml or loaded by the live model, but not vendored in {FETCHED}; "
            "run `make vendor` (or `python scripts/vendor_js.py`) with the book's Python"
        )
    app.config.html_static_path.append(str(staged))


def _theme_defaults(app, config) -> None:
    """pydata-sphinx-theme logs a console error ("Got invalid theme mode: .") on a reader's first
    visit unless a default mode is set; "auto" follows the reader's system setting (light/dark)."""
    context = dict(config.html_context or {})
    context.setdefault("default_mode", "auto")
    config.html_context = context


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """sphinx-thebe adds its inline configuration twice, and the second ``const THEBE_JS_URL``
    throws a SyntaxError in every page's console; keep the first copy of each script."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        attributes = getattr(script, "attributes", {}) or {}
        filename = getattr(script, "filename", script) or ""  # an inline script: None or ""
        key = (str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    scripts[:] = kept  # in place: handlers that run later add to this same list


LIVE_PANEL = 'class="selfattn-livemodel"'
LIVE_RUNTIME = (f"{VENDOR}/onnxruntime-web/dist/ort.wasm.min.js", f"{VENDOR}/onnxruntime-web/ort-wasm-embedded.js")


def _live_model_script(app, pagename, templatename, context, doctree) -> None:
    """Add ``selfattn-live.js`` to the pages that show a live model panel, and to no other page: the
    runtime it loads is about 5 MB (Sphinx adds a file to one page when called from this event)."""
    if LIVE_PANEL in (context.get("body") or ""):
        app.add_js_file("selfattn-live.js")


def _poll_kernel_replies_in_slices() -> None:
    """Make the notebook executor re-check its kernel sockets every second.

    Seen here on a loaded 2-core machine, with ipykernel 6 and 7 alike: the build's executor
    (nbclient, asyncio ZMQ sockets) sometimes missed the wake-up for a kernel's reply and slept until
    the cell timeout (900 s) ran out, then found the reply waiting and went on. The kernel was idle
    all along, and a run of the same notebook on its own took seconds. nbclient waits in one long
    ``socket.poll(timeout)``; polling in one-second slices up to the same deadline bounds the cost
    of a missed wake-up to a second and changes nothing else (same messages, same timeout, same
    ``Empty`` at the deadline). pytest's nbval uses the blocking client and is not affected.
    """
    from queue import Empty
    from time import monotonic

    from jupyter_client.channels import AsyncZMQSocketChannel

    if getattr(AsyncZMQSocketChannel.get_msg, "_selfattn_sliced", False):
        return

    async def get_msg(self, timeout: float | None = None):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            remaining = 1.0 if deadline is None else max(0.0, deadline - monotonic())
            if await self.socket.poll(int(min(remaining, 1.0) * 1000)):
                return await self._recv()
            if deadline is not None and monotonic() >= deadline:
                raise Empty

    get_msg._selfattn_sliced = True
    AsyncZMQSocketChannel.get_msg = get_msg


def setup(app):
    _poll_kernel_replies_in_slices()
    # The notebooks are executed two at a time before Sphinx reads them (selfattn_parallel_exec);
    # its worker processes apply the same kernel-reply fix.
    import selfattn_parallel_exec

    patch = f"{__name__}:{_poll_kernel_replies_in_slices.__name__}"
    if patch not in selfattn_parallel_exec.WORKER_PATCHES:
        selfattn_parallel_exec.WORKER_PATCHES.append(patch)
    app.setup_extension("selfattn_parallel_exec")
    app.connect("config-inited", _theme_defaults)
    app.connect("builder-inited", _stage_static)
    # Early: Sphinx stops calling html-page-context handlers at the first that returns a template.
    app.connect("html-page-context", _dedupe_scripts, priority=100)
    app.connect("html-page-context", _live_model_script)
    app.add_js_file(f"{VENDOR}/plotly.min.js", priority=100)
    app.add_css_file("selfattn.css")
    # The keyboard twins of plotly's sliders and menus follow the figure's own controls (book/_static).
    app.add_js_file("selfattn-controls-sync.js")
    # Titles and legends wider than a figure are wrapped or moved under the plot (issue 31, book/_static).
    app.add_js_file("selfattn-figure-fit.js")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
