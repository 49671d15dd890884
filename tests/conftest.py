"""Shared fixtures: one Prefect test harness per session, the tiny tokenizer, a scripted engine; and the units of
work of `make test`'s two pytest-xdist workers (a module, or the modules sharing a costly session fixture)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Prefect sets up its logging when prefect.main loads (``from prefect import flow``), its console handler bound to
# the stderr of that moment: loaded here, that is the session's stream, not the one of the first test that imports a
# flow under ``capsys`` (closed after that test, it failed every later flow in the process with "I/O operation on
# closed file").
import prefect.main  # noqa: E402,F401,I001

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


# Session fixtures too costly to build on every pytest-xdist worker, and the modules that use them: each set is one
# unit of work (the collection refuses any other module that uses one).
SHARED = {"tracked_run": ("tests/test_browser.py", "tests/test_mlflow_entities.py")}
UNIT = {module: fixture for fixture, modules in SHARED.items() for module in modules}


def unit_of(nodeid: str) -> str:
    """The unit of work of a test under pytest-xdist: its module, or the SHARED fixture its module uses."""
    module = nodeid.split("::", 1)[0]
    return UNIT.get(module, module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs ``-n 2 --dist loadgroup``: whole units (``unit_of``) go to one worker, so module-scoped
    fixtures (a served stack, a loaded model) and the SHARED session fixtures are built once."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_units import UnitScheduling

    return UnitScheduling(config, log, unit_of)


def pytest_collection_modifyitems(config, items):
    """Refuses a module that uses a SHARED fixture without being listed with it. On a pytest-xdist worker the units
    that hold a slow test come first (stable otherwise), so none of them is left last on one worker while the other
    idles; a serial run keeps the collection order."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for name in SHARED:
            if name in getattr(item, "fixturenames", ()) and module not in SHARED[name]:
                raise pytest.UsageError(f"{item.nodeid} uses the session fixture {name}: add {module} to "
                                        f"SHARED[{name!r}] in tests/conftest.py (one xdist unit per shared fixture)")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = {unit_of(item.nodeid) for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: unit_of(item.nodeid) not in slow)
