"""The ``docker`` sandbox backend (a warm pool of locked-down containers) and ``auto``.

Each pool slot is a long-lived container of ``cfg.image`` running the executor package
(``sandbox/executor/``, mounted read-only) as PID 1, which connects once to a unix socket the
host listens on in a per-container directory mounted read-only (the listener is closed and the
socket file removed as soon as the executor is connected: no writable host directory in the
container).  A snippet therefore costs a fork inside an already running container, not a
container start.  Containers run with ``--network none``, a read-only root, tmpfs ``/work``,
``/tmp`` and ``/dev/shm`` (each capped in bytes and inodes, emptied before every snippet),
memory / pids / cpu limits, a non-root uid (distinct per slot, so RLIMIT_NPROC counts per
container), all capabilities dropped and no-new-privileges.  A container is replaced after
``cfg.runs_per_container`` snippets or on any anomaly (died, hung, garbage); see
``sandbox/pool.py`` for retries, spares and worker-killing snippets.  All containers carry
labels naming the pool and its owner process: ``close()`` removes the pool's own, and a new
pool removes those of dead owners.

``auto`` picks docker when the SDK, an engine and the image are present, else local with a
warning naming what is missing.  Build the image with ``make sandbox-image``
(``infra/sandbox/build_image.sh``).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
import weakref

from sandbox.base import register
from sandbox.config import SandboxConfig
from sandbox.executor import install, launch_argv
from sandbox.local import LocalSandbox
from sandbox.pids import pid_running
from sandbox.pool import WorkerPool
from sandbox.result import SandboxInfraError
from sandbox.worker import FramedChannel, Worker, WorkerError

log = logging.getLogger(__name__)

LABEL = "cleaner.sandbox"
"""Label on every container made by a pool; its value is the pool id."""
STARTUP_TIMEOUT_S = 60.0
"""Seconds a container may take to start, pre-import and open its socket."""
EXECUTOR_HEADROOM_MB = 256
"""Container memory on top of ``memory_mb`` (and of the scratch tmpfs, which count against it)
for the executor and pre-imported modules."""
_SOCK_DIR = "/run/cleaner"
_EXECUTOR = "/opt/cleaner"
_SCRATCH = {"/work": "exec", "/tmp": "noexec", "/dev/shm": "noexec"}
_WIPED = [*_SCRATCH, "/dev/mqueue"]
"""The container's only writable dirs (tmpfs, capped in bytes and inodes), emptied by the
executor before every snippet: path -> extra mount option."""


def docker_client(timeout: float = 30):
    """A Docker SDK client, or ``SandboxInfraError`` saying why none is reachable."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxInfraError("sandbox.backend=docker: the 'docker' package is not installed") from exc
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # any failure means no usable engine
        raise SandboxInfraError(
            f"sandbox.backend=docker: no Docker engine answers ({exc}); start one with "
            "infra/docker/start-dockerd.sh") from exc
    return client


def image_present(client, image: str) -> bool:
    import docker.errors

    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False


