# Two commands do all the set-up on a fresh machine:
#   make demo   installs everything (torch, the core, every optional extra, the test tools: DEPS, LINT
#               and BROWSER_PY below; ~2.5 GB), then runs the main job (ampkit bench) on the embedded default
#   make test   installs the same (and, where it can, Debian's chromium: the browser step), then runs ruff (lint
#               + format check), mypy, lint-imports (the layers of docs/architecture.md, contracts in
#               pyproject.toml) and the test suite
# The virtual environment lives in .venv; a stamp file makes re-runs fast (no pip call at all
# when pyproject.toml has not changed).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

# torch is pinned to the CPU build that lies on this machine's disk; an unpinned torch would
# pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
DEPS   := rich==15.0.0 matplotlib==3.11.2 numpy==2.4.6 pytest==9.2.0 pytest-xdist==3.8.0 hypothesis==6.155.2 bitsandbytes==0.50.0 torchao==0.18.0 transformers==5.23.0 tokenizers==0.23.3 tensorboard==2.21.0 torch-optimi==0.3.3 peft==0.21.2 accelerate==1.15.0 psutil==7.2.2 pyarrow==25.0.1 datasets==5.2.0 wandb==0.31.0 mlflow==3.17.2 lightning==2.6.6
LINT   := ruff==0.17.6 mypy==2.4.1 import-linter==2.16
# The browser test (tests/report/test_browser.py: report.html in headless Chromium at 390 and 1280 px) drives
# Debian's chromium through playwright, pinned here (playwright cannot download its own browsers on these
# machines); `make test` installs chromium (the `browser` step below).
BROWSER_PY := playwright==1.65.2

.PHONY: install browser test demo bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check "$(TORCH)" $(DEPS) $(LINT)
	$(PIP) install -q --disable-pip-version-check $(BROWSER_PY)
	$(PIP) install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium (a 115 MB download) for the browser test, with apt-get where it is missing and make
# runs as root (an empty package list is refreshed once). It never fails `make test`: where chromium cannot
# be had (no apt-get, not root, no network) it says so and the browser test skips in one line.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for tests/report/test_browser.py (apt-get)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
	      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } \
	      || echo "could not install chromium with apt-get: tests/report/test_browser.py will skip"; \
	  else echo "no chromium and no apt-get as root to install it: tests/report/test_browser.py will skip"; fi; }

# ampkit's own bytecode is compiled up front (compileall writes it whatever PYTHONDONTWRITEBYTECODE says, and
# these machines set it): without it each of the ~250 processes the suite starts compiled ampkit's modules
# again (~0.3 s a process that trains, measured on the AVX2 EPYC kind).
# Lint, format, types (mypy on both cores: ~40 s cold, ~53 s on one) and the import layers first, then the
# suite on two pytest-xdist workers (the tests that share the real runs in one group) with its 25 slowest
# tests listed (--durations), so slow ones stay visible in CI's output.
test: $(STAMP) browser
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src tests benchmarks examples
	$(PY) -m mypy --num-workers 2
	$(VENV)/bin/lint-imports
	$(PY) -m compileall -q -j 2 src tests
	$(PY) -m pytest tests -n 2 --dist loadgroup --durations=25 -rs

demo: $(STAMP)
	$(VENV)/bin/ampkit bench

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
