"""Whether a process id runs on this host: the liveness test behind clearing what a crashed process left behind
(the Docker pool's labelled containers, a row log's unfinished writes)."""

from __future__ import annotations

import os


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host. Another user's process counts (``PermissionError``), and so
    does a zombie or a reused pid: what such a process left is kept, never lost. (``flows.procs.pid_alive`` counts
    a zombie as gone: it tells whether a stack process still runs.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
