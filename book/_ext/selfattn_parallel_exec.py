"""Execute the book's notebooks a few at a time, in fresh kernels, and keep the executions from
one build to the next in a cache that a change to the package's source cannot outlive.

With ``execute_notebooks: force`` MyST-NB executes each notebook while Sphinx reads it, one after
another: on a 2-core machine one core idles through most of the build. This extension does the
same execution just before the read, N notebooks at a time (``SELFATTN_BOOK_JOBS``, default 2, at
most the number of usable CPUs), and MyST-NB then renders the executed notebooks:

- ``env-before-read-docs``: every notebook Sphinx is about to read is executed, each in its own
  process and kernel, by ``jupyter_cache.executors.utils.single_nb_execution``, the function
  MyST-NB's force mode calls, with the same arguments (the configured timeout and allow_errors,
  the notebook's folder as working directory or a temporary one with ``execution_in_temp``,
  ``meta_override=True``). Each kernel has one BLAS/OpenMP thread (``OMP_NUM_THREADS=1``,
  ``MKL_NUM_THREADS=1``): N kernels already use N cores, and oversubscribed OpenMP threads spin and
  slow each other down. As each notebook finishes, a line says ``chapter i/n <docname> done in Xs
  (total Ys)`` (Y: seconds since the build started), so that a long build on a busy machine shows
  where it is.
- ``source-read``: Sphinx hands MyST-NB the executed notebook instead of the stored one, and
  MyST-NB's mode is ``off`` for this build, so it renders that notebook and writes it to
  ``_build/jupyter_execute/`` exactly as force mode renders and writes the notebook it has just
  executed in place. Which notebooks are read is Sphinx's choice, as before (`make book` passes
  ``--all``: a fresh Sphinx environment, every page is read again at every build).
- a notebook that fails (a cell error or a timeout) fails the build as
  ``nb_execution_raise_on_error`` does: MyST-NB's ``ExecutionError(<path>)`` is raised from
  nbclient's ``CellExecutionError``/``CellTimeoutError``, so ``scripts/build_book.py`` names the
  notebook, cell, line and exception as before. When several fail, the first in reading order is
  raised and the others are named in the log.

The cache (``execute_notebooks: cache``, the book's mode). The executions are kept in a
jupyter-cache database, as MyST-NB's cache mode keeps them, but jupyter-cache matches a notebook on
its code cells (and kernelspec) only: after a change to ``src/`` it would serve the outputs of the
old package. So the database lives in a folder named after a hash of everything else an execution
depends on (``inputs_key``): every file under the paths of ``selfattn_execution_inputs``
(``_config.yml``: ``src`` -- the chapters import ``selfattn`` as a whole, so which chapter uses which
file cannot be told and a change to any file re-executes every chapter --, ``bench``, whose results
chapters 09 and 10 read, and the book's extension), the Python version and every installed
distribution with its version, and the execution settings (timeout, allow_errors, run_in_temp,
the kernels' thread variables). The folder is
``<execution cache path>/selfattn-<key>``, by default ``_build/.jupyter_cache/selfattn-<key>``;
a build under another key starts an empty database and removes the other ``selfattn-*`` folders.
Within a key, a notebook whose code cells changed is not matched and is executed again; only
executions that succeeded are stored (each as it finishes, so a build that fails keeps the
others). A notebook read from the cache is rendered from the stored notebook with its outputs
merged in (``merge_match_into_notebook``, as MyST-NB's cache mode does), and written to
``jupyter_execute/`` like an executed one. ``make clean`` (or removing ``_build``) clears it; a
fresh clone has no ``_build`` and so executes everything.

(MyST-NB's own ``cache`` mode is never left to run: besides the key above, in MyST-NB 1.4 it renders
the cached outputs but writes the *unexecuted* notebook to ``jupyter_execute/``, because it merges the
outputs into a copy while ``sphinx_.py`` writes the notebook it read. In cache mode this extension
executes even with ``SELFATTN_BOOK_JOBS=1``, one notebook at a time, and refuses a notebook that sets
execution options in its own ``mystnb`` metadata.)

In ``force`` mode nothing is kept: every build executes every notebook it reads. MyST-NB executes
each notebook itself, serially, when the mode is ``force`` and ``SELFATTN_BOOK_JOBS=1`` or a
notebook to be read sets execution options in its own ``mystnb`` metadata, and in the other modes
(``off``, ``auto``, ``inline``). A notebook excluded by ``execution_excludepatterns`` is not
executed, as in MyST-NB.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path, PurePosixPath

JOBS_VAR = "SELFATTN_BOOK_JOBS"
DEFAULT_JOBS = 2
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CACHE_PREFIX = "selfattn-"  # <execution cache path>/selfattn-<inputs_key>: one jupyter-cache database
CACHE_FORMAT = "1"  # part of the key: raise it when what a cached execution means changes
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache", ".hypothesis"}
_T0 = time.monotonic()  # reset in setup(): the "total" of the progress lines counts from there
# "module:function"s called in each worker before it executes anything: spawned processes do not
# inherit the monkeypatches made in Sphinx's process (selfattn_book adds its kernel-reply fix).
WORKER_PATCHES: list[str] = []
_EXECUTED: dict[str, str] = {}  # docname -> executed notebook (JSON), this build only
_NOT_EXECUTED: set[str] = set()  # docnames read as they are (not notebooks, or excluded)


def jobs() -> int:
    """How many notebooks to execute at a time: ``SELFATTN_BOOK_JOBS``, else min(2, usable CPUs)."""
    raw = os.environ.get(JOBS_VAR, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{JOBS_VAR} must be a whole number >= 1, got {raw!r}")
        return n
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    return max(1, min(DEFAULT_JOBS, cpus))


def _hash_files(root: Path, rel: str, digest) -> None:
    """Feed ``digest`` with the relative path and bytes of every file under ``root/rel``, in order."""
    path = root / rel
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(
            f for f in path.rglob("*")
            if f.is_file() and not SKIPPED_DIRS.intersection(f.relative_to(path).parts[:-1])
            and f.suffix != ".pyc"
        )
    else:
        digest.update(f"missing {rel}\n".encode())
        return
    for f in files:
        digest.update(f"file {f.relative_to(root).as_posix()} {f.stat().st_size}\n".encode())
        digest.update(f.read_bytes())


def inputs_key(root: Path, inputs, timeout, allow_errors, in_temp) -> str:
    """A hash of what an execution depends on besides the notebook's code cells (see the module's
    docstring): the files under ``inputs`` (paths relative to ``root``), Python and the installed
    distributions, and the execution settings."""
    digest = hashlib.sha256()
    digest.update(f"format {CACHE_FORMAT}\npython {sys.version}\n".encode())
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                    if d.metadata["Name"]})
    digest.update(("\n".join(dists) + "\n").encode())
    digest.update(f"timeout {timeout} allow_errors {allow_errors} in_temp {in_temp} {sorted(ONE_THREAD.items())}\n"
                  .encode())
    for rel in inputs:
        _hash_files(root, str(rel), digest)
    return digest.hexdigest()[:20]


def _open_cache(cache_root: Path, key: str):
    """The jupyter-cache database of this key; the other keys' folders are removed."""
    from jupyter_cache import get_cache

    if cache_root.is_dir():
        for other in cache_root.glob(f"{CACHE_PREFIX}*"):
            if other.is_dir() and other.name != f"{CACHE_PREFIX}{key}":
                shutil.rmtree(other, ignore_errors=True)
    return get_cache(str(cache_root / f"{CACHE_PREFIX}{key}"))


