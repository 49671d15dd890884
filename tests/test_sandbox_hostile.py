"""Hostile snippets against the local (bubblewrap) and docker backends.

Each program must end with a clear, classified result within its time bound, leave the host
unaffected (no leftover processes, no files outside the sandbox, no secrets read, no network),
and the next snippet on the same pool must succeed.  Docker cases are marked ``docker`` and
skipped only when no engine or image is present; local cases are skipped when the local
backend has no real isolation (rlimits only), because hostile code is unsafe there.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from sandbox.config import SandboxConfig
from sandbox.docker_backend import DockerSandbox, docker_client, image_present
from sandbox.executor.forker import NAME
from sandbox.local import LocalSandbox, LocalWorker
from sandbox.result import SandboxInfraError

TIMEOUT_S = 1.0  # CPU seconds
WALL_S = 5.0  # the wall-clock backstop: sleepers end there; a spinner reaches it only below 1/5 of a CPU
BOUND_S = WALL_S + 6.0
SECRET = f"s3cr3t-{uuid.uuid4().hex}"
FORKER = NAME.decode()  # the executor's forker (sandbox/executor/forker.py) is no leftover
CFG = dict(timeout_s=TIMEOUT_S, wall_timeout_s=WALL_S, memory_mb=256, max_processes=32, workers=2, file_mb=16,
           max_output_bytes=8192, preimport=["math"], infra_retries=1)


def _docker_or_skip():
    try:
        client = docker_client(timeout=5)
    except SandboxInfraError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    image = SandboxConfig().image
    if not image_present(client, image):
        pytest.skip(f"Docker image {image!r} missing: run `make sandbox-image`")
    return client


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def box(request):
    os.environ["CLEANER_HOSTILE_SECRET"] = SECRET
    try:
        if request.param == "docker":
            pool = DockerSandbox(SandboxConfig(backend="docker", **CFG), client=_docker_or_skip())
        else:
            pool = LocalSandbox(SandboxConfig(backend="local", **CFG))
            if pool.isolation != "bwrap" or not pool._drop_uid:
                pool.close()
                pytest.skip("local backend has rlimits only (no bubblewrap / uid drop): "
                            "hostile code is not contained there")
    finally:
        del os.environ["CLEANER_HOSTILE_SECRET"]
    with pool:
        yield pool


@pytest.fixture(scope="module")
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("0.0.0.0", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def leftover_processes(pool) -> int:
    """Processes left from snippets: a snippet runs in its own session, so anything in the
    sandbox outside the executor's session (the executor and its idle pre-forked child) counts."""
    if isinstance(pool, DockerSandbox):
        count = 0
        for c in pool.containers():
            top = c.top(ps_args="-o pid,ppid,sid,comm")
            rows = [dict(zip(top["Titles"], r)) for r in top["Processes"] or []]
            count += _outside_executor_session([(r["PID"], r["PPID"], r["SID"]) for r in rows
                                                if r["COMMAND"] != FORKER])
        return count
    count = 0
    for worker in list(pool._idle.queue):
        if isinstance(worker, LocalWorker):
            # one read of /proc per process; one that exited meanwhile (ppid -1) is no leftover
            stats = [(p, *_stat(p)) for p in _descendants(worker.pid)]
            count += _outside_executor_session([(p, ppid, sid) for p, comm, ppid, sid in stats
                                                if comm not in ("bwrap", FORKER) and ppid != -1])
    return count


def _outside_executor_session(rows) -> int:
    """rows: (pid, ppid, sid), the forker left out; the executor is the one whose parent is not
    in the set.  Its idle pre-forked child leads a session of its own (it isolates itself
    before its request)."""
    rows = [tuple(map(str, row)) for row in rows]
    pids = {pid for pid, _, _ in rows}
    executors = [(pid, sid) for pid, ppid, sid in rows if ppid not in pids]
    if not executors:
        return 0
    (exe, exe_sid), = executors
    idle = [pid for pid, ppid, sid in rows if ppid == exe and sid == pid]
    return sum(1 for _, _, sid in rows if sid != exe_sid) - min(1, len(idle))


