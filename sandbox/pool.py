"""A pool of executor workers, shared by the local and docker backends.

``WorkerPool`` keeps ``cfg.workers`` warm workers (``sandbox/worker.py``) and lends one per
snippet, so concurrency is bounded by the pool.  What it guarantees:

* **Infra failures never become results.**  A dead, hung or garbage-speaking worker is
  replaced and the snippet retried on another one, up to ``cfg.infra_retries`` times; then
  ``SandboxInfraError`` is raised.
* **Blast radius of one.**  A snippet that kills, stops or corrupts the worker it runs on is
  re-run once on a fresh worker; if it takes that one down too (and a canary snippet still
  runs fine on the pool, so the infrastructure is healthy), the death is that snippet's
  result: ``error_kind="worker_killed"`` with the detail.  Other snippets are unaffected.
* **No replacement stalls.**  ``cfg.spare_workers`` ready workers wait aside: a retired or
  failed worker is swapped for a spare at once and the old one is killed, and a new spare
  started, on a background thread.  The first workers retire after a staggered share of
  ``cfg.runs_per_container`` (1/n, 2/n, ... of it), so retirements are spread out.

Backends subclass ``WorkerPool`` and implement ``_new_worker(slot)``; ``slot`` (0-99) is unique
among live workers (backends derive a per-worker uid from it).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox.config import SandboxConfig
from sandbox.executor.protocol import default_wall_s
from sandbox.result import ExecutionResult, SandboxInfraError
from sandbox.worker import DeadWorker, Worker, WorkerError, result_from_dict

log = logging.getLogger(__name__)

REQUEST_GRACE_S = 5.0
"""Extra seconds a worker gets beyond the snippet's wall-clock backstop before it counts as hung."""
SLOTS = 100
"""Live workers (with spares) a pool may have at once; slots number them for per-worker uids."""


