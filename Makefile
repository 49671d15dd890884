# Two commands matter: `make demo` and `make test`. Both set up the virtualenv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_HOME ?= $(CURDIR)/.prefect
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-fast sandbox-image serve clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/cleaner demo --config configs/tiny.yaml

test: setup
	$(VENV)/bin/pytest -q -ra --durations=15

test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow and not docker"

sandbox-image:
	bash infra/sandbox/build_image.sh

serve: setup
	$(VENV)/bin/cleaner serve start

clean:
	rm -rf runs mlflow.db mlartifacts cleaner.duckdb .prefect
