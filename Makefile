# Two commands matter: `make demo` and `make test`. Both set up the virtualenv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Each virtualenv installs exactly its lock (pinned versions for CPython 3.11 on x86_64 Linux), then the project
# with --no-deps. `make lock` refreshes the locks after a pyproject change (infra/lock.py says how), the CUDA
# node's requirements-gpu.lock included (docs/run_at_scale.md installs it; nothing here does).
LOCK := requirements.lock
VERL_LOCK := requirements-verl.lock
GPU_LOCK := requirements-gpu.lock
# The CPU torch wheel lives here (a bare `torch` from PyPI is the multi-GB CUDA build).
WHEELS ?= /opt/wheels
PIP_VERSION := 26.3
UV_VERSION := 0.13.8
HASH := $(shell cat pyproject.toml $(LOCK) | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
# verl pins antlr4 4.9 (through hydra), which breaks math-verify's LaTeX parsing: it lives in its own venv,
# used only by the verl parity tests.
VERL_VENV ?= .venv-verl
VERL_HASH := $(shell cat pyproject.toml $(VERL_LOCK) | sha1sum | cut -c1-12)
VERL_STAMP := $(VERL_VENV)/.installed-$(VERL_HASH)
LOCK_VENV := .venv-lock
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_HOME ?= $(CURDIR)/.prefect
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-verl lock lock-upgrade lock-check gpu-transformers-check demo lint test test-slow test-fast docs docs-serve mutation sandbox-image serve serve-stop clean

$(STAMP): pyproject.toml $(LOCK)
	@echo "== setting up $(VENV) from $(LOCK) (first time: about 5-8 minutes; later runs skip this)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q pip==$(PIP_VERSION)
	$(PY) -m pip install -q --find-links $(WHEELS) -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	$(PY) infra/lock.py installed $(LOCK)
	touch $(STAMP)

setup: $(STAMP)

$(VERL_STAMP): pyproject.toml $(VERL_LOCK)
	@echo "== setting up $(VERL_VENV) from $(VERL_LOCK) for the verl parity tests (first time: a few minutes)"
	test -x $(VERL_VENV)/bin/python || python3 -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q pip==$(PIP_VERSION)
	$(VERL_VENV)/bin/python -m pip install -q --find-links $(WHEELS) -r $(VERL_LOCK)
	$(VERL_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VERL_VENV)/bin/python infra/lock.py installed $(VERL_LOCK)
	touch $(VERL_STAMP)

setup-verl: $(VERL_STAMP)

# uv resolves; it lives in a venv of its own so that it never shows up in .venv's lock.
$(LOCK_VENV)/bin/uv:
	python3 -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q uv==$(UV_VERSION) packaging==26.3

lock: $(LOCK_VENV)/bin/uv
	$(LOCK_VENV)/bin/python infra/lock.py compile --uv $(LOCK_VENV)/bin/uv --find-links $(WHEELS)

lock-upgrade: $(LOCK_VENV)/bin/uv
	$(LOCK_VENV)/bin/python infra/lock.py compile --uv $(LOCK_VENV)/bin/uv --find-links $(WHEELS) --upgrade

# CI: pyproject and the locks agree, each venv holds exactly its lock (nothing more, nothing else), and the GPU
# lock (requirements-gpu.lock, a CUDA node's: never installed here) still resolves for its platform, to the same pins.
lock-check: setup setup-verl $(LOCK_VENV)/bin/uv
	$(PY) infra/lock.py check
	$(LOCK_VENV)/bin/python infra/lock.py resolves --uv $(LOCK_VENV)/bin/uv
	$(PY) infra/lock.py installed $(LOCK) --exact
	$(VERL_VENV)/bin/python infra/lock.py installed $(VERL_LOCK) --exact
	$(PY) -m pip check

# The GPU lock pins another transformers than the CPU locks: the code it runs there (the decode stream, the lean
# decode step checked against transformers' own forward, updates with the critic, gpu_check, the decode bounds)
# is tested with that transformers (pure Python, installed --no-deps beside .venv) over the CPU torch 2.13.0:
# the GPU lock's torch 2.11.0 exists on PyPI only as the CUDA build.
GPU_TRANSFORMERS := $(shell sed -n 's/^transformers==//p' $(GPU_LOCK))
gpu-transformers-check: setup
	rm -rf .venv-gpu-tf
	$(PY) -m pip install -q --no-deps --target .venv-gpu-tf transformers==$(GPU_TRANSFORMERS)
	PYTHONPATH=$(CURDIR)/.venv-gpu-tf:$(CURDIR) $(PY) -c "import sys, transformers as t; sys.exit(t.__version__ != '$(GPU_TRANSFORMERS)')"
	PYTHONPATH=$(CURDIR)/.venv-gpu-tf:$(CURDIR) $(VENV)/bin/pytest -q -p no:cacheprovider tests/test_decode.py \
		tests/test_gpu_check.py tests/test_critic.py tests/test_bench_decode.py

demo: setup
	$(VENV)/bin/cleaner demo --config configs/tiny.yaml

# Style (ruff) and architecture (import-linter: the layer and no-cycle contracts in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check flows tasks models sandbox tests infra
	$(VENV)/bin/lint-imports

# Two pytest-xdist workers: many tests wait on servers and subprocesses, so two keep both cores busy. Each module
# (or set of modules sharing a costly session fixture) runs whole on one worker, the slow ones first (tests/conftest.py).
# `make test`: lint, the import contracts, every test not marked slow, and verl's own code in .venv-verl.
test: lint setup-verl
	$(VENV)/bin/pytest -q -ra --durations=15 -m "not verl and not slow" -n 2 --dist loadgroup
	$(VERL_VENV)/bin/pytest -q -ra -m verl

# The tests marked slow: served stacks, fan-out to worker hosts, kill-and-resume at every crash point, whole compares,
# SmolLM2 steps, the benchmarks' end-to-end runs. CI runs them after `make test` (.ci/run).
test-slow: setup
	$(VENV)/bin/pytest -q -ra --durations=15 -m "slow and not verl" -n 2 --dist loadgroup

# The docs site (mkdocs.yml, Material theme) into site/; strict: a warning (a broken link or anchor) fails it.
# The config and CLI reference pages are generated from the code on every build (infra/docs_hooks.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow and not docker"

# Mutation testing of the RL rules (pyproject [tool.mutmut]: SAAR rules, rollout handlers, mixing/advantages, trainer,
# losses): CPU-bound for a long time, so not part of `make test`. Results are kept in ./mutants between runs;
# `mutmut results` lists the survivors, `mutmut show NAME` one mutant. Accepted survivors: docs/rl_rules.md.
mutation: setup
	nice -n 10 $(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/mutmut results

sandbox-image:
	bash infra/sandbox/build_image.sh

serve: setup
	$(VENV)/bin/cleaner serve start

serve-stop:
	$(VENV)/bin/cleaner serve stop

clean:
	rm -rf runs mlflow.db mlflow.db.lock mlflow.db.alias.lock mlartifacts cleaner.duckdb .prefect .serve