class FairQueue:
    """A FIFO of idle workers that serves waiting callers in arrival order.

    ``queue.Queue`` lets a caller that has just returned a worker take it straight back
    (its ``get`` barges ahead of the woken waiter), so under contention some callers starve:
    measured with 2 workers and 8 callers, p50 5 ms but p99 over 1 s.  Here ``put`` hands a
    worker directly to the oldest waiter, so a caller's wait is bounded by the ones ahead of it.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.queue: collections.deque = collections.deque()  # idle workers
        self._waiters: collections.deque = collections.deque()  # (event, box) of blocked callers

    def put(self, item) -> None:
        with self._lock:
            if self._waiters:
                event, box = self._waiters.popleft()
                box.append(item)
                event.set()
            else:
                self.queue.append(item)

    def get(self):
        with self._lock:
            if self.queue:
                return self.queue.popleft()
            event, box = threading.Event(), []
            self._waiters.append((event, box))
        event.wait()
        return box[0]

    def get_nowait(self):
        with self._lock:
            if not self.queue:
                raise queue.Empty
            return self.queue.popleft()


class WorkerPool:
    """Lends warm workers to snippets; retries infra failures; blames worker-killing snippets."""

    name = "pool"
    isolation = "unknown"

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self._idle = FairQueue()
        self._spares: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        self._threads: ThreadPoolExecutor | None = None
        self._background: list[threading.Thread] = []
        self._free_slots = list(range(SLOTS))
        self._stats = {"executions": 0, "ok": 0, "timeouts": 0, "infra_retries": 0,
                       "infra_errors": 0, "worker_restarts": 0, "retired": 0, "worker_kills": 0,
                       "spares_used": 0, "replacement_gaps": 0, "max_replacement_gap_s": 0.0,
                       "total_duration_s": 0.0, "max_worker_wait_s": 0.0, "preimport_s": 0.0}

    # -- lifecycle -------------------------------------------------------------------------

    def _new_worker(self, slot: int) -> Worker:
        raise NotImplementedError

    def _start(self, retire_after: int) -> Worker:
        """Start a worker in a free slot that retires after ``retire_after`` requests."""
        with self._lock:
            slot = self._free_slots.pop(0) if self._free_slots else SLOTS
        try:
            worker = self._new_worker(slot)
        except BaseException:
            self._release(slot)
            raise
        worker.retire_after = max(1, retire_after)
        with self._lock:
            self._stats["preimport_s"] = float(worker.hello.get("preimport_s", 0.0))
        return worker

    def _release(self, slot: int) -> None:
        if 0 <= slot < SLOTS:
            with self._lock:
                self._free_slots.append(slot)
                self._free_slots.sort()

    def _prewarm(self) -> None:
        n, full = self.cfg.workers, self.cfg.runs_per_container
        limits = [full * (i + 1) // n for i in range(n)] + [full] * self.cfg.spare_workers
        with ThreadPoolExecutor(max_workers=min(len(limits), 8)) as ex:
            futures = [ex.submit(self._start, limit) for limit in limits]
            started, errors = [], []
            for fut in futures:
                try:
                    started.append(fut.result())
                except Exception as exc:  # noqa: BLE001 - collected and raised below
                    errors.append(exc)
        for worker in started[:n]:
            self._idle.put(worker)
        self._spares.extend(started[n:])
        if errors:
            self.close()
            raise SandboxInfraError(f"{self.name}: could not start workers: {errors[0]}") from errors[0]
        failed = started[0].hello.get("failed_imports") if started else None
        if failed:
            log.warning("%s: sandbox.preimport modules failed to import: %s", self.name, failed)
        if started and started[0].hello.get("seccomp") is False:
            log.warning("%s: no seccomp filter on this machine: snippets of the same uid can still "
                        "prlimit/renice their executor (see sandbox/THREAT_MODEL.md)", self.name)

    def close(self) -> None:
        self._closed = True
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        for thread in list(self._background):
            thread.join(timeout=60)  # a worker being started is killed by its own thread
        idle = list(self._spares)
        self._spares.clear()
        while True:
            try:
                idle.append(self._idle.get_nowait())
            except queue.Empty:
                break
        if idle:
            try:
                with ThreadPoolExecutor(max_workers=min(len(idle), 8)) as ex:
                    list(ex.map(lambda w: w.kill(), idle))
            except RuntimeError:  # called at interpreter exit: no new threads, kill one by one
                for w in idle:
                    w.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- execution -------------------------------------------------------------------------

    def _request(self, code: str, setup: str | None = None, timeout_s: float | None = None) -> dict:
        cfg = self.cfg
        limit = cfg.timeout_s if timeout_s is None else min(float(timeout_s), cfg.timeout_s)
        wall = default_wall_s(limit) if cfg.wall_timeout_s is None else cfg.wall_timeout_s
        req = {"op": "run", "code": code, "timeout_s": limit, "wall_timeout_s": wall, "memory_mb": cfg.memory_mb,
               "max_output_bytes": cfg.max_output_bytes, "max_processes": cfg.max_processes,
               "file_mb": cfg.file_mb}
        if setup is not None:
            req["setup"] = setup
        return req

    def run(self, code: str, setup: str | None = None, timeout_s: float | None = None) -> ExecutionResult:
        if self._closed:
            raise SandboxInfraError(f"{self.name}: run() called after close()")
        if not isinstance(code, str):
            raise TypeError(f"{self.name}.run(code): code must be str, got {type(code).__name__}")
        if setup is not None and not isinstance(setup, str):
            raise TypeError(f"{self.name}.run(setup=): setup must be str or None, got {type(setup).__name__}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"{self.name}.run(timeout_s=): must be positive, got {timeout_s!r}")
        req = self._request(code, setup, timeout_s)
        blame_after = min(2, self.cfg.infra_retries + 1)
        deaths, last, start = 0, None, time.monotonic()
        for attempt in range(self.cfg.infra_retries + 1):
            if attempt:
                self._count("infra_retries")
            worker = self._lend()
            try:
                result = self._ask(worker, req)
            except WorkerError as exc:
                last = exc
                log.warning("%s: worker %d failed (%s); replacing it", self.name, worker.slot, exc)
                self._swap(worker, reason="worker_restarts")
                deaths += exc.during_snippet
                if deaths >= blame_after and self._canary_ok():
                    return self._worker_killed(deaths, exc, time.monotonic() - start)
                continue
            self._give_back(worker)
            self._record(result)
            return result
        self._count("infra_errors")
        raise SandboxInfraError(
            f"{self.name}: infrastructure failed {self.cfg.infra_retries + 1} times "
            f"(sandbox.infra_retries={self.cfg.infra_retries}); last error: {last}"
        ) from last

    def run_many(self, codes: list[str], setups: list[str | None] | None = None,
                 timeout_s: float | None = None) -> list[ExecutionResult]:
        if setups is None:
            setups = [None] * len(codes)
        elif len(setups) != len(codes):
            raise ValueError(f"{self.name}.run_many: {len(setups)} setups for {len(codes)} codes "
                             "(setups must be aligned with codes)")
        if not codes:
            return []
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self.cfg.workers,
                                                   thread_name_prefix=f"{self.name}-run")
        return list(self._threads.map(self.run, codes, setups, [timeout_s] * len(codes)))

    def _lend(self) -> Worker:
        start = time.monotonic()
        worker = self._idle.get()
        waited = time.monotonic() - start
        with self._lock:
            self._stats["max_worker_wait_s"] = max(self._stats["max_worker_wait_s"], waited)
        return worker

    def _ask(self, worker: Worker, req: dict) -> ExecutionResult:
        return result_from_dict(worker.request(req, req["wall_timeout_s"] + REQUEST_GRACE_S))

    def _canary_ok(self) -> bool:
        """Whether a trivial snippet runs on the pool (then the infrastructure is healthy)."""
        worker = self._lend()
        try:
            ok = self._ask(worker, self._request("pass")).ok
        except WorkerError as exc:
            log.warning("%s: canary failed on worker %d (%s)", self.name, worker.slot, exc)
            self._swap(worker, reason="worker_restarts")
            return False
        self._give_back(worker)
        return ok

    def _worker_killed(self, deaths: int, exc: WorkerError, duration: float) -> ExecutionResult:
        self._count("worker_kills")
        detail = (f"worker_killed: the sandbox worker failed while running this snippet, on {deaths} "
                  f"fresh workers in a row, while a canary snippet ran fine: {exc}")
        result = ExecutionResult(ok=False, exit_code=None, stdout="", stderr=detail,
                                 error_kind="worker_killed", timed_out=False, memory_exceeded=False,
                                 duration_s=round(duration, 6))
        self._record(result)
        return result

    def _give_back(self, worker: Worker) -> None:
        if self._closed:
            worker.kill()
        elif worker.runs >= worker.retire_after:
            self._swap(worker, reason="retired")
        else:
            self._idle.put(worker)

    def _swap(self, worker: Worker, reason: str) -> None:
        """Put a ready spare in ``worker``'s place; kill ``worker`` and start its successor (a new
        spare, or the replacement itself when no spare was ready) on a background thread."""
        self._count(reason)
        with self._lock:
            spare = self._spares.popleft() if self._spares and not self._closed else None
            if spare is not None:
                self._stats["spares_used"] += 1
        if spare is not None:
            self._idle.put(spare)
        thread = threading.Thread(target=self._renew, args=(worker, spare is None, time.monotonic()), daemon=True,
                                  name=f"{self.name}-renew-{worker.slot}")
        with self._lock:
            self._background = [t for t in self._background if t.is_alive()] + [thread]
        thread.start()

    def _renew(self, old: Worker, into_idle: bool, since: float) -> None:
        """Kill ``old``, start its successor; ``into_idle``: no spare took ``old``'s place, so the
        pool is one worker short from ``since`` until the successor is in (a *replacement gap*)."""
        old.kill()
        self._release(old.slot)
        if self._closed:
            return
        try:
            fresh = self._start(self.cfg.runs_per_container)
        except Exception as exc:  # noqa: BLE001 - a placeholder fails its next request
            log.error("%s: could not start a worker: %s", self.name, exc)
            fresh = DeadWorker(-1, str(exc)) if into_idle else None
        if fresh is None:
            return
        if self._closed:
            fresh.kill()
        elif into_idle:
            self._idle.put(fresh)
            with self._lock:
                self._stats["replacement_gaps"] += 1
                self._stats["max_replacement_gap_s"] = max(self._stats["max_replacement_gap_s"],
                                                           time.monotonic() - since)
        else:
            with self._lock:
                self._spares.append(fresh)

    # -- stats -----------------------------------------------------------------------------

    def _count(self, key: str, n: float = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _record(self, result: ExecutionResult) -> None:
        with self._lock:
            self._stats["executions"] += 1
            self._stats["ok"] += int(result.ok)
            self._stats["timeouts"] += int(result.timed_out)
            self._stats["total_duration_s"] += result.duration_s

    def stats(self) -> dict[str, float]:
        with self._lock:
            out = dict(self._stats)
            out["spares_ready"] = len(self._spares)
        out["mean_duration_s"] = out["total_duration_s"] / out["executions"] if out["executions"] else 0.0
        out["workers"] = self.cfg.workers
        return out
