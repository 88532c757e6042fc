# kda-notebooks: `make notebooks` (execute every notebook, build the site) and `make test`.
SHELL := /bin/bash

# First Python >= 3.12 among python3.12, python3.13, python3 (and pyenv's installs, if any).
PYTHON_CANDIDATES := python3.12 python3.13 python3 $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3)
PYTHON ?= $(shell for c in $(PYTHON_CANDIDATES); do \
	  $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$c; break; }; done)

VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the extras installed into .venv: add `tpu` on a TPU VM, `gpu` (CUDA 13) or `cuda12` on a GPU host.
# JupyterLab (the `jupyter` extra) only where `make lab` asks for it: its dependencies slow
# every notebook run's start (jsonschema's URI grammar alone takes 2 s to import)
EXTRAS ?= dev
# the exact versions CI tests (`make lock` regenerates them); pyproject.toml holds the ranges
CONSTRAINTS := constraints.txt
PARAMS ?= ci
# seconds one notebook cell may run under `make notebooks` before it counts as hung
CELL_TIMEOUT ?= 1200
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
EXECUTED := $(patsubst notebooks/%,build/notebooks/%,$(NOTEBOOKS))
PYTEST_ARGS ?=

.PHONY: help test test-all test-fast test-tpu notebooks site lab lint sync lock repository-url clean \
	check-python bench check-browser FORCE

# `make` alone, or `make help`: the targets, each with its one-line description (the `##` lines)
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  \1\t/' | expand -t 18

check-python:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "error: no Python >= 3.12 found (tried: $(PYTHON_CANDIDATES))."; \
	  echo "Install one (e.g. 'apt install python3.12', 'pyenv install 3.12', or conda: 'conda env create -f environment.yml')"; \
	  echo "or point to it: make test PYTHON=/path/to/python3.12"; exit 1; fi

# the extras installed so far: EXTRAS joins them, so a new extra reinstalls once and going back
# (`make lab`, then `make test`) reinstalls nothing; `rm -rf .venv` starts again from EXTRAS
$(VENV)/.extras: FORCE
	@mkdir -p $(VENV); have=$$(cat $@ 2>/dev/null); \
	want=$$(echo "$$have,$(EXTRAS)" | tr ',' '\n' | sed '/^$$/d' | sort -u | paste -sd, -); \
	[ "$$want" = "$$have" ] || echo "$$want" > $@

