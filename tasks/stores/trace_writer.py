"""A background writer for a step's MLflow traces: off the step's critical path, never lost, errors surfaced.

With ``tracking.background_traces`` the log stage hands the writing of a step's traces (and then the step's
``logged.json``, the mark that the step is in both stores) to one background thread and returns; the next step
runs meanwhile. Jobs run one at a time in submission order. A failed job is never swallowed: the next
``submit`` and ``flush`` raise ``TraceWriteError`` naming the step (its ``logged.json`` is not written, so a
resumed run logs the step's traces again — ``tasks.training.stages.log_stage``), and the train flow calls
``flush`` before it finishes the run, so every trace is written or the run fails.

Simplifies: one writer per process (steps of one run are logged in order; traces of one step are one MLflow
transaction, ``tasks.stores.traces``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class TraceWriteError(RuntimeError):
    """A background trace write failed (the message names the step; the cause is the original error)."""


class TraceWriter:
    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: list[tuple[str, Future]] = []

    def submit(self, what: str, job: Callable[[], object]) -> None:
        """Run ``job`` after the jobs before it; ``what`` names it in errors. Raises the error of an earlier job."""
        self._raise_failed(done_only=True)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="traces")
        self._jobs.append((what, self._pool.submit(job)))

    def flush(self) -> None:
        """Wait for every job; raise ``TraceWriteError`` for the first that failed."""
        self._raise_failed(done_only=False)

    def pending(self) -> int:
        return sum(not f.done() for _, f in self._jobs)

    def _raise_failed(self, done_only: bool) -> None:
        keep: list[tuple[str, Future]] = []
        failed: list[tuple[str, BaseException]] = []
        for what, fut in self._jobs:
            if done_only and not fut.done():
                keep.append((what, fut))
            elif fut.exception() is not None:
                failed.append((what, fut.exception()))
        self._jobs = keep
        if failed:
            names = ", ".join(w for w, _ in failed)
            raise TraceWriteError(f"background trace write failed for {names}: {failed[0][1]}") from failed[0][1]


_WRITER = TraceWriter()


def writer() -> TraceWriter:
    """The process's trace writer."""
    return _WRITER


def flush() -> None:
    """Wait for every background trace write of this process; raise if one failed."""
    _WRITER.flush()
