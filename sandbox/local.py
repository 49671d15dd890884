"""The ``local`` sandbox backend: a pool of fork-server executors running on the host.

Each worker is the executor package (``sandbox/executor/``) run by ``python -I`` with a minimal
environment.  Isolation is the best the host offers, stated in ``.isolation`` and logged at start-up:

* ``bwrap``: the executor (which exits when its stdin closes, i.e. when the host process
  dies; ``--die-with-parent`` would kill it with the thread that spawned it) runs inside bubblewrap with no network, its own pid/ipc/uts
  namespaces, a tmpfs ``/tmp`` and only the system and Python directories mounted read-only
  (no home, no project tree); snippets additionally run under rlimits and, when the host
  runs as root, as an unprivileged uid per worker.
* ``rlimits``: plain resource limits (+ an unprivileged uid when root and the Python install
  is readable by others).  This is NOT isolation: a snippet can read what the user can read
  and reach the network; a loud warning says so.

Use: ``with make_sandbox(SandboxConfig(backend="local")) as sb: sb.run("print(1)")``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import weakref
from functools import lru_cache
from pathlib import Path

from sandbox.executor import install, launch_argv
from sandbox.base import register
from sandbox.config import SandboxConfig
from sandbox.pool import FramedChannel, Worker, WorkerError, WorkerPool

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
"""Seconds an executor may take to pre-import its modules and greet."""

_SANDBOX_EXECUTOR = "/opt/cleaner"
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """True when ``bwrap`` exists and can create the namespaces we use."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    probe = [exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--proc", "/proc",
             "--die-with-parent", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _readable_by_others(path: str) -> bool:
    """True when every directory up to ``path`` is traversable (and ``path`` readable) by others."""
    p = Path(path).resolve()
    for part in [p, *p.parents]:
        mode = part.stat().st_mode
        if not mode & stat.S_IXOTH or (part == p and not mode & stat.S_IROTH):
            return False
    return True


def _python_dirs() -> list[str]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            str(Path(os.path.realpath(sys.executable)).parent.parent)}
    return sorted(d for d in dirs if d and os.path.isdir(d))


class LocalWorker(Worker):
    """One executor process on the host (optionally inside bubblewrap)."""

    def __init__(self, slot: int, argv: list[str], env: dict[str, str]):
        super().__init__(slot)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=env,
                                         start_new_session=True, close_fds=True)
        except OSError as exc:
            raise WorkerError(f"could not start executor {argv[0]!r}: {exc}") from None
        self.channel = FramedChannel(self.proc.stdout.fileno(), self.proc.stdin.fileno())
        try:
            self.await_hello(STARTUP_TIMEOUT_S)
        except WorkerError:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("executor pid %d did not exit after SIGKILL", self.proc.pid)


@register("local")
class LocalSandbox(WorkerPool):
    """Pool of ``cfg.workers`` host executors; see the module docstring for isolation."""

    name = "local"

    def __init__(self, cfg: SandboxConfig):
        super().__init__(cfg)
        self._tmp = tempfile.mkdtemp(prefix="cleaner-sandbox-")
        self._remove_tmp = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)
        os.chmod(self._tmp, 0o711)
        self._executor_path = install(os.path.join(self._tmp, "executor"))
        self.isolation = "bwrap" if bwrap_works() else "rlimits"
        root = os.geteuid() == 0
        self._drop_uid = root and (self.isolation == "bwrap" or all(map(_readable_by_others, _python_dirs())))
        self._uid_base = 200000 + (os.getpid() % 10000) * 100
        self._announce(root)
        self._prewarm()

    def _announce(self, root: bool) -> None:
        who = "an unprivileged uid" if self._drop_uid else ("ROOT" if root else "the current user")
        if self.isolation == "bwrap":
            log.info("local sandbox: bubblewrap isolation (no network, read-only system dirs), "
                     "snippets run as %s", who)
            return
        log.warning(
            "local sandbox: NO ISOLATION — only rlimits (time, memory, processes, output); "
            "snippets run as %s, can read what it can read and reach the network. Install "
            "bubblewrap or use sandbox.backend=docker for untrusted code.", who)

    def _argv(self, slot: int) -> list[str]:
        opts = ["--preimport", ",".join(self.cfg.preimport)]
        if self._drop_uid:
            opts += ["--uid", str(self._uid_base + slot % 100)]
        if self.isolation != "bwrap":
            return [*launch_argv(sys.executable, self._executor_path), *opts, "--workdir-base", self._tmp]
        cmd = [shutil.which("bwrap"), "--unshare-net", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
               "--perms", "1777", "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/etc",
               "--perms", "0755", "--dir", "/opt"]
        for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/ld.so.cache",
                  "/etc/localtime", "/etc/alternatives", "/etc/ssl"):
            cmd += ["--ro-bind-try", d, d]
        for d in _python_dirs():
            for parent in reversed(Path(d).parents[:-1]):
                cmd += ["--perms", "0755", "--dir", str(parent)]
            cmd += ["--ro-bind", d, d]
        cmd += ["--ro-bind", self._executor_path, _SANDBOX_EXECUTOR, "--chdir", "/tmp"]
        return [*cmd, *launch_argv(sys.executable, _SANDBOX_EXECUTOR), *opts, "--workdir-base", "/tmp"]

    def _new_worker(self, slot: int) -> Worker:
        return LocalWorker(slot, self._argv(slot), dict(_BASE_ENV, HOME="/tmp"))

    def worker_pids(self) -> list[int]:
        """PIDs of the idle executor processes (for tests and diagnostics)."""
        return [w.pid for w in list(self._idle.queue) if isinstance(w, LocalWorker)]

    def close(self) -> None:
        super().close()
        self._remove_tmp()
