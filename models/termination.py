"""SIGTERM ends a process, even when the exception its handler raises is swallowed; and only where it was.

A Python signal handler runs in the main thread between two bytecodes. When that moment falls inside a finaliser
(a ``__del__``, a weakref callback such as SQLAlchemy's ``_collection_gced``), the exception the handler raises is
printed as "Exception ignored in ..." and dropped: the process goes on as if it had never been signalled. Both
handlers a process can have are exposed to it: the command line's (SIGTERM → ``KeyboardInterrupt``, set by
``install``) and Prefect's, which a flow run puts in its place (``capture_sigterm``: SIGTERM → ``TerminationSignal``).

``watch`` makes the signal stick where it was lost, and nowhere else. Python hands every exception it drops to
``sys.unraisablehook``; the watcher's hook passes it on (the message is printed as before) and, when it is a
termination exception — ``KeyboardInterrupt`` (the signal it stands for: SIGTERM from ``interrupt``, else SIGINT)
or Prefect's ``TerminationSignal`` (its ``signal``) — a helper thread sends that signal to the main thread again
once the finaliser has returned (``signal.pthread_kill``: a real signal, so it also ends a blocking call and meets
whichever handler is in place then). So:

* only a signal this process got and lost is sent again: nothing is sent on a timer or because another process
  was signalled. A forked child is disarmed (``os.register_at_fork``): it inherits neither the helper thread nor
  the duty (a child that wants its own calls ``watch`` or ``install`` again);
* a process already leaving — cleanup after an ``except``, ``atexit`` functions (where Prefect stops its
  temporary server), a ``finally`` — is never interrupted by it: it got its exception;
* every lost signal is sent again, the second as the first (and one lost again is sent again).

It lives in the bottom layer so that every entry point can arm it (``models.gpu_check`` imports no ``flows``):
``install`` is called by the ``cleaner`` command line's callback (``flows.cli``) and by each ``python -m`` entry
point that runs a flow or a long job; a flow run a Prefect worker starts arms ``watch`` from the flows' ``on_running``
hook (``arm``), leaving Prefect's own handler in place. Tests: ``tests/test_termination.py``.
"""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time

SETTLE_S = 0.05
"""Seconds between a lost termination exception and the signal sent again (the finaliser has returned by then)."""
_TERMINATION = "TerminationSignal"
"""Prefect's termination exception, by class name (own or a base's): Prefect is not imported here."""
_lock = threading.Lock()
_pending: queue.SimpleQueue | None = None
"""Signals to send again to this process's main thread (None: not armed in this process)."""
_passed_on = None
"""The ``sys.unraisablehook`` the watcher's hook passes every dropped exception on to."""


class Terminated(KeyboardInterrupt):
    """The command line's SIGTERM: ends the command as Ctrl-C does; ``signum`` is the signal that raised it."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def interrupt(signum, frame) -> None:
    """The command line's SIGTERM handler: end the command as Ctrl-C does."""
    raise Terminated(signum)


def install() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` (``interrupt``), and ``watch``. Call it from the main thread; a
    second call only sets the handler again."""
    signal.signal(signal.SIGTERM, interrupt)
    watch()


def arm(*_args, **_kwargs) -> None:
    """``watch``, as a flow hook (``on_running``): a flow run a worker started gets it too, with Prefect's handler."""
    watch()


def watch() -> None:
    """Send a termination signal this process lost in a finaliser to its main thread again (any thread may call it;
    once a process)."""
    global _pending, _passed_on
    with _lock:
        if _pending is not None:
            return
        _pending = queue.SimpleQueue()
        threading.Thread(target=_deliver, args=(_pending, threading.main_thread().ident), name="sigterm-watcher",
                         daemon=True).start()
        if sys.unraisablehook is not _hook:
            _passed_on, sys.unraisablehook = sys.unraisablehook, _hook


def _disarm_in_child() -> None:
    """After a fork, in the child: no helper thread runs there, and the parent's duty is not the child's."""
    global _pending
    _pending = None


os.register_at_fork(after_in_child=_disarm_in_child)


def lost_signal(exc: BaseException | None) -> int | None:
    """The signal behind a dropped termination exception, or None for any other exception."""
    if isinstance(exc, KeyboardInterrupt):
        return getattr(exc, "signum", signal.SIGINT)
    if exc is not None and any(cls.__name__ == _TERMINATION for cls in type(exc).__mro__):
        return int(getattr(exc, "signal", signal.SIGTERM))
    return None


def _hook(unraisable) -> None:
    (_passed_on or sys.__unraisablehook__)(unraisable)
    pending, signum = _pending, lost_signal(unraisable.exc_value)
    if pending is not None and signum is not None:
        pending.put(signum)


def _deliver(pending: queue.SimpleQueue, main_ident: int) -> None:
    while True:
        signum = pending.get()
        time.sleep(SETTLE_S)
        signal.pthread_kill(main_ident, signum)
