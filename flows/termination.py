"""SIGTERM ends a command, even when the exception its handler raises is swallowed.

A Python signal handler runs in the main thread between two bytecodes. When that moment falls inside a finaliser
(a ``__del__``, a weakref callback such as SQLAlchemy's ``_collection_gced``), the exception the handler raises is
printed as "Exception ignored in ..." and dropped: the command goes on as if it had never been signalled. Both
handlers a command can have are exposed to it: the CLI's (SIGTERM → ``KeyboardInterrupt``, set by ``install``) and
Prefect's, which a flow run puts in its place (``capture_sigterm``: SIGTERM → ``TerminationSignal``).

``install`` makes the signal stick. The C-level handler writes every caught signal's number to a wake-up pipe
(``signal.set_wakeup_fd``) whichever Python handler is in place; a daemon thread reads it. From the first SIGTERM on,
the thread looks at the main thread every ``POLL_S``: once it is seen handling the termination (an ``except`` or
``finally`` block, a context manager's exit: marking the flow run, stopping the temporary Prefect server), the way
out is under way and the thread stops. If ``grace_s`` passes without that, the exception was lost, and SIGTERM is
sent to the main thread again (``signal.pthread_kill``: a real signal, so it also ends a blocking call and meets
whichever handler is in place then), each ``grace_s`` until it takes.

Used by the ``cleaner`` command line's callback (``flows.cli``); tests: ``tests/test_termination.py``.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

GRACE_S = 20.0
"""Seconds after SIGTERM without a sign of the main thread leaving before the signal is delivered again."""
POLL_S = 0.05
"""How often the watcher looks at the main thread's handled exception."""
_TERMINATIONS = ("KeyboardInterrupt", "SystemExit", "TerminationSignal")
"""Exceptions (by class name, own or a base's; Prefect's is not imported here) that mean the way out is under way."""
_installed = False


def interrupt(signum, frame) -> None:
    """The CLI's SIGTERM handler: end the command as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


def install(grace_s: float = GRACE_S) -> None:
    """Make SIGTERM raise ``KeyboardInterrupt``, and start the watcher that delivers it again if it is swallowed.

    Call it from the main thread; a second call only sets the handler again (one pipe, one watcher a process)."""
    global _installed
    signal.signal(signal.SIGTERM, interrupt)
    if _installed:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd, grace_s, threading.main_thread().ident),
                     name="sigterm-watcher", daemon=True).start()
    _installed = True


def _watch(read_fd: int, grace_s: float, main_ident: int) -> None:
    """Wait for SIGTERM on the wake-up pipe, then deliver it again while the main thread shows no sign of leaving."""
    while signal.SIGTERM not in os.read(read_fd, 512):
        pass
    while True:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if _terminating(main_ident):
                return
            time.sleep(POLL_S)
        signal.pthread_kill(main_ident, signal.SIGTERM)


def _terminating(main_ident: int) -> bool:
    """Whether the main thread is handling a termination exception right now (``sys._current_exceptions``)."""
    handled = sys._current_exceptions().get(main_ident)
    exc = handled[1] if isinstance(handled, tuple) else handled
    return exc is not None and any(cls.__name__ in _TERMINATIONS for cls in type(exc).__mro__)
