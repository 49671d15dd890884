"""Functions tests/test_lanes.py runs in a lane worker (importable there as ``tests.lane_fakes``)."""

from __future__ import annotations

import os
import sys


def add(a: int, b: int = 0) -> int:
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)


def unpicklable():
    return lambda: None


def exit_with(status: int) -> None:
    os._exit(status)


def nap(seconds: float) -> None:
    import time

    time.sleep(seconds)


def state() -> dict:
    """What the worker process looks like from inside."""
    import torch

    from tasks.stores import fence

    return {"pid": os.getpid(), "ppid": os.getppid(), "rows_only": os.environ.get("CLEANER_ROWS_ONLY"),
            "threads": torch.get_num_threads(), "argv": sys.argv, "env": dict(os.environ),
            "claims": [c.run_dir for c in fence.claims()]}


def publish(path: str, text: str) -> str:
    from tasks.stores import fence

    return str(fence.publish_text(path, text))


def crash_at(point: str, step: int) -> None:
    from tasks.training.faults import maybe_crash

    maybe_crash(point, step)
