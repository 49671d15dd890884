"""The code-grading tests' sandbox: one per test module and backend (local, and docker where an engine and the
image are there), with the harness's pre-imported modules; ``fenced`` wraps an answer as a model writes it.

A module takes the fixture with ``sandbox = sandbox_fixture()``."""

from __future__ import annotations

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.rewards.harness import PREFIX_MODULES
from tests.test_rewards_code import _docker_skip_reason


def sandbox_fixture():
    """A module-scoped ``sandbox`` fixture over both backends (a new one per module that asks)."""

    def sandbox(request):
        if request.param == "docker" and (reason := _docker_skip_reason()):
            pytest.skip(reason)
        cfg = SandboxConfig(backend=request.param, timeout_s=8.0, workers=2, preimport=PREFIX_MODULES)
        with make_sandbox(cfg) as sb:
            yield sb

    return pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])(sandbox)


def fenced(code: str) -> str:
    return f"```python\n{code}```"
