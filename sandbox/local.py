"""The ``local`` sandbox backend: a pool of fork-server executors running on the host.

Each worker is the executor package (``sandbox/executor/``) run by ``python -I`` with a minimal
environment.  Isolation is the best the host offers, stated in ``.isolation`` and logged at
start-up (``sandbox/THREAT_MODEL.md`` has the details and the tests that prove them):

* ``bwrap``: as root, a launcher (``_LAUNCH``, in a private mount namespace) mounts one tmpfs
  capped in bytes and inodes for the writable dirs (``/work``, ``/tmp``, ``/dev/shm``), stages
  the Python dirs, drops to the worker's own unprivileged uid and starts bubblewrap: new user
  namespace without nested ones (``--disable-userns``), the executor as PID 1 of a new pid
  namespace, no network, own ipc/uts/cgroup namespaces, read-only system and Python dirs
  (a virtualenv is mounted at ``/opt/venv``), read-only ``/`` and ``/dev``, no home, no project
  tree.  Without root, bubblewrap starts directly with ``--size``-capped tmpfs.  The executor
  exits when its stdin closes, i.e. when the host process dies.
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

from sandbox.base import register
from sandbox.config import SandboxConfig
from sandbox.executor import install, launch_argv
from sandbox.pool import WorkerPool
from sandbox.worker import FramedChannel, Worker, WorkerError

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
"""Seconds an executor may take to pre-import its modules and greet."""

_SANDBOX_EXECUTOR = "/opt/cleaner"
_VENV = "/opt/venv"
_SCRATCH = {"work": "/work", "tmp": "/tmp", "shm": "/dev/shm"}
"""The writable dirs inside bubblewrap (name of the source dir -> mount point), emptied by the
executor before every snippet."""
_LAUNCH = """set -e
mnt=$1 uid=$2 size=$3 inodes=$4
shift 4
mount -t tmpfs -o "size=${size}m,nr_inodes=$inodes,mode=0755,nosuid,nodev" cleaner-scratch "$mnt"
mkdir -m 1777 "$mnt/work" "$mnt/tmp" "$mnt/shm"
while [ "$1" != "--" ]; do mount --rbind "$1" "$2"; shift 2; done
shift
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all -- "$@"
"""
"""Run as root inside a private mount namespace (``unshare --mount``): one tmpfs capped in bytes
and inodes for the scratch dirs, the Python dirs staged where an unprivileged uid can bind
them, then bubblewrap as the worker's own unprivileged uid.  Nothing is mounted on the host."""
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """True when ``bwrap`` exists and can create the namespaces we use (as an unprivileged uid
    when this process is root, as the workers do)."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    probe = [exe, "--unshare-user", "--disable-userns", "--unshare-pid", "--as-pid-1", "--unshare-net",
             "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        probe = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", "--", *probe]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@lru_cache(maxsize=1)
def launcher_works() -> bool:
    """True when the capped-scratch launcher can run here: util-linux and a shell exist and this
    process may mount a tmpfs in a private mount namespace (root with CAP_SYS_ADMIN)."""
    tools = all(shutil.which(tool) for tool in ("unshare", "mount", "mkdir", "setpriv"))
    if not tools or not os.path.exists("/bin/sh"):
        return False
    with tempfile.TemporaryDirectory() as probe:
        cmd = [shutil.which("unshare"), "--mount", "--", "/bin/sh", "-c",
               'mount -t tmpfs -o size=1m,nr_inodes=16 cleaner-probe "$0"', probe]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0
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


def _python_binds() -> tuple[list[tuple[str, str]], str]:
    """(source, destination) dirs of this Python inside bubblewrap, and its executable there.

    A virtualenv is mounted at ``/opt/venv`` whatever its host path (it finds itself through
    its ``pyvenv.cfg``), so a clone under ``/tmp`` or ``/work`` cannot collide with the scratch
    dirs; the base installation keeps its path (the venv's ``home`` points there)."""
    binds, exe = [], sys.executable
    if sys.prefix != sys.base_prefix:
        binds.append((sys.prefix, _VENV))
        exe = os.path.join(_VENV, os.path.relpath(sys.executable, sys.prefix))
    base = {sys.base_prefix, sys.base_exec_prefix, str(Path(os.path.realpath(sys.executable)).parent.parent)}
    binds += [(d, d) for d in sorted(base) if d and os.path.isdir(d) and d != sys.prefix]
    clash = [d for _, d in binds for m in _SCRATCH.values() if d == m or d.startswith(m + "/")]
    if clash:
        raise ValueError(f"sandbox.backend=local: the Python installation {clash} lies under a "
                         f"writable sandbox dir ({sorted(_SCRATCH.values())}); install it elsewhere")
    return binds, exe


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


def _bwrap(scratch: list[str], pydirs: list[tuple[str, str]], executor_dir: str) -> list[str]:
    """bubblewrap: new user (no nested ones), pid (the executor is PID 1), net, ipc, uts and
    cgroup namespaces; read-only system and Python dirs; ``scratch`` args mount the writable
    dirs; ``pydirs`` are (source, destination) pairs; everything else read-only."""
    cmd = [shutil.which("bwrap"), "--unshare-user", "--disable-userns", "--unshare-pid", "--as-pid-1",
           "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
           "--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", "/opt"]
    for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/ld.so.cache",
              "/etc/localtime", "/etc/alternatives", "/etc/ssl"):
        cmd += ["--ro-bind-try", d, d]
    for source, dest in pydirs:
        for parent in reversed(Path(dest).parents[:-1]):
            cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", source, dest]
    cmd += [*scratch, "--ro-bind", executor_dir, _SANDBOX_EXECUTOR, "--remount-ro", "/dev",
            "--remount-ro", "/", "--chdir", "/work"]
    return cmd


