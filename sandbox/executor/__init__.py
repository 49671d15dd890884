"""Fork-server executor: runs Python snippets in freshly forked, limited children.

One long-lived process imports the modules snippets commonly need (``--preimport``), then
serves requests.  It keeps one child forked ahead of time, waiting in a fresh empty work dir
for its request, so a snippet costs neither an interpreter start nor the fork itself.  On a
request the child starts a new session, drops to an unprivileged uid when asked (``--uid``),
applies rlimits (address space, processes/threads, file size, CPU), with stdin on /dev/null,
and executes the code like ``python -c`` would (filename ``<string>``).  A request may carry
``setup`` code (the caller's, trusted): it runs first in the same globals as ``<setup>``, its
stdout discarded; if it raises, the snippet does not run and the answer is ``setup_error``.
The parent reads stdout/stderr concurrently (capped, never blocking on huge output), kills
the whole process group on timeout, answers with an ``ExecutionResult`` dict as soon as the
child reports its exit code, then sweeps every escaped descendant and forks the next child.

Modules, along the seams: ``protocol`` (frames), ``child`` (the forked side), ``forker`` (the
process that clones children, so the executor never forks), ``guard`` (non-dumpable executor,
seccomp), ``scratch`` (emptying the writable dirs), ``supervise`` (watching and reaping one
snippet), ``outcome`` (captures and the answer), ``server`` (the fork server and its
transports).  The package is stdlib-only and imports nothing from the
project, because the backends copy it into the sandbox (``install``) and start it there with
``launch_argv``.

Run:  ``python -m sandbox.executor [--preimport numpy,sympy] [--connect PATH] [--uid N]
[--scratch DIRS] [--spawn]`` (stdio transport by default; ``--connect`` talks over a unix socket
the host listens on).
"""

from __future__ import annotations

import os
import shutil

from .outcome import error_kind_of
from .protocol import MAX_FRAME, ProtocolError, decode_payload, encode_frame
from .server import Executor

PACKAGE = "cleaner_executor"
"""The name the package has inside a sandbox (``install`` copies it there under this name)."""

__all__ = ["MAX_FRAME", "PACKAGE", "Executor", "ProtocolError", "decode_payload", "encode_frame",
           "error_kind_of", "install", "launch_argv"]


def install(dest: str) -> str:
    """Copy this package's modules to ``dest/cleaner_executor`` (world-readable); return ``dest``."""
    target = os.path.join(dest, PACKAGE)
    os.makedirs(target, exist_ok=True)
    os.chmod(target, 0o755)
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            shutil.copyfile(os.path.join(here, name), os.path.join(target, name))
            os.chmod(os.path.join(target, name), 0o644)
    os.chmod(dest, 0o755)
    return dest


def launch_argv(python: str, parent: str) -> list[str]:
    """The command that starts an executor installed under ``parent`` (pass options after it)."""
    boot = f"import sys; sys.path.insert(0, {parent!r}); from {PACKAGE}.server import main; main()"
    return [python, "-I", "-B", "-c", boot]
