"""The plain-data codec and the framing shared by the sandbox programs and the host (stdlib only).

``encode`` / ``decode``: ``None``, ``bool``, ``str``, ``int`` (beyond 2**53 as hex), ``float``
(non-finite tagged), ``list``, ``tuple``, ``set``, ``frozenset``, ``dict`` - exact types only;
anything else (subclasses, objects with their own ``__eq__``, generators) is ``Unencodable``.
``dump`` writes JSON without consulting builtins a solution may have patched; ``dump`` and ``loads``
read and write ints of any length (Python's 4300-digit limit on int/str conversion is not the answer's). On the judge's pipes
frames are a 4-byte length and a body: JSON from the solution's process (``send`` / ``recv``: the
judge decodes untrusted data), marshal from the judge (``send_trusted`` / ``recv_trusted``: so the
solution's process never imports ``json``, 10 ms of its start-up). Shipped first in the judge program.
"""

import _json
import math
import os

VERDICT_MARK = "\x1e__CLEANER_VERDICT__"
PASSED_MARK = "__cleaner_passed__"  # what the marked check calls after each test (``tasks.rewards.cases``)
MARK_EVENT = "cleaner.mark"  # ``PASSED_MARK(MARK_EVENT, i)``: the judge passes ``sys.audit`` as ``PASSED_MARK``
EQ_HOOK, IN_HOOK, SUB_HOOK = "__cleaner_eq__", "__cleaner_in__", "__cleaner_sub__"  # its ==, in, - (the same)
TIMEOUT_EXIT = 124
CHANNEL_EXIT = 125
_MAX_FRAME = 1 << 26
_MAX_DEPTH = 200


class Unencodable(Exception):
    """A value outside the plain data the harness compares (the message names its type)."""


def encode(v, depth=0, _type=type, _fin=math.isfinite, _hex=hex, _repr=repr, _big=1 << 53):
    """``v`` as JSON-ready data (lists, one-key tag objects ``t s fs d i f``), exact types only."""
    t = _type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -_big < v < _big else {"i": _hex(v)}
    if t is float:
        return v if _fin(v) else {"f": _repr(v)}
    if depth > _MAX_DEPTH:
        raise Unencodable(f"nesting deeper than {_MAX_DEPTH}")
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"t": [encode(x, depth + 1) for x in v]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    raise Unencodable(str(getattr(t, "__name__", "?")))


def decode(obj, depth=0):
    """The value ``encode`` described, built from exact builtin types; ``ValueError`` on anything else."""
    t = type(obj)
    if obj is None or t is bool or t is int or t is float or t is str:
        return obj
    if depth > _MAX_DEPTH:
        raise ValueError("encoded value nested too deep")
    if t is list:
        return [decode(x, depth + 1) for x in obj]
    if t is dict and len(obj) == 1:
        ((tag, val),) = obj.items()
        if tag == "i" and type(val) is str:
            return int(val, 16)
        if tag == "f" and val in ("nan", "inf", "-inf"):
            return float(val)
        if type(val) is list:
            items = [decode(x, depth + 1) for x in val]
            if tag == "t":
                return tuple(items)
            if tag in ("s", "fs"):
                return set(items) if tag == "s" else frozenset(items)
            if tag == "d" and all(type(p) is list and len(p) == 2 for p in items):
                return {k: x for k, x in items}
    raise ValueError(f"not an encoded value: {obj!r:.80}")


def has_nan(v, depth=0):
    """Does a decoded value hold a float NaN anywhere."""
    if type(v) is float:
        return math.isnan(v)
    if depth > _MAX_DEPTH:
        return False
    if type(v) in (list, tuple, set, frozenset):
        return any(has_nan(x, depth + 1) for x in v)
    if type(v) is dict:
        return any(has_nan(k, depth + 1) or has_nan(x, depth + 1) for k, x in v.items())
    return False


def json_plain(v, depth=0):
    """A decoded value as a JSON round trip gives it back (tuples as lists, keys as JSON spells them);
    ``Unencodable`` for sets, which JSON has not. LiveCodeBench compares return values this way."""
    t = type(v)
    if t in (list, tuple):
        return [json_plain(x, depth + 1) for x in v]
    if t is dict:
        return {k if type(k) is str else dump(k): json_plain(x, depth + 1) for k, x in v.items()}
    if t in (set, frozenset):
        raise Unencodable(t.__name__)
    return v


def int_text(n, _irepr=int.__repr__):
    """The decimal text of an int of any length (``int.__repr__`` refuses more than 4300 digits)."""
    try:
        return _irepr(n)
    except ValueError:
        import decimal

        return decimal.Decimal(n).__str__()


def _big_int(text):
    if len(text) < 4000:
        return int(text)
    import decimal

    return int(decimal.Decimal(text))


def loads(text):
    """``json.loads`` that reads ints of any length (``json.loads`` refuses more than 4300 digits)."""
    import json

    return json.loads(text, parse_int=_big_int)


def dump(o, sort=False, _type=type, _esc=_json.encode_basestring_ascii, _fin=math.isfinite,
         _irepr=int_text, _frepr=float.__repr__, _sorted=sorted):
    """JSON text of plain data (what ``json.dumps`` gives, ASCII, no spaces), safe from patched builtins."""
    t = _type(o)
    if o is None:
        return "null"
    if t is bool:
        return "true" if o else "false"
    if t is str:
        return _esc(o)
    if t is int:
        return _irepr(o)
    if t is float:
        return _frepr(o) if _fin(o) else ("NaN" if math.isnan(o) else "Infinity" if o > 0 else "-Infinity")
    if t is list:
        return "[" + ",".join([dump(x, sort) for x in o]) + "]"
    if t is dict:
        keys = _sorted(o) if sort else list(o)
        return "{" + ",".join([_esc(k) + ":" + dump(o[k], sort) for k in keys]) + "}"
    raise Unencodable(str(getattr(t, "__name__", "?")))


def digest(text):
    """sha256 hex of a text: long answers are compared by the digest of their canonical form."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def normal_lines(text):
    """Output lines as compared exactly: stripped, inner runs of blanks as one space, outer blank lines gone."""
    return "\n".join(" ".join(line.split()) for line in text.strip().splitlines())


def send(fd, obj, _write=os.write):
    """Write one JSON frame (the solution's process to the judge)."""
    _write_all(fd, dump(obj).encode(), _write)


def send_trusted(fd, obj):
    """Write one marshal frame (the judge to the solution's process: plain data only)."""
    import marshal

    _write_all(fd, marshal.dumps(obj))


def _write_all(fd, data, _write=os.write):
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[_write(fd, data):]


def read_n(fd, n, _read=os.read):
    chunks, got = [], 0
    while got < n:
        chunk = _read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _frame(fd):
    """The body of one frame, or None at end of file; ``ValueError`` on an oversized or forged one."""
    head = read_n(fd, 4)
    if head is None:
        return None
    if head == VERDICT_MARK[:4].encode():
        raise ValueError("forged")
    size = int.from_bytes(head, "big")
    if size > _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return read_n(fd, size)


def recv(fd):
    """One JSON object frame (from the untrusted side) or None at end of file; ``ValueError`` on garbage."""
    import json

    body = _frame(fd)
    if body is None:
        return None
    obj = json.loads(body.decode("utf-8", "surrogatepass"))
    if type(obj) is not dict:
        raise ValueError("frame is not an object")
    return obj


def recv_trusted(fd):
    """One marshal frame from the judge, or None at end of file."""
    import marshal

    body = _frame(fd)
    return None if body is None else marshal.loads(body)