@register("local")
class LocalSandbox(WorkerPool):
    """Pool of ``cfg.workers`` host executors; see the module docstring for isolation."""

    name = "local"

    def __init__(self, cfg: SandboxConfig, spawn: bool = False):
        """``spawn``: run every snippet in a fresh interpreter (the benchmark's baseline)."""
        super().__init__(cfg)
        self.spawn = spawn
        self._tmp = tempfile.mkdtemp(prefix="cleaner-sandbox-")
        self._remove_tmp = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)
        os.chmod(self._tmp, 0o711)
        self._executor_path = install(os.path.join(self._tmp, "executor"))
        root = os.geteuid() == 0
        # as root, workers start through the launcher (the Python dirs under /root are not
        # readable by the workers' uids otherwise): without it there is no isolation to offer
        self.isolation = "bwrap" if bwrap_works() and (not root or launcher_works()) else "rlimits"
        self._drop_uid = root and (self.isolation == "bwrap" or all(map(_readable_by_others, _python_dirs())))
        self._capped = self.isolation == "bwrap" and root
        if self._capped:
            os.makedirs(os.path.join(self._tmp, "scratch"), mode=0o755)
            for i in range(len(_python_binds()[0])):
                os.makedirs(os.path.join(self._tmp, "stage", str(i)), mode=0o755)
        self._uid_base = 200000 + (os.getpid() % 10000) * 100
        self._announce(root)
        self._prewarm()

    def _announce(self, root: bool) -> None:
        who = "an unprivileged uid" if self._drop_uid else ("ROOT" if root else "the current user")
        if self.isolation == "bwrap":
            log.info("local sandbox: bubblewrap isolation (no network, read-only system dirs), "
                     "snippets run as %s", who)
            if not self._capped:
                log.warning("local sandbox: not root, so the scratch tmpfs are capped in bytes but "
                            "not in inodes")
            return
        log.warning(
            "local sandbox: NO ISOLATION — only rlimits (time, memory, processes, output); "
            "snippets run as %s, can read what it can read and reach the network. Install "
            "bubblewrap (as root: with the right to mount, for `unshare --mount`) or use "
            "sandbox.backend=docker for untrusted code.", who)

    def _argv(self, slot: int) -> list[str]:
        opts = ["--preimport", ",".join(self.cfg.preimport), *(["--spawn"] if self.spawn else [])]
        if self.isolation != "bwrap":
            if self._drop_uid:
                opts += ["--uid", str(self._uid_base + slot % 100)]
            return [*launch_argv(sys.executable, self._executor_path), *opts, "--workdir-base", self._tmp]
        opts += ["--workdir-base", "/work", "--scratch", ",".join(_SCRATCH.values())]
        pybinds, python = _python_binds()
        executor = [*launch_argv(python, _SANDBOX_EXECUTOR), *opts]
        if not self._capped:
            sized = ["--size", str(self.cfg.scratch_mb * 2**20)]
            scratch = [a for dest in _SCRATCH.values() for a in (*sized, "--perms", "1777", "--tmpfs", dest)]
            return [*_bwrap(scratch, pybinds, self._executor_path), *executor]
        uid = self._uid_base + slot % 100
        stages = [os.path.join(self._tmp, "stage", str(i)) for i in range(len(pybinds))]
        scratch = [a for name, dest in _SCRATCH.items()
                   for a in ("--bind", os.path.join(self._tmp, "scratch", name), dest)]
        binds = _bwrap(scratch, [(stage, dest) for stage, (_, dest) in zip(stages, pybinds)], self._executor_path)
        return [shutil.which("unshare"), "--mount", "--", "/bin/sh", "-c", _LAUNCH, "cleaner-launch",
                os.path.join(self._tmp, "scratch"), str(uid), str(self.cfg.scratch_mb),
                str(self.cfg.scratch_inodes), *[a for (src, _), stage in zip(pybinds, stages) for a in (src, stage)],
                "--",
                *binds, *executor]

    def _new_worker(self, slot: int) -> Worker:
        return LocalWorker(slot, self._argv(slot), dict(_BASE_ENV, HOME="/tmp"))

    def worker_pids(self) -> list[int]:
        """PIDs of the idle executor processes (for tests and diagnostics)."""
        return [w.pid for w in list(self._idle.queue) if isinstance(w, LocalWorker)]

    def close(self) -> None:
        super().close()
        self._remove_tmp()
