"""Shared fixtures: one Prefect test harness per session, the tiny tokenizer, a scripted engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
WARM = Path(os.environ.get("CLEANER_TEST_MODEL", ROOT / "assets" / "tiny-warm"))


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def warm_model_dir() -> Path:
    if not (WARM / "config.json").exists():
        pytest.fail(f"{WARM} is missing: run `cleaner warmup` (the checkpoint is committed to the repo)")
    return WARM


@pytest.fixture(scope="session")
def tokenizer(warm_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(warm_model_dir)


@pytest.fixture(scope="session")
def chat(tokenizer):
    from models.chat import ChatFormat

    return ChatFormat(tokenizer)


@pytest.fixture(scope="session")
def tracked_run(prefect_harness, warm_model_dir, tmp_path_factory):
    """A finished 2-step tiny run evaluated at policies 0 and 2: traces, logged models, a registered model.

    Returns (work dir, the flow's result); the stores are ``<work>/mlflow.db`` and ``<work>/cleaner.duckdb``.
    Shared by the MLflow-entity and browser tests (one flow run for both)."""
    from tests.flowrun import EVAL_OVERRIDES, run_tiny_flow

    work = tmp_path_factory.mktemp("tracked")
    return work, run_tiny_flow(work, warm_model_dir, "browsertest", [*EVAL_OVERRIDES, "tracking.register_models=true"])
