"""scripts/vendor_js.py's wrapping of onnxruntime-web for file:// pages: the classic script holds the
glue's text and the binary (gzip, base64) byte for byte, is the same bytes on every run, and the raw
files are not left to be served."""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vendor_js", ROOT / "scripts" / "vendor_js.py")
vendor_js = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vendor_js)

PREFIX = "window.selfattnOrtEmbedded = "


def _fake_package(dest: Path, wasm: bytes, glue: str) -> None:
    dist = dest / "onnxruntime-web" / "dist"
    dist.mkdir(parents=True)
    (dest / "onnxruntime-web" / "package.json").write_text(json.dumps({"version": "9.9.9"}))
    (dist / "ort-wasm-simd-threaded.mjs").write_text(glue)
    (dist / "ort-wasm-simd-threaded.wasm").write_bytes(wasm)


def test_embedded_runtime_holds_the_glue_and_binary_and_is_deterministic(tmp_path):
    wasm = bytes(range(256)) * 300 + b"\0asm"
    glue = 'export default function(){ return "</script>"; }\n'
    outputs = []
    for run in ("a", "b"):
        _fake_package(tmp_path / run, wasm, glue)
        target = vendor_js.embed_onnxruntime(tmp_path / run)
        assert target == tmp_path / run / vendor_js.ORT_EMBEDDED
        outputs.append(target.read_bytes())
        dist = tmp_path / run / "onnxruntime-web" / "dist"
        assert not (dist / "ort-wasm-simd-threaded.wasm").exists() and not (dist / "ort-wasm-simd-threaded.mjs").exists()
    assert outputs[0] == outputs[1]  # gzip with mtime 0: the same bytes every time
    text = outputs[0].decode()
    assert "</script>" not in text  # safe inside a page too
    line = next(x for x in text.splitlines() if x.startswith(PREFIX))
    payload = json.loads(line[len(PREFIX):].rstrip(";"))
    assert payload["version"] == "9.9.9" and payload["mjs"] == glue and payload["wasm_bytes"] == len(wasm)
    assert gzip.decompress(base64.b64decode(payload["wasm_gzip_base64"])) == wasm


def test_onnxruntime_web_is_pinned_with_its_integrity():
    entry = next(p for p in vendor_js.PACKAGES if p[0] == "onnxruntime-web")
    name, version, integrity, folder, globs = entry
    assert version == "1.30.0" and integrity.startswith("sha512-") and folder == "onnxruntime-web"
    assert {"dist/ort.wasm.min.js", "dist/ort-wasm-simd-threaded.mjs", "dist/ort-wasm-simd-threaded.wasm"} <= set(globs)
