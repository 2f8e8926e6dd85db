"""The book's local Sphinx extension: serve plotly.js from the book itself, not from a CDN.

Figures are emitted by ``selfattn.viz``'s renderer as a ``text/html`` div that calls the global
``Plotly``. This extension copies the ``plotly.min.js`` that ships inside the installed ``plotly``
Python package (so its version always matches the figures' JSON) into the built site and loads it
on every page before any other script, in particular before require.js, which would otherwise make
plotly.js register as an AMD module instead of a global.
"""

from __future__ import annotations

import shutil
from pathlib import Path

VENDOR = "selfattn-vendor"


def _stage_static(app) -> None:
    import plotly

    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not source.is_file():
        raise FileNotFoundError(f"plotly.min.js not found at {source}; reinstall plotly")
    staged = Path(app.outdir).parent / "selfattn_static"
    (staged / VENDOR).mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, staged / VENDOR / "plotly.min.js")
    app.config.html_static_path.append(str(staged))


def setup(app):
    app.connect("builder-inited", _stage_static)
    app.add_js_file(f"{VENDOR}/plotly.min.js", priority=100)
    app.add_css_file("selfattn.css")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
