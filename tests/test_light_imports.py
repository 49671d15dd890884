"""Flow modules and the CLI's help load no torch (nor transformers).

Prefect imports a flow's module to read its parameters (every worker, every deployment run), and
every ``cleaner`` call imports the CLI: config classes live in pydantic-only ``config`` modules and
the torch-side stage code is imported inside the tasks, so these imports stay light. Each check
runs in a fresh interpreter and reads its ``sys.modules``.

Run: ``pytest tests/test_light_imports.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers")


def _loaded(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["flows.config", "flows.train", "flows.prepare", "flows.evaluate", "flows.compare", "flows.warmup",
                                    "tasks.training.setups", "tasks.rollout.types", "tasks.data.loader"])
def test_module_imports_without_torch(module):
    assert _loaded(f"import {module}") == []


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"]])
def test_cli_help_loads_no_torch(argv):
    code = ("import contextlib, io, sys\n"
            f"sys.argv = ['cleaner', *{argv!r}]\n"
            "from flows.cli import app\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    app()")
    assert _loaded(code) == []


def test_the_probe_sees_torch_when_it_is_loaded():
    assert "torch" in _loaded("import tasks.training.stages")
