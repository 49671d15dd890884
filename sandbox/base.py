"""The sandbox interface and backend registry.

A backend is registered with ``@register("name")`` and built by ``make_sandbox(cfg)``.
Every backend honours the same contract: ``run_many`` executes snippets concurrently
(bounded by the backend's pool), returns results in input order, never raises for user
code, and raises ``SandboxInfraError`` only after its infra retries are used up.
"""

from __future__ import annotations

from typing import Callable, Protocol

from sandbox.config import SandboxConfig
from sandbox.result import ExecutionResult


class Sandbox(Protocol):
    name: str
    isolation: str

    def run(self, code: str) -> ExecutionResult: ...

    def run_many(self, codes: list[str]) -> list[ExecutionResult]: ...

    def stats(self) -> dict[str, float]: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc) -> None: ...


_BACKENDS: dict[str, Callable[[SandboxConfig], Sandbox]] = {}


def register(name: str):
    def deco(factory):
        _BACKENDS[name] = factory
        return factory

    return deco


def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """Build the backend named by ``cfg.backend``."""
    import sandbox.docker_backend  # noqa: F401  (registers "docker" and "auto")
    import sandbox.local  # noqa: F401  (registers "local")

    try:
        factory = _BACKENDS[cfg.backend]
    except KeyError:
        raise ValueError(
            f"sandbox.backend: unknown backend {cfg.backend!r}; valid: {sorted(_BACKENDS)}"
        ) from None
    return factory(cfg)
