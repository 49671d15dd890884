# Two commands matter: `make demo` and `make test`. Both set up the virtualenv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HASH := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
# verl pins antlr4 4.9 (through hydra), which breaks math-verify's LaTeX parsing: it lives in its own venv,
# used only by the verl parity tests.
VERL_VENV ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed-$(HASH)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_HOME ?= $(CURDIR)/.prefect
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-verl demo test test-fast sandbox-image serve serve-stop clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

$(VERL_STAMP): pyproject.toml
	test -x $(VERL_VENV)/bin/python || python3 -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERL_VENV)/bin/python -m pip install -q -e '.[test,verl]'
	touch $(VERL_STAMP)

setup-verl: $(VERL_STAMP)

demo: setup
	$(VENV)/bin/cleaner demo --config configs/tiny.yaml

test: setup setup-verl
	$(VENV)/bin/pytest -q -ra --durations=15 -m "not verl"
	$(VERL_VENV)/bin/pytest -q -ra -m verl

test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow and not docker"

sandbox-image:
	bash infra/sandbox/build_image.sh

serve: setup
	$(VENV)/bin/cleaner serve start

serve-stop:
	$(VENV)/bin/cleaner serve stop

clean:
	rm -rf runs mlflow.db mlartifacts cleaner.duckdb .prefect .serve
