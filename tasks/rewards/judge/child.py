"""The solution's process in the assert format: load the solution, answer the judge's calls (stdlib only).

``judge/check.py`` starts a fresh interpreter (``python -I -S``) that reads the judge program from fd 3
and runs ``child_main``: it loads the solution (after the spec's import prefix) and answers requests on
fds 3 (from the judge, marshal) / 4 (to the judge, JSON): call a named function or a returned closure,
advance a returned iterator, read an attribute of the candidate or of a returned object. Values go back in the plain-data
codec (``wire.encode``); a closure, an iterator or an object of a plain class stays here as a handle;
arguments of type list, dict and set go back as the call left them. Every reply carries tamper hints and
whether a verdict mark was printed. Shipped in the judge program after ``run``, before ``check``.
"""
import os
import sys

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.run import end_of, memfd, scan_marks, snapshot, tamper_hints
    from tasks.rewards.judge.wire import CHANNEL_EXIT, Unencodable, decode, encode, recv_trusted, send


def child_main():
    """The solution's process: load it, then answer calls on fds 3 (requests) / 4 (replies)."""
    import types

    os.closerange(5, 1 << 16)
    out = memfd(b"")
    os.dup2(out, 1)
    msg = recv_trusted(3)
    if msg is None:
        return
    sys.path[:] = msg["path"]
    import _sitebuiltins
    import builtins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")  # as site defines them (-S skips it)
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    ns = main.__dict__
    snap, reply = snapshot(), {"ok": True}
    try:
        exec(msg["prefix"], ns)
        exec(compile(msg["source"], "<solution>", "exec"), ns)
    except BaseException as exc:  # noqa: BLE001 - reported to the judge
        reply = _child_end(exc)
    reply["shadowed"] = [n for n in msg["shadow"] if n in ns]
    seen = _child_reply(reply, snap, out, 0)
    handles, loaded = [], reply.get("ok")
    while loaded:  # a solution's exception ends one call, not the process: the test may expect it
        req = recv_trusted(3)
        if req is None:
            return
        try:
            reply = _child_call(ns, handles, req)
        except BaseException as exc:  # noqa: BLE001 - reported to the judge
            reply = _child_end(exc)
        seen = _child_reply(reply, snap, out, seen)


_MUTABLE = (list, dict, set)


_BUILTIN_VALUES = (int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
_APPLY = {"bool": bool, "len": len, "str": str, "repr": repr, "iter": iter,
          "getitem": lambda o, key: o[key], "contains": lambda o, item: item in o}
"""What the judge may apply to a returned object (``op`` ``apply``)."""


def _child_call(ns, handles, req):
    """One request: call a named function or a returned closure, advance a returned iterator, or read
    an attribute of a returned object (``_child_value``). The arguments of mutable types (list, dict,
    set) go back as they are after the call, also when it raised."""
    args, kwargs = decode(req["args"]), decode(req["kwargs"])
    try:
        reply = _child_value(ns, handles, req, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the judge, with the arguments as left
        reply = _child_end(exc)
    back = {}
    for i, arg in enumerate(args):
        if type(arg) in _MUTABLE:
            back[str(i)] = encode(arg)
    if back:
        reply["args"] = back
    return reply


def _child_value(ns, handles, req, args, kwargs):
    """The reply to one request: the encoded value, or a handle for a value outside the codec that is
    callable, an iterator or any other object but a builtin type's subclass (``heq``: its class has an
    ``__eq__`` of its own)."""
    if "handle" in req:
        fn = handles[req["handle"]]
        if req.get("op") == "next":
            return _child_next(handles, req["handle"], args[0])
        op = req.get("op")
        value = (getattr(fn, args[0]) if op == "attr" else _APPLY[args[0]](fn, *args[1:]) if op == "apply"
                 else fn(*args, **kwargs))
    else:
        fn = ns.get(req["name"])
        if not callable(fn):
            raise NameError(f"name {req['name']!r} is not defined")
        value = getattr(fn, args[0]) if req.get("op") == "attr" else fn(*args, **kwargs)
    reply = {"ok": True}
    try:
        reply["value"] = encode(value)
    except Unencodable:
        if hasattr(type(value), "__next__"):
            kind = "iter"
        elif callable(value):
            kind = "call"
        elif not isinstance(value, _BUILTIN_VALUES):
            kind = "obj"
        else:
            raise
        handles.append(value)
        reply["handle"], reply["hkind"] = len(handles) - 1, kind
        reply["heq"] = type(value).__eq__ is not object.__eq__
    return reply


def _child_next(handles, number, count):
    """Up to ``count`` items of iterator ``number`` (``(items, exhausted)``); an exception after some
    items is kept for the next request, so the judge sees the items first, as a lazy caller would."""
    it = handles[number]
    if isinstance(it, BaseException):
        handles[number] = iter(())
        raise it
    items, done = [], False
    try:
        while len(items) < count:
            items.append(encode(next(it)))
    except StopIteration:
        done = True
    except BaseException as exc:  # noqa: BLE001 - raised at the next request, after these items
        if not items:
            raise
        handles[number] = exc
    return {"ok": True, "value": {"t": [items, done]}}


def _child_reply(reply, snap, out, seen, _exit=os._exit):
    """Send a reply with the tamper hints and whether a verdict mark was printed; exit
    ``CHANNEL_EXIT`` when the reply pipe is gone. Returns how far stdout was scanned."""
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - a closed or replaced stream
        pass
    marked, seen = scan_marks(out, seen)
    reply["tampered"] = tamper_hints(snap)
    reply["marked"] = marked
    try:
        send(4, reply)
    except OSError:
        _exit(CHANNEL_EXIT)
    return seen


def _child_end(exc):
    end = end_of(exc)
    try:
        end["msg"] = str(exc)[:200]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        end["msg"] = ""
    return end