class ContainerWorker(Worker):
    """One container running the executor, reached through a unix socket the host listens on.

    The host binds the socket in a per-container directory that the container sees read-only;
    the executor connects to it once, after which the host closes the listener and removes the
    socket file, so nothing in the container can reach the host through it any more."""

    def __init__(self, slot: int, pool: DockerSandbox):
        super().__init__(slot)
        self.hostdir = tempfile.mkdtemp(prefix=f"slot{slot}-", dir=pool.tmp)
        os.chmod(self.hostdir, 0o755)
        self.sock: socket.socket | None = None
        self.container = None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            path = os.path.join(self.hostdir, "executor.sock")
            listener.bind(path)
            os.chmod(path, 0o666)  # the container's uid connects (it cannot write the directory)
            listener.listen(1)
            self.container = pool.client.containers.run(**pool.container_spec(slot, self.hostdir))
            self._accept(listener, path)
        except WorkerError:
            self.kill()
            raise
        except Exception as exc:  # any engine error is an infra failure
            self.kill()
            raise WorkerError(f"could not start a container from {pool.cfg.image!r}: {exc}") from exc
        finally:
            listener.close()

    def _accept(self, listener: socket.socket, path: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        listener.settimeout(0.05)
        while time.monotonic() < deadline:
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                self.container.reload()
                if self.container.status in {"exited", "dead"}:
                    logs = self.container.logs(tail=20).decode("utf-8", "replace")
                    raise WorkerError(f"container exited at start-up: {logs.strip()[-500:]}") from None
                continue
            os.unlink(path)
            sock.settimeout(None)
            self.sock = sock
            self.channel = FramedChannel(sock.fileno(), sock.fileno())
            self.await_hello(max(1.0, deadline - time.monotonic()))
            return
        raise WorkerError(f"container executor did not connect within {STARTUP_TIMEOUT_S}s")

    def kill(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception as exc:  # noqa: BLE001 - already gone is fine; log the rest
                if "No such container" not in str(exc) and "already in progress" not in str(exc):
                    log.warning("could not remove container %s: %s", self.container.short_id, exc)
            self.container = None
        shutil.rmtree(self.hostdir, ignore_errors=True)


@register("docker")
class DockerSandbox(WorkerPool):
    """Warm pool of ``cfg.workers`` containers; see the module docstring."""

    name = "docker"
    isolation = "docker"

    def __init__(self, cfg: SandboxConfig, client=None, spawn: bool = False):
        """``spawn``: run every snippet in a fresh interpreter (the benchmark's baseline)."""
        super().__init__(cfg)
        self.spawn = spawn
        self.client = client or docker_client()
        if not image_present(self.client, cfg.image):
            raise SandboxInfraError(
                f"sandbox.image: image {cfg.image!r} not found; build it with `make sandbox-image` "
                "(infra/sandbox/build_image.sh)")
        self.pool_id = uuid.uuid4().hex[:12]
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.removed_leftovers = remove_leftovers(self.client)
        self.tmp = tempfile.mkdtemp(prefix="cleaner-docker-")
        # runs on close() or, if the owner forgets, when the pool is collected or Python exits
        self._remove_all = weakref.finalize(self, _remove_pool, self.client, self.pool_id, self.tmp)
        os.chmod(self.tmp, 0o711)
        self.executor_path = install(os.path.join(self.tmp, "executor"))
        self._uid_base = 300000 + (os.getpid() % 10000) * 100
        log.info("docker sandbox: pool %s, %d containers of %s", self.pool_id, cfg.workers, cfg.image)
        self._prewarm()

    def container_spec(self, slot: int, hostdir: str) -> dict:
        cfg = self.cfg
        uid = self._uid_base + slot % 100
        command = [*launch_argv("python3", _EXECUTOR), "--connect", f"{_SOCK_DIR}/executor.sock",
                   "--preimport", ",".join(cfg.preimport), "--workdir-base", "/work",
                   "--scratch", ",".join(_WIPED), *(["--spawn"] if self.spawn else [])]
        mem = f"{cfg.memory_mb + EXECUTOR_HEADROOM_MB + len(_SCRATCH) * cfg.scratch_mb}m"
        scratch = f"size={cfg.scratch_mb}m,nr_inodes={cfg.scratch_inodes},mode=1777"
        return dict(
            image=cfg.image, command=command, detach=True, user=f"{uid}:{uid}",
            name=f"cleaner-sbx-{self.pool_id}-{slot}-{uuid.uuid4().hex[:6]}",
            labels={LABEL: self.pool_id, f"{LABEL}.owner": self.owner},
            network_mode="none", read_only=True, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], ipc_mode="private",
            mem_limit=mem, memswap_limit=mem, pids_limit=cfg.max_processes + 8,
            nano_cpus=int(cfg.cpus * 1e9),
            tmpfs={path: f"rw,nosuid,nodev,{opts},{scratch}" for path, opts in _SCRATCH.items()},
            volumes={hostdir: {"bind": _SOCK_DIR, "mode": "ro"},
                     self.executor_path: {"bind": _EXECUTOR, "mode": "ro"}},
            environment={"HOME": "/work", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
                         "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            hostname="sandbox", init=False,
        )

    def _new_worker(self, slot: int) -> Worker:
        return ContainerWorker(slot, self)

    def containers(self) -> list:
        """This pool's containers as the engine lists them (for tests and diagnostics)."""
        return self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.pool_id}"})

    def close(self) -> None:
        super().close()
        self._remove_all()


def _remove_pool(client, pool_id: str, tmp: str) -> None:
    """Remove every container labelled with ``pool_id`` and the pool's host directory."""
    try:
        containers = client.containers.list(all=True, filters={"label": f"{LABEL}={pool_id}"})
    except Exception as exc:  # noqa: BLE001 - engine gone: leftovers are removed by the next pool
        log.warning("docker sandbox: could not list pool %s containers: %s", pool_id, exc)
        containers = []
    for container in containers:
        try:
            container.remove(force=True)
        except Exception as exc:  # noqa: BLE001 - removal in progress or gone
            log.debug("container %s: %s", container.short_id, exc)
    shutil.rmtree(tmp, ignore_errors=True)


def remove_leftovers(client) -> int:
    """Remove containers of pools whose owner process (on this host) is gone; return how many."""
    host = socket.gethostname()
    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        owner = container.labels.get(f"{LABEL}.owner", "")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or (pid.isdigit() and pid_running(int(pid))):
            continue
        try:
            container.remove(force=True)
            removed += 1
        except Exception as exc:  # noqa: BLE001 - another pool may be removing it too
            log.debug("leftover %s: %s", container.short_id, exc)
    if removed:
        log.warning("docker sandbox: removed %d containers left by a crashed pool", removed)
    return removed


@register("auto")
def auto_sandbox(cfg: SandboxConfig):
    """Docker when the SDK, an engine and ``cfg.image`` are present, else local (with a warning)."""
    try:
        client = docker_client(timeout=5)
        missing = None if image_present(client, cfg.image) else (
            f"image {cfg.image!r} (build it with `make sandbox-image`)")
    except SandboxInfraError as exc:
        client, missing = None, str(exc)
    if missing is None:
        return DockerSandbox(cfg, client=client)
    log.warning("sandbox.backend=auto: using the local backend, docker is unavailable: %s", missing)
    return LocalSandbox(cfg)