# uv installs in parallel (about 30 s instead of 80 s here); pip installs uv itself, so pip's
# own settings (index, proxy) find it. INSTALLER=pip skips uv; where uv fails (e.g. an index
# only pip is configured for), pip retries, saying so.
INSTALLER ?= uv
$(STAMP): pyproject.toml $(CONSTRAINTS) $(VENV)/.extras | check-python
	@test -x $(VPY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(VPY) -m pip install -q -c $(CONSTRAINTS) --upgrade pip $(filter uv,$(INSTALLER))
	@extras=$$(cat $(VENV)/.extras); if [ "$(INSTALLER)" = uv ]; then \
	  echo "$(VENV)/bin/uv pip install -c $(CONSTRAINTS) -e '.[$$extras]'"; \
	  $(VENV)/bin/uv pip install -q --python $(VPY) --compile-bytecode -c $(CONSTRAINTS) \
	    -e ".[$$extras]" || { echo "uv could not install the environment; retrying with pip"; \
	  $(VPY) -m pip install -q -c $(CONSTRAINTS) -e ".[$$extras]"; }; \
	else $(VPY) -m pip install -q -c $(CONSTRAINTS) -e ".[$$extras]"; fi
	@touch $(STAMP)

lint: $(STAMP) ## ruff over the package, tests, notebooks and scripts
	$(VENV)/bin/ruff check kda_lib tests notebooks data scripts

# xdist hands out whole xdist_group groups (one worker builds their shared fixture once) and,
# with --no-loadscope-reorder, everything in collection order, where tests/conftest.py puts the
# longest tests first (xdist's default reorder puts the largest groups first: 817 s against 741 s)
XDIST := -n 2 --dist loadgroup --no-loadscope-reorder
test: lint ## what CI runs: the suite but tests/extended.py's, every notebook but 08 under nbval
	$(VPY) -m pytest $(XDIST) -m "not extended" $(PYTEST_ARGS)

# every test, tests/extended.py's too (about 15 minutes on 2 cores; CI does not run it)
test-all: lint ## the whole suite, the extended tests included
	$(VPY) -m pytest $(XDIST) $(PYTEST_ARGS)

# the fast inner loop: one folder's tests without the slow ones (FOLDER=ops, parallel, layers,
# models, lab, teaching, contracts; default ops), e.g. `make test-fast FOLDER=layers`
FOLDER ?= ops
test-fast: $(STAMP) ## one folder's quick tests: make test-fast FOLDER=layers
	$(VPY) -m pytest $(XDIST) -m "not slow" tests/$(FOLDER) $(PYTEST_ARGS)

# the tests marked `tpu` on the accelerator, in one process (one program holds a chip): with the
# machine's own Python and JAX (a TPU VM image's python3, with kda_lib installed there or run from
# this checkout), not .venv, which pins the CPU set of constraints.txt. Without make, the same:
# JAX_PLATFORMS=tpu,cpu python3 -m pytest -p no:xdist -m tpu $(TPU_TESTS)
PYTHON_TPU ?= python3
# the folders holding tests marked tpu: they import only the core and pytest/hypothesis (the
# notebooks' and site's tests need packages a TPU image lacks)
TPU_TESTS := tests/ops tests/layers tests/parallel tests/contracts/test_fla_parity.py \
	tests/contracts/test_non_finite.py
test-tpu: ## the tests marked tpu, on the TPU, with the image's python3 (no .venv)
	JAX_PLATFORMS=tpu,cpu $(PYTHON_TPU) -m pytest -p no:xdist -m tpu $(TPU_TESTS) $(PYTEST_ARGS)

# execute every notebook with papermill (PARAMS=full: the bigger settings of notebooks/params/full/),
# then render build/notebooks/ into the site build/html/ (Sphinx + myst-nb; renders the stored
# outputs, executes nothing; its source folder is build/html-src/). KDA_NONINTERACTIVE=1: no
# widget starts (kda_lib.teaching.notebook.interactive); a cell that times out fails papermill,
# and one recorded as completed after the whole timeout (jupyter/nbclient#312) fails
# scripts/check_cell_times.py
notebooks: $(STAMP) ## execute every notebook with papermill, then build the site
	@mkdir -p build/notebooks
	@for nb in $(NOTEBOOKS); do \
	  name=$$(basename $$nb .ipynb); out=build/notebooks/$$name.ipynb; \
	  echo "== $$name ($(PARAMS) parameters)"; \
	  start=$$(date +%s); \
	  params=notebooks/params/$(PARAMS)/$$name.yaml; opt=""; [ -f $$params ] && opt="-f $$params"; \
	  KDA_NONINTERACTIVE=1 $(VENV)/bin/papermill --no-progress-bar \
	    --execution-timeout $(CELL_TIMEOUT) -k python3 $$opt $$nb $$out || exit 1; \
	  $(VPY) scripts/check_cell_times.py $(CELL_TIMEOUT) $$out || exit 1; \
	  echo "   $$(( $$(date +%s) - start )) s"; \
	done
	$(VPY) scripts/build_site.py $(EXECUTED) --output build/html

# the site again from the notebooks already executed in build/notebooks/
site: $(STAMP) ## the site again from the notebooks already executed
	@test -n "$(wildcard build/notebooks/*.ipynb)" || { \
	  echo "no executed notebooks in build/notebooks/: run 'make notebooks' first"; exit 1; }
	$(VPY) scripts/build_site.py $(wildcard $(EXECUTED)) --output build/html

# what a reader sees, in headless Chromium (playwright driving the system's `chromium`; as root
# without it, apt-get installs it): on every page of build/html/ the math (bold vectors bold,
# blackboard letters blackboard, aligned equations aligned, no TeX error) and no request to
# another host; then notebook 02 in JupyterLab, where moving a slider redraws the figure.
# Screenshots in build/browser/. Needs `make notebooks` first; about 50 s; not in `make test`.
check-browser: | check-python ## the site and notebook 02 in headless Chromium (after make notebooks)
	@$(MAKE) --no-print-directory $(STAMP) EXTRAS=$(EXTRAS),browser
	@test -f build/html/index.html || { echo "no site in build/html/: run 'make notebooks' first"; exit 1; }
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium with apt-get"; apt-get update -qq && apt-get install -y -qq chromium; \
	  else echo "check-browser needs chromium: apt-get install chromium (or your system's package)"; exit 1; fi; }
	$(VPY) scripts/check_browser.py --site build/html --screenshots build/browser

# JupyterLab on the notebooks: adds the `jupyter` extra to .venv first (LAB_ARGS: e.g.
# --no-browser --port 8888 on a remote VM). jupytext opens each pair (NN_name.ipynb and its
# NN_name.py, jupytext.toml) as one notebook and saves both; the file browser hides the .py twins
# (LAB_HIDE: jupyter_server's default hide_globs plus the twins' NN_*.py; the solutions'
# chNN.py stay listed)
LAB_HIDE := __pycache__ *.pyc *.pyo .DS_Store *.so *.dylib *~ [0-9][0-9]_*.py
lab: | check-python ## JupyterLab on the notebooks
	@$(MAKE) --no-print-directory $(STAMP) EXTRAS=$(EXTRAS),jupyter
	$(VENV)/bin/jupyter lab $(LAB_ARGS) $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
	  $(foreach glob,$(LAB_HIDE),'--ContentsManager.hide_globs=$(glob)') notebooks/

# (first writes scripts/notebook_setup.py's INSTALL_BLOCK into every notebook's install cell)
sync: $(STAMP) ## pair each notebooks/NN_*.py with its .ipynb (jupytext)
	$(VPY) scripts/notebook_setup.py --write
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

# publish under another address: make repository-url URL=https://github.com/OWNER/NAME
repository-url: $(STAMP) ## publish under another address: URL=https://github.com/OWNER/NAME
	@test -n "$(URL)" || { echo "usage: make repository-url URL=https://github.com/OWNER/NAME"; exit 1; }
	$(VPY) scripts/notebook_setup.py --set-repository-url '$(URL)'
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

# the newest versions pyproject.toml allows, installed into a scratch venv and written to
# constraints.txt; run `make test` afterwards to see whether they still pass
lock: | check-python ## regenerate constraints.txt from the newest allowed versions
	rm -rf build/lock-venv
	$(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/pip install -q --upgrade pip uv
	build/lock-venv/bin/pip install -q '.[dev,jupyter,browser]'
	{ echo "# Exact versions CI tests (make test installs with them); pyproject.toml has the ranges."; \
	  echo "# Regenerate with 'make lock'; the accelerator extras resolve against these pins."; \
	  build/lock-venv/bin/pip freeze --all --exclude kda-lib; } > $(CONSTRAINTS)
	rm -rf build/lock-venv

bench: $(STAMP) ## the CPU benchmark (kda-bench), into build/runs/ unless told
	$(VPY) -m kda_lib.lab.bench

clean: ## remove build outputs and caches
	rm -rf build .pytest_cache .ruff_cache .hypothesis
