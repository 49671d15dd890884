"""One executor endpoint seen from the host: the framed channel, answer validation, the worker.

A *worker* is anything that answers executor requests (``sandbox/executor/`` frames): a host
process (local backend) or a container (docker backend).  Every answer is validated
(``result_from_dict``); a dead, hung or garbage-speaking worker raises ``WorkerError``, whose
``during_snippet`` says whether a snippet may have caused it (the pool needs that to tell a
snippet that kills its worker from an infrastructure failure).
"""

from __future__ import annotations

import dataclasses
import os
import select
import time

from sandbox.executor.protocol import (
    MAX_FRAME,
    RUN,
    ProtocolError,
    decode_payload,
    decode_result,
    encode_frame,
    encode_run,
)
from sandbox.result import ExecutionResult

_FIELDS = {f.name: f for f in dataclasses.fields(ExecutionResult)}


class WorkerError(Exception):
    """A worker failed as infrastructure (died, hung, spoke garbage, could not start).

    ``during_snippet``: the failure happened while a snippet was running on the worker (the
    snippet may be its cause), not at start-up or on a request the executor refused."""

    def __init__(self, message: str, during_snippet: bool = False):
        super().__init__(message)
        self.during_snippet = during_snippet


class FramedChannel:
    """Length-prefixed JSON request/response over a pair of file descriptors, with deadlines."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd

    def send(self, obj: dict) -> None:
        self.send_frame(encode_frame(obj))

    def send_frame(self, frame: bytes) -> None:
        data = memoryview(frame)
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError as exc:
            raise WorkerError(f"write to executor failed: {exc}") from None

    def recv(self, timeout: float) -> dict:
        """The next frame as a JSON object, or the fields of a binary result."""
        payload = self.recv_payload(timeout)
        try:
            return decode_result(payload) if payload[:1] == RUN else decode_payload(payload)
        except ProtocolError as exc:
            raise WorkerError(f"executor sent garbage: {exc}") from None

    def recv_payload(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        header = self._read(4, deadline)
        size = int.from_bytes(header, "big")
        if size > MAX_FRAME:
            raise WorkerError(f"executor sent a frame of {size} bytes (garbage)")
        return self._read(size, deadline)

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
        raise WorkerError(f"executor answer malformed: missing={missing} extra={extra}", during_snippet=True)
    checks = {"ok": bool, "stdout": str, "stderr": str, "timed_out": bool,
              "memory_exceeded": bool, "duration_s": (int, float)}
    for name, typ in checks.items():
        if not isinstance(obj[name], typ):
            raise WorkerError(f"executor answer field {name!r} has type {type(obj[name]).__name__}",
                              during_snippet=True)
    return ExecutionResult(**{k: obj[k] for k in obj})


class Worker:
    """One executor endpoint. Subclasses set ``self.channel`` and implement ``kill()``.

    ``retire_after``: the pool replaces the worker once it has served that many requests."""

    channel: FramedChannel
    hello: dict

    def __init__(self, slot: int):
        self.slot = slot
        self.runs = 0
        self.retire_after = 1 << 62

    def request(self, req: dict, timeout: float) -> dict:
        """Run request ``req`` (sent as a binary frame); the answer's fields, or ``{"error": ...}``."""
        self.runs += 1
        try:
            self.channel.send_frame(encode_run(req))
            return self.channel.recv(timeout)
        except WorkerError as exc:
            exc.during_snippet = True
            raise

    def await_hello(self, timeout: float) -> dict:
        self.hello = self.channel.recv(timeout)
        if self.hello.get("ready") is not True:
            raise WorkerError(f"executor greeting malformed: {self.hello!r}")
        return self.hello

    def kill(self) -> None:
        raise NotImplementedError


class DeadWorker(Worker):
    """Stands in for a worker that could not be (re)started; its next request fails as infra."""

    def __init__(self, slot: int, reason: str):
        super().__init__(slot)
        self.reason = reason
        self.hello = {}

    def request(self, req: dict, timeout: float) -> dict:
        raise WorkerError(f"worker could not be started: {self.reason}")

    def kill(self) -> None:
        return None
