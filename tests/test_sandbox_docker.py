"""Docker backend: container lock-down flags, pool lifecycle, infra retries, ``auto`` and scale.

Marked ``docker``: skipped with the reason when no engine answers or the image is missing.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from sandbox.docker_backend import LABEL, DockerSandbox, docker_client, image_present, remove_leftovers
from sandbox.local import LocalSandbox
from sandbox.result import SandboxInfraError

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client():
    try:
        cl = docker_client(timeout=10)
    except SandboxInfraError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    if not image_present(cl, SandboxConfig().image):
        pytest.skip(f"Docker image {SandboxConfig().image!r} missing: run `make sandbox-image`")
    return cl


def _cfg(**kw) -> SandboxConfig:
    base = dict(backend="docker", workers=2, timeout_s=2.0, memory_mb=256, preimport=["math"])
    return SandboxConfig(**{**base, **kw})


def test_containers_are_locked_down(client):
    with DockerSandbox(_cfg(max_processes=40, cpus=0.5, spare_workers=0), client=client) as box:
        containers = box.containers()
        assert len(containers) == 2
        for c in containers:
            c.reload()
            host = c.attrs["HostConfig"]
            assert host["NetworkMode"] == "none"
            assert host["ReadonlyRootfs"] is True
            assert host["CapDrop"] == ["ALL"]
            assert "no-new-privileges" in host["SecurityOpt"]
            assert host["PidsLimit"] == 48
            assert host["Memory"] == (256 + 256 + 3 * 64) * 2**20
            assert host["NanoCpus"] == 5 * 10**8
            assert set(host["Tmpfs"]) == {"/work", "/tmp", "/dev/shm"}
            assert all("size=64m,nr_inodes=4096" in opts for opts in host["Tmpfs"].values())
            assert [m["RW"] for m in c.attrs["Mounts"] if m["Type"] == "bind"] == [False, False]
            assert not c.attrs["Config"]["User"].startswith("0")
        uids = {c.attrs["Config"]["User"] for c in containers}
        assert len(uids) == 2, "each slot runs as its own uid"
        r = box.run("import os\nprint(os.getuid() != 0, os.getcwd() == '/work')")
        assert r.stdout == "True True\n"


def test_close_removes_every_container(client):
    box = DockerSandbox(_cfg(), client=client)
    pool_id = box.pool_id
    assert box.run("print(1)").ok
    box.close()
    assert client.containers.list(all=True, filters={"label": f"{LABEL}={pool_id}"}) == []


def test_leftovers_of_a_dead_owner_are_removed(client):
    fake = client.containers.create(SandboxConfig().image, command=["true"],
                                    labels={LABEL: "crashed", f"{LABEL}.owner": f"{_hostname()}:999999999"},
                                    name=f"cleaner-sbx-leftover-{uuid.uuid4().hex[:6]}")
    with DockerSandbox(_cfg(workers=1, spare_workers=0), client=client) as box:
        assert box.removed_leftovers >= 1
        live = box.containers()
        assert remove_leftovers(client) == 0, "a live pool's containers are not leftovers"
        assert box.containers() == live
    with pytest.raises(Exception, match="No such container|404"):
        fake.reload()


def test_container_replaced_after_runs_per_container(client):
    with DockerSandbox(_cfg(workers=1, runs_per_container=3, spare_workers=0), client=client) as box:
        first = {c.id for c in box.containers()}
        results = [box.run(f"print({i})") for i in range(7)]
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(7)]
        stats = box.stats()
        assert stats["retired"] == 2 and stats["infra_retries"] == 0
        assert not first & {c.id for c in box.containers()}


def test_killed_container_is_retried_on_another(client):
    with DockerSandbox(_cfg(workers=2, infra_retries=2, spare_workers=0), client=client) as box:
        victim = box.containers()[0]
        victim.kill()
        results = box.run_many([f"print({i})" for i in range(6)])
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
        stats = box.stats()
        assert stats["infra_retries"] >= 1 and stats["worker_restarts"] >= 1
        assert stats["executions"] == 6


def test_hung_container_is_replaced(client, monkeypatch):
    monkeypatch.setattr("sandbox.pool.REQUEST_GRACE_S", 1.0)
    with DockerSandbox(_cfg(workers=1, timeout_s=1.0, wall_timeout_s=1.0, infra_retries=1, spare_workers=0), client=client) as box:
        (victim,) = box.containers()
        victim.pause()
        r = box.run("print('fresh')")
        assert r.ok and r.stdout == "fresh\n"
        assert box.stats()["infra_retries"] == 1
        assert victim.id not in {c.id for c in box.containers()}


def test_infra_failure_is_raised_not_scored(client):
    with DockerSandbox(_cfg(workers=1, infra_retries=1, spare_workers=0), client=client) as box:
        box.container_spec = _broken_spec(box.container_spec)
        box.containers()[0].kill()
        with pytest.raises(SandboxInfraError, match="infra_retries=1"):
            box.run("print(1)")
        assert box.stats()["executions"] == 0


def _broken_spec(spec):
    def broken(slot, hostdir):
        return {**spec(slot, hostdir), "command": ["python3", "-c", "raise SystemExit(3)"]}

    return broken


def test_missing_image_names_the_field(client):
    with pytest.raises(SandboxInfraError, match="sandbox.image.*make sandbox-image"):
        DockerSandbox(_cfg(image="cleaner-no-such-image:never"), client=client)


def test_auto_picks_docker_when_available(client):
    with make_sandbox(_cfg(backend="auto", workers=1)) as box:
        assert box.name == "docker" and box.run("print(5)").stdout == "5\n"


def test_auto_falls_back_to_local_and_names_what_is_missing(client, caplog):
    with caplog.at_level(logging.WARNING, logger="sandbox.docker_backend"):
        with make_sandbox(_cfg(backend="auto", workers=1, image="cleaner-no-such-image:never")) as box:
            assert isinstance(box, LocalSandbox)
            assert box.run("print(5)").ok
    assert "cleaner-no-such-image:never" in caplog.text


@pytest.mark.slow
def test_ten_thousand_executions_at_concurrency_32(client):
    from concurrent.futures import ThreadPoolExecutor

    n = 10_000
    cfg = _cfg(workers=8, timeout_s=10.0, runs_per_container=500)  # ~20 replacements on the way
    with DockerSandbox(cfg, client=client) as box, ThreadPoolExecutor(max_workers=32) as ex:
        tokens = [uuid.uuid4().hex[:8] for _ in range(n)]
        results = list(ex.map(box.run, [f"print('{t}', {i} * 3)" for i, t in enumerate(tokens)]))
        assert len(results) == n
        mismatched = [i for i, (t, r) in enumerate(zip(tokens, results))
                      if not r.ok or r.stdout != f"{t} {i * 3}\n"]
        assert mismatched == []
        stats = box.stats()
        assert stats["executions"] == n and stats["retired"] >= 10 and stats["infra_errors"] == 0


def _hostname() -> str:
    import socket

    return socket.gethostname()
