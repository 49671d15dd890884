"""A lane's worker process (``tasks.training.lanes``): runs the stage functions it is sent, one at a time.

Started by ``Lane`` as ``python -m tasks.training.lane_worker`` with its address, authkey, thread count and parent
pid in its environment (never argv). It dies with its parent process (a thread polling ``getppid``, and on EOF of its connection),
writes row-log units only (``tasks.stores.db.ROWS_ONLY_ENV``), adopts the caller's fence claims before each call,
flushes its trace writer before it answers, and on ``STOP`` closes its sandbox pools and exits.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client, Connection

from tasks.stores import fence, trace_writer
from tasks.stores.db import ROWS_ONLY_ENV
from tasks.training.faults import PARENT_ENV
from tasks.training.lanes import ADDRESS_ENV, AUTHKEY_ENV, STOP, THREADS_ENV, LaneError

WATCH_S = 0.2
"""How often the worker checks that its parent still runs."""


def die_with_parent(parent: int) -> None:
    """Exit (SIGKILL, nothing cleaned up: as the parent's own death) within ``WATCH_S`` of the parent process
    ending, even while a call keeps the main thread busy: a daemon thread polls ``getppid``. Not Linux's
    ``PR_SET_PDEATHSIG``: that fires when the *thread* that started the worker ends (a task runner's thread
    returning to its pool, an executor shut down), not the process."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGKILL)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="lane-parent-watch", daemon=True).start()


def answer(conn: Connection, request) -> None:
    """Run one request and send its reply: ("ok", value, "") or ("err", exception, traceback text)."""
    module, function, args, kwargs, claims = request
    fence.adopt(claims)
    try:
        value = getattr(importlib.import_module(module), function)(*args, **kwargs)
        trace_writer.flush()
        reply = ("ok", value, "")
    except Exception as err:  # noqa: BLE001 — sent to the caller, who raises it
        reply = ("err", err, traceback.format_exc())
    try:
        pickle.dumps(reply)
    except Exception as err:  # noqa: BLE001 — a value or an exception that does not pickle
        reply = ("err", LaneError(f"{type(reply[1]).__name__}: {reply[1]} (not picklable: {err})"), reply[2])
    conn.send(reply)


def main() -> None:
    parent = int(os.environ[PARENT_ENV])
    die_with_parent(parent)
    os.environ[ROWS_ONLY_ENV] = "1"
    key = bytes.fromhex(os.environ.pop(AUTHKEY_ENV))
    threads = int(os.environ[THREADS_ENV])
    import torch

    torch.set_num_threads(threads)
    conn = Client(os.environ[ADDRESS_ENV], family="AF_UNIX", authkey=key)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request == STOP:
            from tasks.training.live import close_live

            close_live()
            conn.send(("ok", None, ""))
            break
        answer(conn, request)
    sys.exit(0)


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM (a cancelled run's process group) ends the worker, lost in a finaliser or not
    main()
