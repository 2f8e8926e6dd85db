"""Execute the book's notebooks a few at a time, in fresh kernels, at every build.

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
  slow each other down. The executed notebooks are kept in memory for this build only.
- ``source-read``: Sphinx hands MyST-NB the executed notebook instead of the stored one, and
  MyST-NB's mode is ``off`` for this build, so it renders that notebook and writes it to
  ``_build/jupyter_execute/`` exactly as force mode renders and writes the notebook it has just
  executed in place. Nothing is cached: every build executes every notebook it reads (a change in
  ``src/`` is always picked up), and which notebooks are read is Sphinx's choice, as before.
- a notebook that fails (a cell error or a timeout) fails the build as
  ``nb_execution_raise_on_error`` does: MyST-NB's ``ExecutionError(<path>)`` is raised from
  nbclient's ``CellExecutionError``/``CellTimeoutError``, so ``scripts/build_book.py`` names the
  notebook, cell, line and exception as before. When several fail, the first in reading order is
  raised and the others are named in the log.

(MyST-NB's ``cache`` mode, fed with these executions, is not used: in MyST-NB 1.4 it renders the
cached outputs but writes the *unexecuted* notebook to ``jupyter_execute/``, because it merges the
outputs into a copy while ``sphinx_.py`` writes the notebook it read.)

Nothing changes (MyST-NB executes each notebook itself, serially) when the configured mode is not
``force``, with ``SELFATTN_BOOK_JOBS=1``, or when a notebook to be read sets execution options in
its own ``mystnb`` metadata. A notebook excluded by ``execution_excludepatterns`` is not executed,
as in force mode.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path, PurePosixPath

JOBS_VAR = "SELFATTN_BOOK_JOBS"
DEFAULT_JOBS = 2
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
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


def execute_in_parallel(app, env, docnames) -> None:
    """``env-before-read-docs``: execute the notebooks about to be read, N at a time."""
    from myst_nb.core.execute import ExecutionError
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    _forget(app, None)
    config = env.mystnb_config
    n = jobs()
    if config.execution_mode != "force" or n < 2:
        return
    chosen = _to_execute(env, docnames)
    if not chosen:
        return
    logger.info(f"Executing {len(chosen)} notebook(s), {n} at a time, one BLAS/OpenMP thread each")
    results: dict[str, dict] = {}
    context = multiprocessing.get_context("spawn")  # a clean process: no state of Sphinx's
    with ProcessPoolExecutor(max_workers=n, mp_context=context, initializer=_init_worker,
                             initargs=(list(WORKER_PATCHES),)) as pool:
        futures = {pool.submit(_execute, str(chosen[docname]), config.execution_timeout, config.execution_allow_errors,
                               config.execution_in_temp): docname
                   for docname in start_order(chosen, app.config.selfattn_execute_first)}
        try:
            for future in as_completed(futures):
                docname = futures[future]
                result = results[docname] = future.result()
                if result["error"]:
                    logger.info(f"{chosen[docname]}: failed after {result['time']:.2f} seconds "
                                f"({result['error']['type']}) [parallel]")
                else:
                    logger.info(f"{chosen[docname]}: Executed notebook in {result['time']:.2f} seconds [parallel]")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    failed = [d for d in chosen if results[d]["error"]]  # in reading order
    if failed:
        for other in failed[1:]:
            logger.info(f"{chosen[other]}: also failed ({results[other]['error']['type']})")
        first = failed[0]
        raise ExecutionError(str(chosen[first])) from _rebuild_error(results[first]["error"])

    _EXECUTED.update({docname: results[docname]["notebook"] for docname in chosen})
    _NOT_EXECUTED.update(d for d in docnames if d not in chosen)
    env.mystnb_config = config.copy(execution_mode="off")  # this build's notebooks are executed


def substitute_executed(app, docname, source) -> None:
    """``source-read``: MyST-NB parses (renders, writes to jupyter_execute/) the executed notebook."""
    if docname in _EXECUTED:
        source[0] = _EXECUTED.pop(docname)
    elif app.env.mystnb_config.execution_mode == "off" and docname not in _NOT_EXECUTED \
            and Path(app.env.doc2path(docname)).suffix == ".ipynb" and app.config.nb_execution_mode == "force":
        # Read although not announced in env-before-read-docs: it would be rendered unexecuted.
        raise RuntimeError(f"{docname}: read but not executed beforehand (selfattn_parallel_exec)")


def _forget(app, exception) -> None:
    _EXECUTED.clear()
    _NOT_EXECUTED.clear()


def setup(app):
    app.add_config_value("selfattn_execute_first", [], "env")
    app.connect("env-before-read-docs", execute_in_parallel, priority=900)  # after the other handlers
    app.connect("source-read", substitute_executed)
    app.connect("build-finished", _forget)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
