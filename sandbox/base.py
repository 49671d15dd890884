"""The sandbox interface and backend registry.

A backend is registered with ``@register("name")`` and built by ``make_sandbox(cfg)``. The
built-in backends register themselves when their module is imported; ``make_sandbox`` imports
that module by name on first use (``_PLUGINS``), so this module never imports a backend back.
Every backend honours the same contract: ``run_many`` executes snippets concurrently
(bounded by the backend's pool), returns results in input order, never raises for user
code, and raises ``SandboxInfraError`` only after its infra retries are used up.  A snippet
that kills, stops or corrupts its worker (twice, on fresh workers, while the pool is healthy)
gets ``error_kind="worker_killed"``: its own failure, never the batch's.  Every snippet starts
with empty writable directories (``sandbox/THREAT_MODEL.md``).

Setup code: ``run(code, setup=...)`` / ``run_many(codes, setups=[...])`` (aligned with
``codes``, ``None`` for none) run the caller's trusted setup in the snippet's process and
globals just before the snippet, within the same limits and time budget.  Its filename is
``<setup>`` (the snippet's traceback line numbers are unchanged) and its stdout is discarded
(its stderr is kept).  A setup that raises (``SystemExit`` included) or does not finish means
the snippet never ran: the result is ``ok=False, error_kind="setup_error"`` with the traceback
in ``stderr``.  That is the caller's bug (callers raise on it), never the model's failure.

``timeout_s`` (``run`` / ``run_many``): a shorter CPU-time limit for these snippets than the
config's ``timeout_s`` (never a longer one), enforced by the executor from outside the snippet's
process like the default (graders pass their per-test limit here); the wall-clock backstop is the
config's ``wall_timeout_s``, or by default max(5 x this limit, this limit + 10 s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sandbox.config import SandboxConfig
from sandbox.result import ExecutionResult


class Sandbox(Protocol):
    name: str
    isolation: str

    def run(self, code: str, setup: str | None = None, timeout_s: float | None = None) -> ExecutionResult: ...

    def run_many(self, codes: list[str], setups: list[str | None] | None = None,
                 timeout_s: float | None = None) -> list[ExecutionResult]: ...

    def stats(self) -> dict[str, float]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc) -> None: ...


_BACKENDS: dict[str, Callable[[SandboxConfig], Sandbox]] = {}
_PLUGINS = {"local": "sandbox.local", "docker": "sandbox.docker_backend", "auto": "sandbox.docker_backend"}
"""Backend name → the module that registers it, imported on first use (no import cycle)."""


def register(name: str):
    def deco(factory):
        _BACKENDS[name] = factory
        return factory

    return deco


def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """Build the backend named by ``cfg.backend``."""
    if cfg.backend not in _BACKENDS and cfg.backend in _PLUGINS:
        import importlib

        importlib.import_module(_PLUGINS[cfg.backend])
    try:
        factory = _BACKENDS[cfg.backend]
    except KeyError:
        raise ValueError(
            f"sandbox.backend: unknown backend {cfg.backend!r}; valid: {sorted({*_BACKENDS, *_PLUGINS})}"
        ) from None
    return factory(cfg)
