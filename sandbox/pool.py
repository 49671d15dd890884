"""A pool of executor workers with infra-failure retries, shared by the local and docker backends.

A *worker* is anything that answers executor requests (``sandbox/executor.py`` frames): a host
process (local backend) or a container (docker backend).  ``WorkerPool`` keeps ``cfg.workers``
of them warm, lends one per snippet (so concurrency is bounded by the pool), validates every
answer, and treats a dead, hung or garbage-speaking worker as an *infrastructure* failure: the
worker is replaced, the snippet is retried on another one up to ``cfg.infra_retries`` times,
and only then ``SandboxInfraError`` is raised.  Infra failures never become results.

Backends subclass ``WorkerPool`` and implement ``_new_worker(slot)``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox.config import SandboxConfig
from sandbox.executor import MAX_FRAME, ProtocolError, decode_payload, encode_frame
from sandbox.result import ExecutionResult, SandboxInfraError

log = logging.getLogger(__name__)

REQUEST_GRACE_S = 5.0
"""Extra seconds a worker gets beyond the snippet's timeout before it counts as hung."""

_FIELDS = {f.name: f for f in dataclasses.fields(ExecutionResult)}


class WorkerError(Exception):
    """A worker failed as infrastructure (died, hung, spoke garbage, could not start)."""


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


