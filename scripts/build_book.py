"""Build the book (`jupyter-book build`) and, when it fails, end with a short summary of why.

Usage: python scripts/build_book.py [BOOK_DIR] [jupyter-book build options...]
       (default: `. -W -n --keep-going`; `make book` runs it.)

Why: with `nb_execution_raise_on_error: true`, a failing notebook cell makes MyST-NB raise
``ExecutionError(<notebook path>)`` from nbclient's ``CellExecutionError``. Sphinx prints that under
its "Exception occurred ... please report this" banner and Jupyter Book closes with "There was an
error in building your book. Look above for the cause", so the failing cell and its assertion sit in
the middle of some 150 lines. (With ``raise_on_error`` false, MyST-NB instead warns and writes the
traceback to ``_build/html/reports/<docname>.err.log``; both forms are read here.)

The build's own output is streamed unchanged and saved to ``<build>/book-build.log``. On failure the
last lines printed are, for each failing notebook::

    FAILED: notebooks/08_x.ipynb, cell 3 (code cell 2), line 2:
        assert x == y, f"x is {x}, not {y}"
    AssertionError: x is 1, not 2

(cells are counted from 1, markdown cells included, as a reader counts them in the notebook), or,
when no notebook failed, the build's warnings (errors under ``-W``). The exit status is the build's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FLAGS = ["-W", "-n", "--keep-going"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# MyST-NB: `raise ExecutionError(str(self.path)) from result.err` (nb_execution_raise_on_error).
EXECUTION_ERROR = re.compile(r"^myst_nb\.core\.execute\.base\.ExecutionError: (?P<path>.+)$", re.M)
# MyST-NB without raise_on_error: a warning naming the saved traceback.
REPORT_SAVED = re.compile(r"Notebook exception traceback saved in: (?P<path>\S+)")
# nbclient.exceptions.CellExecutionError: the cell's source between two dashed rules, then the
# kernel's traceback ending in "ExceptionName: message".
CELL_BLOCK = re.compile(
    r"An error occurred while executing the following cell:\n-{3,}\n(?P<source>.*?)\n-{3,}\n(?P<tb>.*)",
    re.S,
)
TIMEOUT_PREVIEW = re.compile(r"Here is a preview of the cell contents:\n-{3,}\n(?P<source>.*?)\n-{3,}", re.S)
CELL_FRAME = re.compile(r"Cell In\s*\[(?P<count>\d*)\], line (?P<line>\d+)")
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Iteration))(: (?P<msg>.*))?$")
SPHINX_WARNING = re.compile(r": (WARNING|ERROR|CRITICAL):")


@dataclass
class Failure:
    notebook: str  # path as given, relative to the book when it is inside it
    cell: int | None = None  # 1-based index among all cells
    code_cell: int | None = None  # 1-based index among code cells
    line_no: int | None = None  # 1-based line within the cell
    line: str | None = None  # the failing source line
    error: str = ""  # "AssertionError: message"

    def lines(self) -> list[str]:
        where = self.notebook
        if self.cell is not None:
            where += f", cell {self.cell} (code cell {self.code_cell})"
        if self.line_no is not None:
            where += f", line {self.line_no}"
        out = [f"FAILED: {where}:"]
        if self.line is not None:
            out.append(f"    {self.line.strip()}")
        out.append(self.error or "(no exception message found; see the log)")
        return out


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def _exception(traceback: str) -> str:
    """The last "Name: message" line of a kernel traceback (the message may span lines)."""
    lines = traceback.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = EXCEPTION_LINE.match(lines[i].strip())
        if m and not lines[i].startswith(" "):
            rest = [ln for ln in lines[i + 1:] if ln.strip()]
            return "\n".join([lines[i].strip(), *rest]) if rest else lines[i].strip()
    last = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(" ")]
    return last[-1] if last else ""  # an exception class named otherwise: its line is the last one


def _locate(notebook: Path, source: str, *, prefix: bool = False) -> tuple[int | None, int | None]:
    """1-based (cell, code cell) of the code cell whose source is ``source`` (or starts with it)."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf8"))["cells"]
    except (OSError, ValueError, KeyError):
        return None, None
    code = 0
    for i, cell in enumerate(cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        code += 1
        text = cell.get("source", "")
        text = "".join(text) if isinstance(text, list) else text
        if text.strip() == source.strip() or (prefix and text.strip().startswith(source.strip())):
            return i, code
    return None, None


def parse_cell_error(text: str, notebook: Path, name: str) -> Failure:
    """Read nbclient's CellExecutionError text (from the build output or a report file)."""
    text = strip_ansi(text)
    failure = Failure(notebook=name)
    block = CELL_BLOCK.search(text)
    if not block:  # a timeout or a dead kernel: no cell block, only the exception
        tail = text.split("The above exception was the direct cause")[0]
        m = re.search(r"nbclient\.exceptions\.(\w+): (.*)", tail)
        failure.error = f"{m.group(1)}: {m.group(2).strip()}" if m else _exception(tail)
        preview = TIMEOUT_PREVIEW.search(tail)  # a timeout shows the cell's first lines
        if preview and preview.group("source").strip():
            failure.cell, failure.code_cell = _locate(notebook, preview.group("source"), prefix=True)
            failure.line = preview.group("source").splitlines()[0]
        return failure
    source, tb = block.group("source"), block.group("tb")
    tb = tb.split("The above exception was the direct cause")[0]
    failure.cell, failure.code_cell = _locate(notebook, source)
    frame = CELL_FRAME.search(tb)
    if frame:
        failure.line_no = int(frame.group("line"))
        src_lines = source.splitlines()
        if 1 <= failure.line_no <= len(src_lines):
            failure.line = src_lines[failure.line_no - 1]
    failure.error = _exception(tb)
    return failure


def _relative(path: Path, book: Path) -> str:
    try:
        return str(path.resolve().relative_to(book.resolve()))
    except ValueError:
        return str(path)


def failures_from_output(output: str, book: Path, reports: Path | None = None) -> list[Failure]:
    """Every failing notebook named in the build output (and in MyST-NB's report files)."""
    output = strip_ansi(output)
    found: list[Failure] = []
    seen: set[str] = set()
    for m in EXECUTION_ERROR.finditer(output):
        path = Path(m.group("path").strip())
        if str(path) in seen:
            continue
        seen.add(str(path))
        found.append(parse_cell_error(output, path, _relative(path, book)))
    report_files = [Path(m.group("path")) for m in REPORT_SAVED.finditer(output)]
    if reports is not None and reports.is_dir():
        report_files += sorted(reports.rglob("*.err.log"))
    for report in dict.fromkeys(report_files):
        if not report.is_file():
            continue
        docname = _relative(report, reports) if reports is not None else report.name
        docname = docname.removesuffix(".err.log")
        path = book / f"{docname}.ipynb"
        if str(path) in seen or str(path.resolve()) in seen:
            continue
        seen.add(str(path))
        found.append(parse_cell_error(report.read_text(encoding="utf8"), path, _relative(path, book)))
    return found


def summary(output: str, returncode: int, book: Path, reports: Path | None, log: Path) -> list[str]:
    """The lines printed last when the build failed."""
    failures = failures_from_output(output, book, reports)
    lines = ["", "=" * 79, f"The book did not build (exit status {returncode}); full log: {log}"]
    if failures:
        for failure in failures:
            lines += failure.lines()
        return lines
    warnings = [ln for ln in strip_ansi(output).splitlines() if SPHINX_WARNING.search(ln)]
    if warnings:
        lines.append(f"FAILED: {len(warnings)} warning(s), errors under -W; the first:")
        lines += warnings[:10]
    else:
        last = [ln for ln in strip_ansi(output).splitlines() if ln.strip()][-5:]
        lines.append("FAILED: no notebook or warning named; the build's last lines:")
        lines += last
    return lines


def _build_dir(book: Path, options: list[str]) -> Path:
    if "--path-output" in options:
        i = options.index("--path-output")
        if i + 1 < len(options):
            return Path(options[i + 1]) / "_build"
    return book / "_build"


def _jupyter_book() -> str:
    exe = Path(sys.executable).with_name("jupyter-book")
    return str(exe) if exe.exists() else "jupyter-book"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    book = Path(argv.pop(0)) if argv and not argv[0].startswith("-") else Path(".")
    options = argv or list(DEFAULT_FLAGS)
    build = _build_dir(book, options)
    build.mkdir(parents=True, exist_ok=True)
    log = build / "book-build.log"
    reports = build / "html" / "reports"
    if reports.is_dir():  # reports of an earlier build would name notebooks that now pass
        for old in reports.rglob("*.err.log"):
            old.unlink()
    cmd = [_jupyter_book(), "build", str(book), *options]
    chunks: list[str] = []
    with log.open("w", encoding="utf8") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf8", errors="replace", bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
            chunks.append(line)
        returncode = proc.wait()
    if returncode != 0:
        sys.stdout.flush()
        print("\n".join(summary("".join(chunks), returncode, book, reports, log)), flush=True)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
