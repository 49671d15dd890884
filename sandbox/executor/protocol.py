"""Frames between the host and the executor: a 4-byte big-endian length, then UTF-8 JSON.

The executor first sends ``{"ready": true, ...}``; each request ``{"op": "run", "code": ...,
"timeout_s": ..., "memory_mb": ..., "max_output_bytes": ..., "max_processes": ...,
"file_mb": ..., "setup": ...}`` gets one result frame; ``{"op": "ping"}`` gets
``{"pong": true}``.  Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import json
import os
import struct

MAX_FRAME = 64 * 1024 * 1024
HEADER = struct.Struct(">I")


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


def read_frame(read) -> dict:
    (size,) = HEADER.unpack(read_exact(read, HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return decode_payload(read_exact(read, size))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