def _init_worker(patches: list[str]) -> None:
    """Runs once in each worker process (spawned: no state shared with Sphinx's process)."""
    os.environ.update(ONE_THREAD)  # read by the kernels this process starts (torch, NumPy's BLAS)
    for patch in patches:
        module, _, name = patch.partition(":")
        getattr(__import__(module, fromlist=[name]), name)()


def _execute(path: str, timeout: int | None, allow_errors: bool, in_temp: bool) -> dict:
    """Execute one notebook as MyST-NB's force mode does; return it as JSON, or the error."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.reads(Path(path).read_text(encoding="utf8"), as_version=4)
    with tempfile.TemporaryDirectory() as temp:
        cwd = temp if in_temp else str(Path(path).parent)
        result = single_nb_execution(nb, cwd=os.path.abspath(cwd), timeout=timeout,
                                     allow_errors=allow_errors, meta_override=True)
    out: dict = {"time": result.time, "notebook": None, "error": None}
    if result.err is None:
        out["notebook"] = nbformat.writes(result.nb)
    else:  # nbclient's exceptions do not survive pickling (CellExecutionError takes 3 arguments)
        err = result.err
        out["error"] = {"type": type(err).__name__, "text": str(err),
                        "ename": getattr(err, "ename", ""), "evalue": getattr(err, "evalue", "")}
    return out


def _rebuild_error(error: dict) -> Exception:
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    if error["type"] == "CellExecutionError":
        return CellExecutionError(error["text"], error["ename"], error["evalue"])
    if error["type"] == "CellTimeoutError":
        return CellTimeoutError(error["text"])
    return RuntimeError(f"{error['type']}: {error['text']}")


def _to_execute(env, docnames) -> dict[str, Path] | None:
    """docname -> path of the notebooks force mode would execute; None if one sets its own options."""
    import nbformat

    config = env.mystnb_config
    chosen: dict[str, Path] = {}
    for docname in docnames:
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb" or not path.is_file():
            continue
        if any(PurePosixPath(path.as_posix()).match(p) for p in config.execution_excludepatterns):
            continue
        own = nbformat.reads(path.read_text(encoding="utf8"), as_version=4).metadata.get(config.metadata_key)
        if own and any(str(key).startswith("execution") for key in own):
            return None
        chosen[docname] = path
    return chosen


def start_order(chosen, first) -> list[str]:
    """The order in which the notebooks start: the documents named in ``first`` (``_config.yml``'s
    ``selfattn_execute_first``, the slowest chapters, slowest first) before the others, which keep
    their reading order. Starting the longest jobs first keeps one long chapter from running alone
    at the end while the other worker idles."""
    hinted = [d for d in first if d in chosen]
    return hinted + [d for d in chosen if d not in hinted]


def _progress(i: int, n: int, docname: str, what: str) -> str:
    return f"chapter {i}/{n} {docname} {what} (total {time.monotonic() - _T0:.0f}s)"


def execute_in_parallel(app, env, docnames) -> None:
    """``env-before-read-docs``: execute the notebooks about to be read, N at a time, or take their
    executions from the cache (``cache`` mode)."""
    import nbformat
    from myst_nb.core.execute import ExecutionError
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    _forget(app, None)
    config = env.mystnb_config
    mode = config.execution_mode
    n = jobs()
    if mode not in ("force", "cache") or (mode == "force" and n < 2):
        return
    chosen = _to_execute(env, docnames)
    if chosen is None and mode == "cache":
        raise RuntimeError("selfattn_parallel_exec: a notebook sets execution options in its own mystnb "
                           "metadata, which the cache mode does not support (see the extension's docstring)")
    if not chosen:
        return
    total = len(chosen)
    done = 0
    notebooks: dict[str, str] = {}  # docname -> executed or cached notebook (JSON)
    cache = None
    if mode == "cache":
        key = inputs_key(Path(app.srcdir), app.config.selfattn_execution_inputs, config.execution_timeout,
                         config.execution_allow_errors, config.execution_in_temp)
        cache = _open_cache(Path(config.execution_cache_path), key)
        for docname, path in chosen.items():
            nb = nbformat.reads(path.read_text(encoding="utf8"), as_version=4)
            try:
                _, merged = cache.merge_match_into_notebook(nb)
            except KeyError:  # not executed under this key with these code cells
                continue
            notebooks[docname] = nbformat.writes(merged)
            done += 1
            logger.info(_progress(done, total, docname, "from the cache"))
    to_run = {d: p for d, p in chosen.items() if d not in notebooks}
    where = f"; {len(notebooks)} of {total} from the cache in {cache.path}" if cache is not None else ""
    logger.info(f"Executing {len(to_run)} notebook(s), {n} at a time, one BLAS/OpenMP thread each{where}")
    results: dict[str, dict] = {}
    if to_run:
        context = multiprocessing.get_context("spawn")  # a clean process: no state of Sphinx's
        with ProcessPoolExecutor(max_workers=n, mp_context=context, initializer=_init_worker,
                                 initargs=(list(WORKER_PATCHES),)) as pool:
            futures = {pool.submit(_execute, str(to_run[docname]), config.execution_timeout,
                                   config.execution_allow_errors, config.execution_in_temp): docname
                       for docname in start_order(to_run, app.config.selfattn_execute_first)}
            try:
                for future in as_completed(futures):
                    docname = futures[future]
                    result = results[docname] = future.result()
                    done += 1
                    if result["error"]:
                        logger.info(_progress(done, total, docname, f"failed after {result['time']:.1f}s "
                                                                    f"({result['error']['type']})"))
                        continue
                    notebooks[docname] = result["notebook"]
                    if cache is not None:  # stored as it finishes: a later failure keeps it
                        from jupyter_cache.base import CacheBundleIn

                        cache.cache_notebook_bundle(
                            CacheBundleIn(nbformat.reads(result["notebook"], as_version=4), str(to_run[docname]),
                                          data={"execution_seconds": result["time"]}),
                            check_validity=False, overwrite=True)
                    logger.info(_progress(done, total, docname, f"done in {result['time']:.1f}s"))
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise

    failed = [d for d in to_run if results[d]["error"]]  # in reading order
    if failed:
        for other in failed[1:]:
            logger.info(f"{to_run[other]}: also failed ({results[other]['error']['type']})")
        first = failed[0]
        raise ExecutionError(str(to_run[first])) from _rebuild_error(results[first]["error"])

    _EXECUTED.update({docname: notebooks[docname] for docname in chosen})
    _NOT_EXECUTED.update(d for d in docnames if d not in chosen)
    env.mystnb_config = config.copy(execution_mode="off")  # this build's notebooks are executed


def substitute_executed(app, docname, source) -> None:
    """``source-read``: MyST-NB parses (renders, writes to jupyter_execute/) the executed notebook."""
    if docname in _EXECUTED:
        source[0] = _EXECUTED.pop(docname)
    elif app.env.mystnb_config.execution_mode == "off" and docname not in _NOT_EXECUTED \
            and Path(app.env.doc2path(docname)).suffix == ".ipynb" \
            and app.config.nb_execution_mode in ("force", "cache"):
        # Read although not announced in env-before-read-docs: it would be rendered unexecuted.
        raise RuntimeError(f"{docname}: read but not executed beforehand (selfattn_parallel_exec)")


def _forget(app, exception) -> None:
    _EXECUTED.clear()
    _NOT_EXECUTED.clear()


def setup(app):
    global _T0
    _T0 = time.monotonic()
    app.add_config_value("selfattn_execute_first", [], "env")
    # Paths (relative to the book's folder) whose files the executions depend on: part of the cache key.
    app.add_config_value("selfattn_execution_inputs", ["src"], "env")
    app.connect("env-before-read-docs", execute_in_parallel, priority=900)  # after the other handlers
    app.connect("source-read", substitute_executed)
    app.connect("build-finished", _forget)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
