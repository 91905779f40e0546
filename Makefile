# Two commands from a fresh clone with only python3: `make lab` and `make test`.
# Both create .venv if it is missing and (re)install the project when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_PORT ?= 8888

.PHONY: install install-newest lab lint typecheck test test-e2e test-all test-newest bench clean gpu-compile

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# JupyterLab 4.6 shows a news toast on first start; a workshop does not need it.
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}' \
		> $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $(STAMP)

# JupyterLab on the notebooks, on loopback only, with Jupyter's token authentication on.
lab: $(STAMP)
	$(VENV)/bin/workbench lab --port $(LAB_PORT)

# XLA:GPU's CUDA plugin (matched to the installed jaxlib) and ptxas, for `--verify gpu:<chip>:<count>` without a
# GPU (~550 MB). Kept in .venv/gpu-compile, on the path of a GPU compile's child only: installed beside JAX, the
# plugin would load into every JAX process and print CUDA's "no driver" noise there.
GPU_COMPILE_DIR := $(VENV)/gpu-compile
gpu-compile: $(GPU_COMPILE_DIR)/.installed

$(GPU_COMPILE_DIR)/.installed: $(STAMP)
	JAXLIB=$$($(PY) -c 'import jaxlib; print(jaxlib.__version__)') && test -n "$$JAXLIB" && \
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(GPU_COMPILE_DIR) \
		"jax-cuda12-plugin==$$JAXLIB" "jax-cuda12-pjrt==$$JAXLIB" nvidia-cuda-nvcc-cu12
	@touch $@

# ruff over the whole tree and pyright (basic mode, [tool.pyright]) over the engine and the widgets, against the
# packages in $(VENV). The linters are the `lint` extra, installed once beside the project (their own stamp).
LINT_STAMP := $(VENV)/.lint-installed
$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[lint]'
	@touch $@

lint: $(LINT_STAMP) typecheck
	$(VENV)/bin/ruff check .

# pyright alone (part of `make lint`, which CI runs): 0 errors in basic mode.
typecheck: $(LINT_STAMP)
	$(VENV)/bin/pyright --pythonpath $(PY)

# pytest-xdist workers, each taking whole test files (so a file's module fixtures are built once). On a 2-core
# machine three workers keep both cores busy while a worker waits on a child process or a poll (measured with an
# empty compilation cache: 194% CPU and 10 m 42 s with three, 174% and 11 to 12 minutes with two); the e2e tier
# keeps two, since each of its tests also runs a browser, a kernel or worker processes. TEST_WORKERS=0 runs in one
# process; `$(PY) -m pytest tests/test_x.py` runs one file without workers.
# Two tiers: `make test` is every test but the end-to-end tier (marked e2e: the real browser, each notebook run in a
# Jupyter kernel, training across worker processes, each mode trained to the accuracy bar from the CLI), which takes
# about as long again; `make test-e2e` runs that tier, `make test-all` both, one after the other. CI runs both.
# `make test` has XLA:CPU generate code at LLVM's level 0: the suite compiles thousands of small programs and runs each
# for a few steps, and LLVM's optimisation was a quarter of its CPU time, buying nothing there (cold, 2 cores: 1,000 ->
# 772 CPU-s, 9 m 36 s -> 7 m 42 s). The level is LLVM's only: the optimised HLO, and so every memory figure and
# collective the tests compare, is the same at every level (checked: dp-tp, fsdp, scanned fsdp-tp and dp steps). The
# e2e tier, and pytest run by hand, compile as users' runs do: at level 0 two processes' fsdp steps and one process's
# differed by 1.6e-5 of a leaf's scale, over the modes' 1e-5 exactness bound (within it at XLA's default).
TEST_XLA_FLAGS := --xla_backend_optimization_level=0
TEST_WORKERS ?= 3
E2E_WORKERS ?= 2
test: $(STAMP)
	XLA_FLAGS="$$XLA_FLAGS $(TEST_XLA_FLAGS)" $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not e2e"

# The browser tests run first and alone: beside worker processes training on both cores, a page under test misses
# its timeouts (CI, 2 cores: a screenshot waiting 20 s for a live plot to settle, five kernels starting in 300 s).
test-e2e: $(STAMP)
	$(PY) -m pytest -p no:xdist -m e2e tests/test_browser.py
	$(PY) -m pytest -n $(E2E_WORKERS) --dist loadfile -m e2e --ignore tests/test_browser.py

test-all: test test-e2e

# The newest stack the pins allow, beside the oldest (.venv: Python 3.11, JAX 0.10.2): Python 3.13 resolves JAX 0.12,
# flax 0.12.12, optax 0.2.8, orbax 0.12.8 into .venv-newest, and every test runs there too. NEWEST_PYTHON picks the
# interpreter (default: python3.13 on the path, or pyenv's).
NEWEST_VENV := .venv-newest
NEWEST_PYTHON ?= $(shell for p in python3.13 $(HOME)/.pyenv/versions/3.13*/bin/python3.13; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 13)' >/dev/null 2>&1 && { echo $$p; break; }; done)
install-newest:
	@test -n "$(NEWEST_PYTHON)" || { echo "the newest stack needs Python 3.13: install it, or give NEWEST_PYTHON=<path>"; exit 2; }
	$(MAKE) install VENV=$(NEWEST_VENV) PYTHON=$(NEWEST_PYTHON)

test-newest: install-newest
	$(MAKE) test-all VENV=$(NEWEST_VENV) PYTHON=$(NEWEST_PYTHON)

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(NEWEST_VENV) .pytest_cache .hypothesis