def _stat(pid: int) -> tuple[str, int, int]:
    """(comm, ppid, session id) of a process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            head, tail = fh.read().rsplit(")", 1)
        fields = tail.split()
        return head.split("(", 1)[1], int(fields[1]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return "", -1, -1


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parents[int(entry)] = _stat(int(entry))[1]
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def not_ok(*kinds):
    def check(r, ctx):
        assert not r.ok, r
        if kinds:
            assert r.error_kind in kinds or any(k.endswith(":") and r.error_kind.startswith(k) for k in kinds), r
    return check


def is_ok(expected_stdout=None):
    def check(r, ctx):
        assert r.ok, r
        if expected_stdout is not None:
            assert r.stdout.strip() == expected_stdout
    return check


def host_path_untouched(r, ctx):
    assert not os.path.exists(ctx["host_file"]), "snippet wrote to the host"


def no_secret(r, ctx):
    assert SECRET not in r.stdout and SECRET not in r.stderr


def no_connection(r, ctx):
    assert not r.ok or "connected" not in r.stdout
    with pytest.raises(BlockingIOError):
        ctx["listener"].accept()


CASES = {
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", not_ok("BlockingIOError", "timeout", "memory")),
    "thread_bomb": ("import threading, time\nwhile True:\n"
                    "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
                    not_ok("RuntimeError", "memory", "timeout", "wall_timeout")),
    "memory_hog": ("x = []\nwhile True:\n    x.append(bytearray(64 * 2**20))", not_ok("memory")),
    "numpy_memory_hog": ("import numpy\nnumpy.ones((10**6, 10**5))", not_ok("memory")),
    "infinite_loop": ("while True:\n    pass", not_ok("timeout")),
    "sleep_past_timeout": ("import time\ntime.sleep(60)", not_ok("wall_timeout")),
    "ignore_sigterm": ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                       "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", not_ok("wall_timeout")),
    "ignore_sigxcpu": ("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
                       not_ok("timeout")),
    "huge_stdout": ("while True:\n    print('A' * 10000)", not_ok("output_limit", "timeout")),
    "binary_output": ("import sys\nsys.stdout.buffer.write(bytes(range(256)) * 4)\nprint()", is_ok()),
    "connect_host_port": ("import socket\ns = socket.create_connection(('{host_ip}', {port}), timeout=1)\n"
                          "print('connected')", no_connection),
    "connect_internet": ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('connected')",
                         not_ok()),
    "dns_lookup": ("import socket\nprint(socket.getaddrinfo('example.com', 80))", not_ok()),
    "write_system_dir": ("open('/usr/pwned', 'w').write('x')", not_ok("PermissionError", "OSError")),
    "write_host_path": ("import os\nos.makedirs(os.path.dirname('{host_file}'), exist_ok=True)\n"
                        "open('{host_file}', 'w').write('x')", host_path_untouched),
    "read_host_file": ("print(open('{secret_file}').read())", no_secret),
    "env_secrets": ("import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ').read())", no_secret),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(0.2)\n"
                    "print('still here')", lambda r, ctx: None),
    "kill_everything": ("import os, signal\nos.kill(-1, signal.SIGKILL)", lambda r, ctx: None),
    "block_on_stdin": ("import sys\ndata = sys.stdin.read()\nprint(len(data))\ninput()", not_ok("EOFError")),
    "deep_recursion": ("import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)",
                       not_ok("signal:", "RecursionError", "memory", "timeout")),
    "fill_work_dir": ("with open('big', 'wb') as fh:\n    while True:\n        fh.write(b'0' * 2**20)",
                      not_ok("OSError")),
    "shell_out": ("import subprocess\nr = subprocess.run(['sh', '-c', 'id -u; echo x > {host_file}'], "
                  "capture_output=True, text=True)\nprint(r.stdout)", host_path_untouched),
    "segfault": ("import ctypes\nctypes.string_at(0)", not_ok("signal:SIGSEGV")),
    "zombies": ("import os\nfor _ in range(10):\n    if os.fork() == 0:\n        os._exit(0)\nprint('made')",
                is_ok("made")),
    "daemonised_child": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                         "        while True:\n            print('bg', flush=True)\n            time.sleep(0.01)\n"
                         "    os._exit(0)\ntime.sleep(0.1)\nprint('parent done')", lambda r, ctx: None),
    "setuid_root": ("import os\nos.setuid(0)", not_ok("PermissionError", "OSError")),  # EINVAL: no root in the userns
    "busy_children": ("import os\nfor _ in range(6):\n    if os.fork() == 0:\n        while True:\n"
                      "            pass\nwhile True:\n    pass", not_ok("timeout")),
    "close_own_pipes": ("import os\nos.close(1)\nos.close(2)\nimport time\ntime.sleep(0.1)", lambda r, ctx: None),
    "bad_surrogate": ("print('\\ud800')", not_ok("UnicodeEncodeError")),
    # against the executor (PID 1 of the sandbox, non-dumpable, snippet under seccomp)
    "ptrace_executor": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "assert libc.ptrace(16, 1, 0, 0) == 0, ctypes.get_errno()", not_ok("AssertionError")),
    "write_executor_memory": ("f = open('/proc/1/mem', 'r+b')\nf.seek(0x400000)\nf.write(b'\\xcc' * 4096)",
                              not_ok("PermissionError")),
    "limit_executor": ("import resource\nresource.prlimit(1, resource.RLIMIT_NOFILE, (0, 0))",
                       not_ok("PermissionError")),
    "stop_and_kill_executor": ("import os, signal, time\nos.kill(1, signal.SIGSTOP)\nos.kill(1, signal.SIGKILL)\n"
                               "time.sleep(0.1)\nprint('still here')", is_ok("still here")),
    "user_namespace": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                       "assert libc.unshare(0x10000000) == 0, ctypes.get_errno()", not_ok("AssertionError")),
    "io_uring": ("import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\nparams = ctypes.create_string_buffer(120)\n"
                 "fd = libc.syscall(425, 8, params)\nprint(fd, ctypes.get_errno())", is_ok("-1 1")),  # EPERM
    # accepted (THREAT_MODEL.md, "Accepted gaps"): each is contained, the next snippet runs
    "reset_oom_score_adj": ("open('/proc/self/oom_score_adj', 'w').write('0')\nx = []\nwhile True:\n"
                            "    x.append(bytearray(64 * 2**20))", not_ok("memory")),
    "forge_status_pipe": ("import os\nos.write(3, bytes([0]))\nos.close(1)\nos.close(2)\nimport time\n"
                          "time.sleep(30)", is_ok()),  # its own report: ok, exit 0, then killed with its group
    "read_mountinfo": ("print(open('/proc/self/mountinfo').read())", no_secret),
    # filling and persisting
    "inode_fill": ("import os\nfor d in ('/tmp', '/dev/shm', '.'):\n    try:\n        for i in range(10**6):\n"
                   "            open(f'{{d}}/f{{i}}', 'w').close()\n    except OSError as e:\n"
                   "        print(d, e.errno)", is_ok()),
    "socket_dir_fill": ("import os\nfor d in ('/run/cleaner', '/run', '/opt/cleaner'):\n    try:\n"
                        "        open(f'{{d}}/fill', 'wb').write(b'0' * 2**20)\n        print('wrote', d)\n"
                        "    except OSError:\n        pass", is_ok("")),
    "multiprocessing_pool": ("import multiprocessing as mp\nwith mp.Pool(4) as p:\n"
                             "    print(sum(p.map(abs, range(-50, 50))))", is_ok("2500")),
    "close_all_stdio": ("import os\nfor fd in range(5):\n    os.close(fd)\nimport time\ntime.sleep(0.1)\nos._exit(0)",
                        lambda r, ctx: None),
    "double_fork_writer": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                           "        while True:\n            open('/tmp/ghost', 'a').write('x')\n"
                           "            time.sleep(0.01)\n    os._exit(0)\ntime.sleep(0.05)", is_ok()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile(box, listener, tmp_path, name):
    code, check = CASES[name]
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    ctx = {"listener": listener, "host_file": str(tmp_path / "out" / f"pwned-{uuid.uuid4().hex}"),
           "secret_file": str(secret_file)}
    code = code.format(host_ip=_host_ip(), port=listener.getsockname()[1], **ctx)
    retries_before = box.stats()["infra_retries"]
    start = time.monotonic()
    result = box.run(code)
    assert time.monotonic() - start < BOUND_S
    check(result, ctx)
    assert result.error_kind is None or result.error_kind.strip()
    after = box.run("import os, time\ntime.sleep(0.05)\n"
                    "print('alive', os.listdir('/tmp'), os.listdir('/dev/shm'), os.listdir('.'))")
    assert after.ok and after.stdout == "alive [] [] []\n", after
    assert box.stats()["infra_retries"] == retries_before
    _wait_no_leftovers(box)


def _wait_no_leftovers(pool) -> None:
    deadline = time.monotonic() + 3
    while leftover_processes(pool) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes(pool) == 0


def _host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