class FramedChannel:
    """Length-prefixed JSON request/response over a pair of file descriptors, with deadlines."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd

    def send(self, obj: dict) -> None:
        data = memoryview(encode_frame(obj))
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError as exc:
            raise WorkerError(f"write to executor failed: {exc}") from None

    def recv(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        header = self._read(4, deadline)
        size = int.from_bytes(header, "big")
        if size > MAX_FRAME:
            raise WorkerError(f"executor sent a frame of {size} bytes (garbage)")
        try:
            return decode_payload(self._read(size, deadline))
        except ProtocolError as exc:
            raise WorkerError(f"executor sent garbage: {exc}") from None

    def call(self, obj: dict, timeout: float) -> dict:
        self.send(obj)
        return self.recv(timeout)

    def _read(self, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(f"executor did not answer within the deadline ({n} bytes due)")
            ready, _, _ = select.select([self.rfd], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(self.rfd, n - len(buf))
            except OSError as exc:
                raise WorkerError(f"read from executor failed: {exc}") from None
            if not chunk:
                raise WorkerError("executor closed its channel (died)")
            buf += chunk
        return bytes(buf)


def result_from_dict(obj: dict) -> ExecutionResult:
    """Validate an executor answer; anything malformed is a ``WorkerError`` (garbage)."""
    if "error" in obj:
        raise WorkerError(f"executor refused the request: {obj['error']}")
    missing = [name for name, f in _FIELDS.items() if name not in obj and f.default is dataclasses.MISSING]
    extra = sorted(set(obj) - set(_FIELDS))
    if missing or extra:
        raise WorkerError(f"executor answer malformed: missing={missing} extra={extra}")
    checks = {"ok": bool, "stdout": str, "stderr": str, "timed_out": bool,
              "memory_exceeded": bool, "duration_s": (int, float)}
    for name, typ in checks.items():
        if not isinstance(obj[name], typ):
            raise WorkerError(f"executor answer field {name!r} has type {type(obj[name]).__name__}")
    return ExecutionResult(**{k: obj[k] for k in obj})


class Worker:
    """One executor endpoint. Subclasses set ``self.channel`` and implement ``kill()``."""

    channel: FramedChannel
    hello: dict

    def __init__(self, slot: int):
        self.slot = slot
        self.runs = 0

    def request(self, req: dict, timeout: float) -> dict:
        self.runs += 1
        return self.channel.call(req, timeout)

    def await_hello(self, timeout: float) -> dict:
        self.hello = self.channel.recv(timeout)
        if self.hello.get("ready") is not True:
            raise WorkerError(f"executor greeting malformed: {self.hello!r}")
        return self.hello

    def kill(self) -> None:
        raise NotImplementedError


class WorkerPool:
    """Lends warm workers to snippets; retries infra failures on fresh workers; keeps stats."""

    name = "pool"
    isolation = "unknown"
    replace_in_background = False
    """Start replacement workers on a helper thread (slow starts, e.g. containers)."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self._idle = FairQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._threads: ThreadPoolExecutor | None = None
        self._respawns: list[threading.Thread] = []
        self._stats = {"executions": 0, "ok": 0, "timeouts": 0, "infra_retries": 0,
                       "infra_errors": 0, "worker_restarts": 0, "retired": 0,
                       "total_duration_s": 0.0}

    # -- lifecycle -------------------------------------------------------------------------

    def _new_worker(self, slot: int) -> Worker:
        raise NotImplementedError

    def _prewarm(self) -> None:
        with ThreadPoolExecutor(max_workers=min(self.cfg.workers, 8)) as ex:
            futures = [ex.submit(self._new_worker, slot) for slot in range(self.cfg.workers)]
            errors = []
            for fut in futures:
                try:
                    self._idle.put(fut.result())
                except Exception as exc:  # noqa: BLE001 - collected and raised below
                    errors.append(exc)
        if errors:
            self.close()
            raise SandboxInfraError(f"{self.name}: could not start workers: {errors[0]}") from errors[0]
        failed = self._idle.queue[0].hello.get("failed_imports") if self._idle.queue else None
        if failed:
            log.warning("%s: sandbox.preimport modules failed to import: %s", self.name, failed)

    def close(self) -> None:
        self._closed = True
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        for thread in list(self._respawns):
            thread.join(timeout=60)  # a replacement being started is killed by its own thread
        idle = []
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

    def _request(self, code: str, setup: str | None = None) -> dict:
        cfg = self.cfg
        req = {"op": "run", "code": code, "timeout_s": cfg.timeout_s, "memory_mb": cfg.memory_mb,
               "max_output_bytes": cfg.max_output_bytes, "max_processes": cfg.max_processes,
               "file_mb": cfg.file_mb}
        if setup is not None:
            req["setup"] = setup
        return req

    def run(self, code: str, setup: str | None = None) -> ExecutionResult:
        if self._closed:
            raise SandboxInfraError(f"{self.name}: run() called after close()")
        if not isinstance(code, str):
            raise TypeError(f"{self.name}.run(code): code must be str, got {type(code).__name__}")
        if setup is not None and not isinstance(setup, str):
            raise TypeError(f"{self.name}.run(setup=): setup must be str or None, got {type(setup).__name__}")
        req = self._request(code, setup)
        last: Exception | None = None
        for attempt in range(self.cfg.infra_retries + 1):
            if attempt:
                self._count("infra_retries")
            worker = self._idle.get()
            try:
                result = result_from_dict(worker.request(req, self.cfg.timeout_s + REQUEST_GRACE_S))
            except WorkerError as exc:
                last = exc
                log.warning("%s: worker %d failed (%s); replacing it", self.name, worker.slot, exc)
                self._replace(worker)
                continue
            self._give_back(worker)
            self._record(result)
            return result
        self._count("infra_errors")
        raise SandboxInfraError(
            f"{self.name}: infrastructure failed {self.cfg.infra_retries + 1} times "
            f"(sandbox.infra_retries={self.cfg.infra_retries}); last error: {last}"
        ) from last

    def run_many(self, codes: list[str], setups: list[str | None] | None = None) -> list[ExecutionResult]:
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
        return list(self._threads.map(self.run, codes, setups))

    def _give_back(self, worker: Worker) -> None:
        if self._closed:
            worker.kill()
        elif worker.runs >= self.cfg.runs_per_container:
            self._count("retired")
            self._replace(worker, counted=False)
        else:
            self._idle.put(worker)

    def _replace(self, worker: Worker, counted: bool = True) -> None:
        """Kill ``worker`` and put a fresh one for its slot in the pool (or a dead placeholder)."""
        if counted:
            self._count("worker_restarts")
        if self.replace_in_background and not self._closed:
            thread = threading.Thread(target=self._respawn, args=(worker,), daemon=True,
                                      name=f"{self.name}-respawn-{worker.slot}")
            with self._lock:
                self._respawns = [t for t in self._respawns if t.is_alive()] + [thread]
            thread.start()
        else:
            self._respawn(worker)

    def _respawn(self, worker: Worker) -> None:
        worker.kill()
        if self._closed:
            return
        try:
            fresh = self._new_worker(worker.slot)
        except Exception as exc:  # noqa: BLE001 - the placeholder fails its next request
            log.error("%s: could not restart worker %d: %s", self.name, worker.slot, exc)
            fresh = _DeadWorker(worker.slot, str(exc))
        if self._closed:
            fresh.kill()
        else:
            self._idle.put(fresh)

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
        out["mean_duration_s"] = out["total_duration_s"] / out["executions"] if out["executions"] else 0.0
        out["workers"] = self.cfg.workers
        return out


class _DeadWorker(Worker):
    """Stands in for a worker that could not be restarted; its next request fails as infra."""

    def __init__(self, slot: int, reason: str):
        super().__init__(slot)
        self.reason = reason

    def request(self, req: dict, timeout: float) -> dict:
        raise WorkerError(f"worker could not be started: {self.reason}")

    def kill(self) -> None:
        return None
