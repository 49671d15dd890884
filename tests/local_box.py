"""Fixtures shared by the rollout tests that run scripted turns against a real local sandbox.

A module takes them with ``box = box_fixture()`` (one local sandbox, one worker, per module) and
``scheduling = scheduling_fixture()`` (the test runs under both drivers: round batches and continuous batching).
"""

from __future__ import annotations

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig


def box_fixture():
    """A module-scoped local sandbox with one worker."""

    def box():
        with make_sandbox(SandboxConfig(backend="local", workers=1)) as b:
            yield b

    return pytest.fixture(scope="module")(box)


def scheduling_fixture():
    """The driver a rollout runs under, both in turn."""

    def scheduling(request):
        return request.param

    return pytest.fixture(params=["rounds", "continuous"])(scheduling)
