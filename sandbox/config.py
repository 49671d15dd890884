"""Config slice for code execution (the ``sandbox:`` section of a run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: Literal["local", "docker", "auto"] = "auto"
    """Where snippets run: ``local`` (host executor), ``docker`` (isolated container pool) or
    ``auto`` (docker when an engine and the image are present, else local with a warning)."""

    timeout_s: float = Field(5.0, gt=0)
    """CPU time a snippet may use, in seconds (user + system, of its processes and threads,
    ``sandbox/executor/cputime.py``); past it the snippet is killed and ends as ``timeout``.
    CPU time, not wall-clock, so that the verdict does not depend on how loaded the machine is; a
    snippet near the limit may still fall either side: the clock counts in 10 ms ticks and the same
    work's CPU time varies with cache and frequency contention (0.5 s of work: 425-589 ms measured
    on a shared 2-core machine, i.e. about +-12 %)."""

    wall_timeout_s: float | None = Field(None, gt=0)
    """Wall-clock backstop per snippet, in seconds, for a snippet that blocks without using CPU
    (sleeps, waits on a read); past it the snippet is killed and ends as ``wall_timeout``
    (``timed_out`` is set for both limits).  None: max(5 x the snippet's CPU limit, CPU limit +
    10 s), so a snippet that computes reaches it only while it gets less than a fifth of a CPU.
    Whether it is reached depends on the machine's load: keep it far from what snippets need.
    At least ``timeout_s``."""

    memory_mb: int = Field(512, ge=32)
    """Address-space limit per snippet, in MiB; exceeding it gives ``memory``."""

    max_output_bytes: int = Field(65536, ge=256)
    """Bytes of stdout (and separately stderr) kept per snippet; the rest is dropped and flagged."""

    max_processes: int = Field(64, ge=1)
    """Process/thread limit for a snippet and its children (RLIMIT_NPROC / pids limit)."""

    file_mb: int = Field(64, ge=1)
    """Largest file a snippet may write, in MiB (RLIMIT_FSIZE)."""

    scratch_mb: int = Field(64, ge=1)
    """Bytes (MiB) a snippet may keep in its writable dirs (work dir, ``/tmp``, ``/dev/shm``):
    the size of each of the three docker tmpfs, and of the one tmpfs behind all three on the
    local backend.  They are emptied before every snippet."""

    scratch_inodes: int = Field(4096, ge=64)
    """Files and directories a snippet may create there (tmpfs ``nr_inodes``), same scope as
    ``scratch_mb``."""

    cpus: float = Field(1.0, gt=0)
    """CPUs each docker container may use (``--cpus``)."""

    workers: int = Field(4, ge=1)
    """Snippets executed at once (local executor processes or docker containers)."""

    spare_workers: int = Field(1, ge=0)
    """Workers started ahead of need: a retired or failed worker is swapped for a ready spare at
    once (and a new spare is started in the background), so no caller waits for a start."""

    preimport: list[str] = ["math"]
    """Modules the executor imports once so every forked child inherits them (their import time
    is paid at each worker start; ``stats()["preimport_s"]`` reports it)."""

    infra_retries: int = Field(2, ge=0)
    """Retries of an infrastructure failure (dead executor, lost container) before raising."""

    image: str = "cleaner-sandbox:latest"
    """Docker image tag (docker backend)."""

    runs_per_container: int = Field(2000, ge=1)
    """A worker (container or local executor) is replaced after this many snippets; the first
    workers retire after a staggered share of it, so that no two retire at the same time.
    Snippets cannot touch their executor and every writable dir is emptied between them, so this
    is defence in depth; a container start costs ~0.3 s of CPU in the Docker daemons (measured
    260 ms), which at 500 runs took ~13 % of two cores from a pool serving ~450 snippets/s."""

    @model_serializer(mode="wrap")
    def _omit_default_backstop(self, handler):
        """The default backstop is left out of the dump, hence out of every stage's cache key: runs made before
        the field existed keep their keys (``tasks.training.setups``)."""
        out = handler(self)
        if out.get("wall_timeout_s", 0) is None:
            del out["wall_timeout_s"]
        return out

    @model_validator(mode="after")
    def _wall_covers_cpu(self) -> SandboxConfig:
        if self.wall_timeout_s is not None and self.wall_timeout_s < self.timeout_s:
            raise ValueError(f"sandbox.wall_timeout_s ({self.wall_timeout_s}) must be at least sandbox.timeout_s "
                             f"({self.timeout_s}): a single-threaded snippet's CPU time cannot outrun its wall time")
        return self
