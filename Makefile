# The README's two commands: `make book` builds the book, `make test` runs the whole test suite.
# Each creates .venv and installs what it needs; nothing else has to be installed first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The CPU build of torch. An unpinned torch would pull a multi-GB CUDA build; pyproject only has a
# lower bound (Colab brings its own torch), so the CPU build is put in place first. PyPI's Linux wheel
# of a version is the CUDA build; the PyTorch CPU index has the same version as "+cpu", which pip
# prefers (a wheel of it on the machine's find-links does too). requirements.txt and
# binder/requirements.txt pin the same version (tests/unit/test_packaging.py checks it). Only torch
# is looked up there (--no-deps): its own dependencies come from PyPI with the project's install.
TORCH  ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# --all: a fresh Sphinx environment at every build, so every page is read and rendered again (and
# warnings of pages that did not change still fail the build under -W). Executing the chapters is
# what takes the time, and that is cached (_config.yml's `execute_notebooks: cache`): a chapter is
# executed again only when its code cells changed or anything it depends on did (a file under src/,
# bench/ or book/_ext, Python or an installed package; book/_ext/selfattn_parallel_exec.py keys the
# cache on them). The cache is _build/.jupyter_cache; `make clean` removes it with the rest of _build.
BOOK_FLAGS := -W -n --keep-going --all

.PHONY: book test test-fast nbval lint bench clean vendor browser

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH)"
	touch $@

$(VENV)/.book: pyproject.toml $(VENV)/.torch
	$(PIP) install -e ".[book]"
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.torch
	$(PIP) install -e ".[book,test]"
	touch $@

# The JavaScript the book serves itself so that it reads offline (require.js, the ipywidgets HTML
# manager, MathJax): pinned and integrity-checked `npm pack` from the npm registry into
# $(VENV)/share/selfattn-vendor (scripts/vendor_js.py); book/_ext copies it into the site.
# Debian's npm is installed first when it is missing and we are root.
$(VENV)/.vendor: scripts/vendor_js.py | $(PY)
	command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q npm; } \
	  || { echo "npm is needed to fetch the book's JavaScript: install it (apt-get install npm)"; exit 1; }
	$(PY) scripts/vendor_js.py
	touch $@

vendor: $(VENV)/.vendor

# The browser tests drive Debian's chromium (Playwright's own browser download is not used).
# Installed when missing and we are root; otherwise tests/book skips them (and fails in CI).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q chromium; } \
	  || echo "chromium is not installed and we are not root: the browser tests will be skipped (fail in CI)"

# scripts/build_book.py runs `jupyter-book build` and, when a notebook fails, ends with the notebook,
# cell, source line and exception (Sphinx buries them mid-traceback); the log is _build/book-build.log.
# The notebooks that are not in the cache are executed two at a time, one BLAS/OpenMP thread per
# kernel, by the book's extension book/_ext/selfattn_parallel_exec.py (SELFATTN_BOOK_JOBS=N: N at a
# time; 1: one after another), which prints "chapter i/n <name> done in Xs (total Ys)" as each ends.
book: $(VENV)/.book $(VENV)/.vendor
	$(PY) scripts/build_book.py . $(BOOK_FLAGS)

lint: $(VENV)/.test
	$(VENV)/bin/ruff check src tests bench notebooks

# The book is built from scratch (every chapter executed, warnings are errors; log in
# _build/book-build.log, exit status in _build/book-build.rc) while the unit, parity and chapter tests
# run on 3 workers (a third hides the waits of the tests that ask pip to resolve packages from the
# registry: 170 s of wall time for 54 s of CPU in one of them); as soon as the build is done the built book is tested as HTML and in a real browser
# (tests/book, with SELFATTN_REUSE_BOOK=1: the build just made), while the other tests go on (their
# output is printed as they run; the book tests' is kept in _build/book-tests.out and printed after).
# Each chapter is executed once: the build runs every
# notebook top to bottom in a fresh kernel and fails on any cell error (nb_execution_raise_on_error)
# and, under -W, on stderr output; tests/book/test_build.py checks that every notebook of notebooks/
# was executed, every code cell, with no error output -- what `pytest --nbval-lax notebooks` checks
# (no cell is marked for output comparison), which `make nbval` still runs on its own.
# Each long experiment is computed once too: the build saves the chapters' training runs in $(RUNS)
# and the chapter tests that check those runs read them (src/selfattn/_runcache.py; only the same call
# by the same code is reused, a test that gets there first computes it itself). So the chapter tests
# run after the unit and parity tests, in a pytest run of their own (xdist's file scheduling had started
# chapter 08's test before the build reached chapter 08), and _config.yml starts those chapters first.
# --durations lists the slowest tests in CI's log, where the 30-minute budget (DESIGN.md) is watched.
# All three always run; the target fails if any failed.
RUNS := $(CURDIR)/_build/run-cache

test: lint $(VENV)/.vendor browser
	rm -rf _build && mkdir -p _build
	# One BLAS/OpenMP thread per worker: the workers already use both cores, and oversubscribed
	# OpenMP threads spin and slow each other down many times over (the build's kernels have one each).
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 SELFATTN_RUN_CACHE_WRITE=$(RUNS) \
	    $(PY) scripts/build_book.py . -W -n --keep-going > _build/book-build.out 2>&1 & book=$$!; \
	  ( export OMP_NUM_THREADS=1 SELFATTN_RUN_CACHE_READ=$(RUNS); \
	    $(PY) -m pytest -n 3 --dist loadfile --durations=15 tests/unit tests/parity; first=$$?; \
	    $(PY) -m pytest -n 3 --dist loadfile --durations=15 tests/chapters; second=$$?; \
	    [ $$first = 0 ] && [ $$second = 0 ] ) & unit=$$!; \
	  wait $$book; built=$$?; echo $$built > _build/book-build.rc; \
	  if [ $$built != 0 ]; then tail -n 60 _build/book-build.out; fi; \
	  SELFATTN_REUSE_BOOK=1 $(PY) -m pytest --durations=15 tests/book > _build/book-tests.out 2>&1; browser=$$?; \
	  wait $$unit; unit=$$?; \
	  echo "---- book tests (tests/book, after the build) ----"; cat _build/book-tests.out; \
	  echo "unit/parity/chapters: exit $$unit; book build: exit $$built; book tests: exit $$browser"; \
	  [ $$unit = 0 ] && [ $$built = 0 ] && [ $$browser = 0 ]

# Every notebook under nbval (each cell runs without error in a fresh kernel), apart from the book.
nbval: $(VENV)/.test
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile --nbval-lax notebooks

test-fast: $(VENV)/.test
	$(PY) -m pytest -n 2 --dist loadfile tests/unit tests/parity tests/chapters

bench: $(VENV)/.test
	$(PY) bench/attention_bench.py
	$(PY) bench/decode_bench.py

# _build holds the built site and the execution cache (_build/.jupyter_cache): after `make clean` the
# next `make book` executes every chapter, as on a fresh clone.
clean:
	rm -rf _build .pytest_cache
