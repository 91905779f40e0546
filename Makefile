# Two commands from a fresh clone with only python3: `make lab` and `make test`.
# Both create .venv if it is missing and (re)install the project when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_PORT ?= 8888

.PHONY: install lab test bench clean gpu-compile

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

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
