"""Frames between the host and the executor: a 4-byte big-endian length, then the payload.

A payload is UTF-8 JSON (``{...}``) or, for the hot path, binary (first byte ``RUN``):

* the executor first sends ``{"ready": true, ...}``; ``{"op": "ping"}`` gets ``{"pong": true}``;
  a refused request gets ``{"error": ...}``;
* a run request is ``RUN`` + ``RUN_HEADER`` (timeout_s: CPU seconds, wall_timeout_s: the
  wall-clock backstop, memory_mb, max_output_bytes, max_processes, file_mb, code bytes, setup
  bytes + 1 or 0 for none) + code + setup (UTF-8).
  The executor validates the header and hands the bytes after ``RUN`` to the child unchanged;
* its answer is ``RUN`` + ``RESULT_HEADER`` + error kind + stdout + stderr (raw bytes, decoded
  by the host), which ``decode_result`` turns into the ``ExecutionResult`` fields.

Binary, because every object the executor builds per snippet is a page it writes after a
fork (a copy-on-write fault): JSON of the code and the output cost ~80 faults a snippet.
Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import json
import os
import struct

MAX_FRAME = 64 * 1024 * 1024
HEADER = struct.Struct(">I")
RUN = b"R"
RUN_HEADER = struct.Struct(">ddIIIIII")
RESULT_HEADER = struct.Struct(">??????idIII")
"""ok, timed_out, memory_exceeded, stdout_truncated, stderr_truncated, has exit code, exit
code, duration_s, bytes of error kind, stdout, stderr."""


def default_wall_s(cpu_s: float) -> float:
    """The wall-clock backstop of a snippet allowed ``cpu_s`` CPU seconds, when none is given:
    far enough that only a snippet that blocks (sleeps, waits on a read) reaches it, not one
    that computes on a loaded machine (it would need to get less than a fifth of a CPU)."""
    return max(5.0 * cpu_s, cpu_s + 10.0)


class ProtocolError(Exception):
    """A frame could not be read or decoded (peer gone, short read or garbage)."""


def encode_frame(obj: dict) -> bytes:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(data)) + data


def decode_payload(data: bytes) -> dict:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a JSON object")
    return obj


def encode_run(req: dict) -> bytes:
    """The binary run frame for a request dict (``code``, optional ``setup``, the limits;
    ``wall_timeout_s`` missing or None: ``default_wall_s`` of ``timeout_s``)."""
    code = req["code"].encode("utf-8", "surrogatepass")
    setup = req.get("setup")
    extra = b"" if setup is None else setup.encode("utf-8", "surrogatepass")
    wall = req.get("wall_timeout_s")
    wall = default_wall_s(float(req["timeout_s"])) if wall is None else float(wall)
    head = RUN_HEADER.pack(float(req["timeout_s"]), wall, int(req["memory_mb"]), int(req["max_output_bytes"]),
                           int(req["max_processes"]), int(req.get("file_mb", 64)), len(code),
                           0 if setup is None else len(extra) + 1)
    payload = RUN + head + code + extra
    return HEADER.pack(len(payload)) + payload


def run_fields(payload: bytes) -> tuple:
    """The header of a binary run payload, checked against its length (``ProtocolError``)."""
    if len(payload) < 1 + RUN_HEADER.size:
        raise ProtocolError("run frame shorter than its header")
    fields = RUN_HEADER.unpack_from(payload, 1)
    if 1 + RUN_HEADER.size + fields[6] + max(0, fields[7] - 1) != len(payload):
        raise ProtocolError("run frame lengths do not add up")
    if not 0 < fields[0] <= fields[1]:
        raise ProtocolError("run frame limits: need 0 < timeout_s (CPU) <= wall_timeout_s")
    return fields


def encode_result(flags: tuple, exit_code: int | None, duration: float, kind: str | None,
                  out: bytes, err: bytes) -> bytes:
    """``flags``: ok, timed_out, memory_exceeded, stdout_truncated, stderr_truncated."""
    kind_b = b"" if kind is None else kind.encode()
    head = RESULT_HEADER.pack(*flags, exit_code is not None, exit_code or 0, duration,
                              len(kind_b) + (kind is not None), len(out), len(err))
    payload = RUN + head + kind_b + out + err
    return HEADER.pack(len(payload)) + payload


def decode_result(payload: bytes) -> dict:
    """The ``ExecutionResult`` fields of a binary result payload (``ProtocolError`` if malformed)."""
    if len(payload) < 1 + RESULT_HEADER.size or payload[:1] != RUN:
        raise ProtocolError("result frame shorter than its header")
    (ok, timed_out, memory, out_trunc, err_trunc, has_exit, exit_code, duration,
     n_kind, n_out, n_err) = RESULT_HEADER.unpack_from(payload, 1)
    start = 1 + RESULT_HEADER.size
    if start + max(0, n_kind - 1) + n_out + n_err != len(payload):
        raise ProtocolError("result frame lengths do not add up")
    kind_end = start + max(0, n_kind - 1)
    out_end = kind_end + n_out
    return {"ok": ok, "exit_code": exit_code if has_exit else None,
            "stdout": payload[kind_end:out_end].decode("utf-8", "replace"),
            "stderr": payload[out_end:].decode("utf-8", "replace"),
            "error_kind": payload[start:kind_end].decode("utf-8", "replace") if n_kind else None,
            "timed_out": timed_out, "memory_exceeded": memory, "duration_s": duration,
            "stdout_truncated": out_trunc, "stderr_truncated": err_trunc}


def read_exact(read, n: int) -> bytes:
    """Read exactly ``n`` bytes with ``read(k)``; ``ProtocolError`` on EOF."""
    chunks, got = [], 0
    while got < n:
        chunk = read(n - got)
        if not chunk:
            raise ProtocolError("peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_payload(read) -> bytes:
    (size,) = HEADER.unpack(read_exact(read, HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return read_exact(read, size)


def read_frame(read) -> dict:
    return decode_payload(read_payload(read))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
