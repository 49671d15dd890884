"""The comparisons of the instrumented ``check`` (``tasks.rewards.cases``): ``==``, ``in`` and ``-`` as Python
computes them, and a second question to a value whose comparison is the answer's own code (stdlib only).

``make_compare`` returns ``eq``, ``contains`` and ``sub``. Each returns exactly what its operator returns.
When a value (or an element of a list, tuple, set, dict it is in; ``WALK`` values at most) has an
``__eq__`` / ``__contains__`` / ``__sub__`` that is not a builtin's, the stdlib's or the test's (a Python
function compiled from the answer, a builtin function put there, a lambda) and the comparison passed, the
same comparison is asked against a different value: the other side with the leaf facing the suspect
changed (``_aligned``), or a fresh object for ``in``. An honest value equals at most one of two different
values; one that equals both, contains a fresh object or keeps the same difference is reported with
``sys.audit("cleaner.fake")`` (and a NaN in a failed ``==`` with ``cleaner.nan``): the judge's audit hook
(``inproc``) holds the verdict, these functions hold nothing of it. Shipped after ``run``, before ``inproc``.
"""
import sys

_PLAIN = frozenset({int, float, str, bool, type(None), bytes, complex})
_HEAP = 1 << 9  # Py_TPFLAGS_HEAPTYPE
WALK = 2000
"""Values looked at per operand at most."""


class Sentinel:
    """A fresh object no honest value equals and no honest container holds."""

    __slots__ = ()


def make_compare(codes, writable, _audit=sys.audit):
    """``(eq, contains, sub)``; ``codes``: the test's and helpers' code objects (their dunders are trusted),
    ``writable``: directories whose files are not trusted (the answer could write a module there)."""
    from itertools import islice

    mro_of, flags_of, dict_of = type.__dict__["__mro__"].__get__, type.__dict__["__flags__"].__get__, \
        type.__dict__["__dict__"].__get__

    def trusted_code(code, cls):
        name = code.co_filename
        if code in codes:
            return True
        if name.startswith("<"):  # compiled from a string: only a dataclass's generated methods are trusted
            return name == "<string>" and "__dataclass_fields__" in dict_of(cls)
        return not any(name.startswith(d) for d in writable)

    def untrusted(t, names):
        """Does type ``t`` take one of ``names`` from code that is not a builtin's, the stdlib's or the test's
        (asked afresh each time: the answer may change a class between two comparisons)."""
        try:
            for cls in mro_of(t):
                if not flags_of(cls) & _HEAP:
                    continue
                own = dict_of(cls)
                for name in names:
                    f = own.get(name)
                    if f is None or type(f).__name__ == "wrapper_descriptor":
                        continue
                    if type(f).__name__ != "function" or not trusted_code(f.__code__, cls):
                        return True
        except Exception:  # noqa: BLE001 - a type that cannot be read is not trusted
            return True
        return False

    def suspect(v, names):
        """(a suspect value somewhere in ``v``, a NaN somewhere in ``v``)."""
        stack, seen, nan = [v], 0, False
        while stack and seen < WALK:
            o = stack.pop()
            seen += 1
            t = type(o)
            if t in _PLAIN:
                nan = nan or (t is float and o != o)
                continue
            if t is list or t is tuple or t is set or t is frozenset:
                stack.extend(islice(o, WALK))
                continue
            if t is dict:
                stack.extend(islice(o.keys(), WALK))
                stack.extend(islice(o.values(), WALK))
                continue
            if untrusted(t, names):
                return True, nan
            try:  # a subclass of a container (Counter, namedtuple): its items, read the C way
                if isinstance(o, dict):
                    stack.extend(islice(dict.keys(o), WALK))
                    stack.extend(islice(dict.values(o), WALK))
                elif isinstance(o, (list, tuple, set, frozenset)):
                    base = next(b for b in (list, tuple, set, frozenset) if isinstance(o, b))
                    stack.extend(islice(base.__iter__(o), WALK))
            except Exception:  # noqa: BLE001 - a value that lies about its class
                return True, nan
        return False, nan

    def other(v):
        """A plain value different from ``v``."""
        t = type(v)
        if t is bool:
            return not v
        if t is int or t is float or t is complex:
            return v + 1 if v == v and v + 1 != v else Sentinel()
        if t is str:
            return v + "\x00"
        if t is bytes:
            return v + b"\x00"
        if (t is list or t is tuple) and v:
            return t([other(v[0]), *v[1:]])
        if t is dict and v:
            k = next(iter(v))
            return {**v, k: other(v[k])}
        return Sentinel()

    def aligned(fake, honest, names):
        """``honest`` with the leaf facing ``fake``'s suspect value changed (lists, tuples, dicts followed)."""
        tf, th = type(fake), type(honest)
        if (tf is list or tf is tuple) and tf is th and len(fake) == len(honest):
            for i, x in enumerate(fake):
                if suspect(x, names)[0]:
                    return th([*honest[:i], aligned(x, honest[i], names), *honest[i + 1:]])
        if tf is dict and th is dict and fake.keys() == honest.keys():
            for k, x in fake.items():
                if suspect(x, names)[0]:
                    return {**honest, k: aligned(x, honest[k], names)}
        return other(honest)

    def truthy(r):
        if type(r) is bool:
            return r
        if untrusted(type(r), ("__bool__", "__len__")):
            _audit("cleaner.fake")
            return False
        return True

    eq_names, in_names, sub_names = ("__eq__",), ("__contains__", "__eq__"), ("__sub__", "__rsub__")

    def eq(a, b):
        r = a == b
        if type(a) in _PLAIN and type(b) in _PLAIN:
            if r is False and (a != a or b != b):
                _audit("cleaner.nan")
            return r
        sa, na = suspect(a, eq_names)
        sb, nb = suspect(b, eq_names)
        if (na or nb) and r is False:
            _audit("cleaner.nan")
        if (sa or sb) and truthy(r):
            try:
                if sa and not sb:
                    again = a == aligned(a, b, eq_names)
                elif sb and not sa:
                    again = aligned(b, a, eq_names) == b
                else:
                    again = a == Sentinel()
                if type(again) is not bool or again:
                    _audit("cleaner.fake")
            except Exception:  # noqa: BLE001 - an honest __eq__ may refuse a foreign value
                pass
        return r

    def contains(a, b):
        r = a in b
        if r and (type(b) not in _PLAIN or type(a) not in _PLAIN):
            if suspect(b, in_names)[0] or suspect(a, eq_names)[0]:
                try:
                    if Sentinel() in b:
                        _audit("cleaner.fake")
                except Exception:  # noqa: BLE001
                    pass
        return r

    def sub(a, b):
        r = a - b
        if type(a) in _PLAIN and type(b) in _PLAIN:
            return r
        if suspect(a, sub_names)[0] or suspect(b, sub_names)[0]:
            try:
                again = a - other(b) if type(b) in _PLAIN else other(a) - b
                if type(r) not in _PLAIN or type(again) not in _PLAIN or again == r:
                    _audit("cleaner.fake")
            except Exception:  # noqa: BLE001
                pass
        return r

    return eq, contains, sub
