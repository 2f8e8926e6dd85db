"""Fetch the JavaScript the book serves itself (so it reads offline) into ``<venv>/share/selfattn-vendor``.

The book's Sphinx extension (``book/_ext/selfattn_book.py``) copies these files into
``_build/html/_static/selfattn-vendor/``; ``_config.yml`` points MathJax and the ipywidgets
manager at them. plotly.js is not fetched here: it ships inside the installed ``plotly`` package.

Each package is fetched with ``npm pack`` from the npm registry (the only network access), pinned
to a version and checked against its registry integrity hash, then only the files the pages load
are extracted. Run by the Makefile's install step (``make vendor``); idempotent. onnxruntime-web's
WebAssembly glue and binary are then wrapped into one classic script (``embed_onnxruntime``), so
that the live model of chapter 14 runs from ``file://`` too.

Usage: ``python scripts/vendor_js.py [--dest DIR]`` (default: ``sys.prefix/share/selfattn-vendor``).
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# name, version, registry integrity (sha512), target folder, globs inside the tarball's "package/".
PACKAGES = [
    (
        "requirejs", "2.3.7",
        "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
        "requirejs", ["require.js", "README.md", "package.json"],
    ),
    (
        # The version myst-nb 1.x loads from a CDN for ipywidgets 8 (embed-amd.js needs require.js).
        "@jupyter-widgets/html-manager", "1.0.6",
        "sha512-+Mn+Ra8wyIHrYaUpfmf9A3dsLkt/NuwzPQN8sthdxBD35VV5cOJbpmgMhNR27n/rmP3mKyEe0PWCJrtZrXTXDQ==",
        "html-manager", ["LICENSE", "package.json", "dist/embed-amd.js", "dist/*.woff2", "dist/*.woff",
                         "dist/*.ttf", "dist/*.eot", "dist/*.svg"],
    ),
    (
        # tex-mml-chtml.js plus what it loads on demand: fonts, TeX extensions, a11y and menu parts.
        "mathjax", "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        "mathjax", ["LICENSE", "package.json", "es5/tex-mml-chtml.js", "es5/a11y/*", "es5/input/*",
                    "es5/output/chtml/*", "es5/ui/*", "es5/adaptors/*", "es5/sre/*"],
    ),
    (
        # The live model of chapter 14 (selfattn.live, book/_static/selfattn-live.js): the WebAssembly
        # build's classic script, and the Emscripten glue (.mjs) and binary (.wasm) it loads. With one
        # thread and no proxy worker, this single-thread path uses exactly these three files.
        "onnxruntime-web", "1.30.0",
        "sha512-q0y+JrrtukXSzsBWEMccVfqX25LRmosXHF+CaRJmg8pZClzcV7svNc4rKY3jL02Vb7QmRMDs1SigqR4CXAfKYQ==",
        "onnxruntime-web", ["README.md", "package.json", "dist/ort.wasm.min.js", "dist/ort-wasm-simd-threaded.mjs",
                            "dist/ort-wasm-simd-threaded.wasm"],
    ),
]

# A page opened from file:// may not fetch() or import() other files (Chromium blocks both), so the
# runtime's glue and binary cannot be loaded as they ship. ``embed_onnxruntime`` wraps them into one
# classic script (which any page may load with <script src>): the glue as a string, imported from a
# blob: URL, and the binary gzipped and base64-encoded, unpacked with DecompressionStream. Written
# deterministically (gzip mtime 0) from the integrity-checked files; the raw .wasm is not kept.
ORT_EMBEDDED = "onnxruntime-web/ort-wasm-embedded.js"
# Bump when the wrapping changes, so that an existing vendor folder is rebuilt.
EMBED_FORMAT = 1

STAMP = "vendor.json"


def default_dest() -> Path:
    return Path(sys.prefix) / "share" / "selfattn-vendor"


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _wanted(member: str, globs: list[str]) -> str | None:
    if not member.startswith("package/"):
        return None
    rel = member[len("package/"):]
    if rel.endswith(".map"):
        return None
    return rel if any(fnmatch.fnmatch(rel, g) for g in globs) else None


def fetch(dest: Path) -> None:
    stamp = dest / STAMP
    wanted = {name: version for name, version, *_ in PACKAGES} | {"embed_format": EMBED_FORMAT}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        print(f"vendored JavaScript already in {dest}")
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm not found: install it (Debian: apt-get install -y npm) and rerun")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, version, integrity, folder, globs in PACKAGES:
            out = subprocess.run(
                [npm, "pack", f"{name}@{version}", "--json", "--pack-destination", tmp],
                check=True, capture_output=True, text=True,
            )
            tarball = Path(tmp) / json.loads(out.stdout)[0]["filename"]
            got = _integrity(tarball)
            if got != integrity:
                raise SystemExit(f"{name}@{version}: integrity {got} does not match the pinned {integrity}")
            with tarfile.open(tarball) as tar:
                for member in tar.getmembers():
                    rel = _wanted(member.name, globs)
                    if rel is None or not member.isfile():
                        continue
                    target = dest / folder / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())
            print(f"vendored {name}@{version} into {dest / folder}")
    embed_onnxruntime(dest)
    stamp.write_text(json.dumps(wanted, indent=1))


def embed_onnxruntime(dest: Path) -> Path:
    """Wrap onnxruntime-web's glue and binary into ``dest/ORT_EMBEDDED`` (see there); remove the raw .mjs and .wasm.

    The script sets ``window.selfattnOrtEmbedded = {version, mjs, wasm_gzip_base64, wasm_bytes}``.
    """
    folder = dest / "onnxruntime-web"
    version = json.loads((folder / "package.json").read_text())["version"]
    glue = (folder / "dist" / "ort-wasm-simd-threaded.mjs").read_text()
    wasm_path = folder / "dist" / "ort-wasm-simd-threaded.wasm"
    wasm = wasm_path.read_bytes()
    packed = base64.b64encode(gzip.compress(wasm, compresslevel=9, mtime=0)).decode("ascii")
    payload = {"version": version, "mjs": glue, "wasm_bytes": len(wasm), "wasm_gzip_base64": packed}
    text = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    target = dest / ORT_EMBEDDED
    target.write_text(
        f"/* onnxruntime-web {version} (MIT licence, see package.json): dist/ort-wasm-simd-threaded.mjs and\n"
        f"   dist/ort-wasm-simd-threaded.wasm ({len(wasm)} bytes), gzipped and base64-encoded by\n"
        "   scripts/vendor_js.py so that a page opened from file:// can load them. */\n"
        f"window.selfattnOrtEmbedded = {text};\n"
    )
    wasm_path.unlink()  # served inside the script only; the glue, too
    (folder / "dist" / "ort-wasm-simd-threaded.mjs").unlink()
    print(f"wrapped onnxruntime-web's wasm ({len(wasm):,} bytes) into {target} ({target.stat().st_size:,} bytes)")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=default_dest())
    fetch(parser.parse_args().dest)


if __name__ == "__main__":
    main()
