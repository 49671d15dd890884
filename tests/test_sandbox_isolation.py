"""The sandbox forgets, and a snippet cannot reach its executor: both backends, docker marked ``docker``.

Every probe runs on a pool of one worker (so consecutive snippets share the worker, which is
what an attack on persistence needs), with small scratch caps so that fills are quick.

Over ~400 lines on purpose: every guarantee of ``sandbox/THREAT_MODEL.md`` about forgetting and isolation
has its probe here, run on both backends (``tests/test_threat_model.py`` checks that each named probe exists).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from sandbox.config import SandboxConfig
from sandbox.docker_backend import (
    ContainerWorker,
    DockerSandbox,
    docker_client,
    image_present,
)
from sandbox.local import LocalSandbox, LocalWorker
from sandbox.result import SandboxInfraError

CFG = {"workers": 1, "spare_workers": 1, "timeout_s": 5.0, "memory_mb": 256, "max_processes": 32, "file_mb": 8,
       "scratch_mb": 4, "scratch_inodes": 256, "preimport": ["math"], "infra_retries": 2}
ALLOWED = {"/tmp", "/dev/shm", "/work"}


def _docker_or_skip():
    try:
        client = docker_client(timeout=5)
    except SandboxInfraError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    if not image_present(client, SandboxConfig().image):
        pytest.skip("Docker image missing: run `make sandbox-image`")
    return client


def make_pool(backend: str, **overrides):
    cfg = SandboxConfig(backend=backend, **{**CFG, **overrides})
    if backend == "docker":
        return DockerSandbox(cfg, client=_docker_or_skip())
    pool = LocalSandbox(cfg)
    if pool.isolation != "bwrap":
        pool.close()
        pytest.skip("local backend without bubblewrap isolates nothing")
    return pool


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def box(backend):
    with make_pool(backend) as pool:
        yield pool


WRITABLE = r'''
import json, os
found, made = [], []
for root, dirs, files in os.walk('/'):
    if root in ('/proc', '/sys', '/usr', '/lib', '/lib64', '/bin', '/sbin', '/opt', '/etc', '/root'):
        dirs[:] = []
        continue
    if os.access(root, os.W_OK):
        found.append(root)
        try:
            with open(os.path.join(root, 'marker-{tag}'), 'w') as fh:
                fh.write('x')
            made.append(root)
        except OSError:
            pass
print(json.dumps({{'found': found, 'made': made, 'cwd': os.getcwd()}}))
'''

LEFT = r'''
import json, os
left = {}
for d in ['/tmp', '/dev/shm', '/work', os.getcwd(), '/dev/mqueue']:
    if os.path.isdir(d):
        left[d] = [n for n in os.listdir(d) if d != '/work' or n != os.path.basename(os.getcwd())]
print(json.dumps(left))
'''


def test_writable_dirs_are_the_scratch_dirs_and_start_empty(box):
    r = box.run(WRITABLE.format(tag="a"))
    assert r.ok, r
    probe = json.loads(r.stdout)
    made = {d for d in probe["made"] if d != probe["cwd"]}
    assert made <= ALLOWED and {"/tmp", "/dev/shm"} <= made, probe
    after = box.run(LEFT)
    assert after.ok and json.loads(after.stdout) == {d: [] for d in json.loads(after.stdout)}, after.stdout
    assert box.stats()["worker_restarts"] == 0


LEAVE = r"""
import ctypes, os, socket, time
for d in ('/tmp', '/dev/shm', '.'):
    os.makedirs(os.path.join(d, 'left', 'deep'))
    for path in (os.path.join(d, 'left', 'deep', 'file'), os.path.join(d, '.hidden')):
        with open(path, 'w') as fh:
            fh.write('x')
    os.mkfifo(os.path.join(d, 'fifo'))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, b'cleaner-ghost', 0, 0, 0)
        srv = socket.socket(socket.AF_UNIX)
        srv.bind('\0cleaner-ghost')
        srv.listen(1)
        while True:
            open('/tmp/ghost', 'a').write('x')
            time.sleep(0.01)
    os._exit(0)
time.sleep(0.1)
print('left')
"""

FIND = r"""
import json, os, socket, time
time.sleep(0.1)
def comm(pid):
    try:
        with open(f'/proc/{pid}/comm') as fh:
            return fh.read().strip()
    except OSError:
        return ''
ghosts = [p for p in os.listdir('/proc') if p.isdigit() and comm(p) == 'cleaner-ghost']
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('\0cleaner-ghost')
    sock = 'connected'
except OSError:
    sock = 'refused'
print(json.dumps({'files': {d: sorted(os.listdir(d)) for d in ('/tmp', '/dev/shm', '.')},
                  'ghosts': len(ghosts), 'socket': sock}))
"""


def test_nothing_a_snippet_leaves_reaches_the_next_one(box):
    # files, dirs, hidden files and fifos in every writable dir, a setsid double-forked process
    # that keeps writing, an abstract unix socket it listens on: the next snippet on the same
    # worker finds none of them (one worker: it is the same executor and the same tmpfs)
    assert box.run(LEAVE).stdout == "left\n"
    r = box.run(FIND)
    assert r.ok, r
    assert json.loads(r.stdout) == {"files": {"/tmp": [], "/dev/shm": [], ".": []}, "ghosts": 0,
                                    "socket": "refused"}, r.stdout
    assert box.stats()["worker_restarts"] == 0


def test_ipc_keyrings_and_namespaces_are_refused(box):
    code = r'''
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    rc = getattr(libc, name)(*args)
    return 'ok' if rc >= 0 else errno.errorcode[ctypes.get_errno()]
print('shmget', call('shmget', 0, 4096, 0o1000 | 0o600))
print('msgget', call('msgget', 0, 0o1000 | 0o600))
print('mq_open', call('mq_open', b'/cleaner-q', os.O_CREAT | os.O_RDWR, 0o600, None))
print('add_key', call('syscall', 248 if os.uname().machine == 'x86_64' else 217, b'user', b'k', b'v', 1, -4))
print('unshare_user', call('unshare', 0x10000000))
'''
    r = box.run(code)
    assert r.ok, r
    got = dict(line.split() for line in r.stdout.splitlines())
    assert all(v != "ok" for v in got.values()), got


@pytest.mark.parametrize("fill, limit", [
    (("n = 0\ntry:\n    while True:\n        open(f'/tmp/f{n}', 'w').close()\n        n += 1\nexcept OSError as e:\n"
     "    print(n, e.errno)"), "inodes"),
    (("import os\nfd = os.open('/dev/shm/big', os.O_WRONLY | os.O_CREAT)\nn = 0\ntry:\n    while True:\n"
     "        n += os.write(fd, b'0' * 65536)\nexcept OSError as e:\n    print(n, e.errno)"), "bytes"),
])
def test_scratch_is_capped_in_bytes_and_inodes_then_emptied(box, fill, limit):
    r = box.run(fill)
    assert r.ok, r
    count, err = map(int, r.stdout.split())
    assert err == 28  # ENOSPC: the tmpfs cap, not the per-file rlimit (EFBIG) nor a timeout
    assert count <= (CFG["scratch_inodes"] if limit == "inodes" else CFG["scratch_mb"] * 2**20)
    again = box.run(fill)  # the next snippet starts with all of it available again
    assert again.ok and abs(int(again.stdout.split()[0]) - count) <= 4, (r.stdout, again.stdout)


def test_executor_cannot_be_attached_written_killed_or_limited(box):
    code = r'''
import ctypes, errno, os, resource, signal
libc = ctypes.CDLL(None, use_errno=True)
def err(fn):
    try:
        rc = fn()
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return 'ok' if rc in (None, 0) else errno.errorcode[ctypes.get_errno()]
print('ptrace_attach', err(lambda: libc.ptrace(16, 1, 0, 0)))
print('ptrace_seize', err(lambda: libc.ptrace(0x4206, 1, 0, 0)))
print('proc_mem', err(lambda: open('/proc/1/mem', 'r+b')))
print('proc_fd', err(lambda: os.listdir('/proc/1/fd')))
print('prlimit', err(lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (0, 0))))
print('renice', err(lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)))
print('affinity', err(lambda: os.sched_setaffinity(1, {0})))
for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV):
    os.kill(1, sig)
print('signals sent')
'''
    r = box.run(code)
    assert r.ok, r
    got = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert got.pop("signals") == "sent"
    assert all(v in {"EPERM", "EACCES"} for v in got.values()), got
    assert box.run("print('alive')").stdout == "alive\n"
    assert box.stats()["worker_restarts"] == 0


def test_a_snippet_can_make_its_own_parent_non_dumpable(box):
    # what a judge inside a snippet does to keep the solution it forks away from its memory
    code = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0
judge = os.getpid()
pid = os.fork()
if pid == 0:
    try:
        open(f'/proc/{judge}/mem', 'rb')
        os._exit(1)
    except PermissionError:
        os._exit(0)
print('judge safe', os.waitpid(pid, 0)[1] == 0)
'''
    r = box.run(code)
    assert r.ok and r.stdout == "judge safe True\n", r


def test_the_forker_cannot_be_stopped_or_killed_by_a_snippet(box):
    code = r'''
import os, signal
forker = [int(p) for p in os.listdir('/proc') if p.isdigit()
          and open(f'/proc/{p}/comm').read().strip() == 'cleaner-forker']
got = []
for pid in forker:
    for target, sig in ((pid, signal.SIGSTOP), (pid, signal.SIGKILL), (-pid, signal.SIGKILL), (-1, signal.SIGKILL)):
        try:
            os.kill(target, sig)
            got.append('sent')
        except PermissionError:
            got.append('EPERM')
print(len(forker), sorted(set(got)))
'''
    r = box.run(code)
    assert r.ok and r.stdout == "1 ['EPERM']\n", r
    assert box.run("print('next')").stdout == "next\n"
    assert box.stats()["worker_restarts"] == 0


def test_a_forker_lost_anyway_is_replaced_without_a_failure(backend):
    with make_pool(backend, spare_workers=0) as pool:
        assert pool.run("print(1)").ok
        worker = pool._idle.queue[0]
        if isinstance(worker, LocalWorker):
            # the forker leads its own session; a child it has just cloned carries its name until the child's
            # guard renames it, and leads its own session from a moment before that: wait out that moment
            deadline = time.monotonic() + 10
            while True:
                forkers = [p for p in _descendants(worker.pid) if _comm(p) == "cleaner-forker" and _leads_session(p)]
                if len(forkers) == 1 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            assert len(forkers) == 1, forkers
            os.kill(forkers[0], signal.SIGKILL)
        else:
            worker.container.exec_run(["python3", "-c", ("import os, signal\nfor p in os.listdir('/proc'):\n"
                                       "    if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == "
                                       "'cleaner-forker':\n        os.kill(int(p), signal.SIGKILL)")])
        results = [pool.run(f"print({i})") for i in range(3)]
        stats = pool.stats()
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    assert stats["infra_retries"] == 0 and stats["worker_restarts"] == 0


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _leads_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parents.items() if pp in frontier]
        found += frontier
    return found


def test_double_fork_survivor_is_gone_before_the_next_snippet(box):
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        while True:\n            open('/tmp/survivor', 'a').write('x')\n            time.sleep(0.005)\n"
              "    os._exit(0)\ntime.sleep(0.05)\nprint('parent done')")
    assert box.run(daemon).stdout == "parent done\n"
    r = box.run("import os, time\ntime.sleep(0.2)\nprint(os.listdir('/tmp'))")
    assert r.stdout == "[]\n", r


def test_closed_stdio_and_status_pipe(box):
    r = box.run("import os, time\nfor fd in range(5):\n    try:\n        os.close(fd)\n    except OSError:\n"
                "        pass\ntime.sleep(0.05)")
    assert r.error_kind is None or r.error_kind.startswith(("exit:", "signal:")) or not r.ok
    assert box.run("print('next')").stdout == "next\n"


def test_multiprocessing_pool_works(box):
    r = box.run("import multiprocessing as mp\nwith mp.Pool(2) as p:\n    print(p.map(abs, [-1, -2, -3]))\n"
                "lock = mp.Lock()\nwith lock:\n    print('locked')")
    assert r.ok and r.stdout == "[1, 2, 3]\nlocked\n", r


def test_hello_reports_the_guard_and_preimport_cost(box):
    worker = box._idle.queue[0]
    assert worker.hello["seccomp"] is True and worker.hello["dumpable"] is False
    assert worker.hello["preimported"] == ["math"] and worker.hello["preimport_s"] >= 0
    assert box.stats()["preimport_s"] in {w.hello["preimport_s"] for w in [*box._idle.queue, *box._spares]}


# -- blast radius: the snippet that brings its worker down is the only one affected ------------

KILLER = "# KILL_MY_WORKER\nimport time\ntime.sleep(10)\nprint('never')"
STOPPER = "# STOP_MY_WORKER\nimport time\ntime.sleep(10)\nprint('never')"


def _sabotage(worker_cls, monkeypatch, once: list | None = None):
    """Stand-in for an escape the isolation prevents: while a marked snippet runs, its worker
    is killed (or stopped) from outside, exactly as if the snippet had done it."""
    real = worker_cls.request

    def request(self, req, timeout):
        marker = "KILL_MY_WORKER" in req["code"] or "STOP_MY_WORKER" in req["code"]
        if marker and (once is None or not once):
            stop = "STOP_MY_WORKER" in req["code"]
            threading.Timer(0.2, _take_down, args=(self, stop)).start()
            if once is not None:
                once.append(True)
        return real(self, req, timeout)

    monkeypatch.setattr(worker_cls, "request", request)


def _take_down(worker, stop: bool) -> None:
    if isinstance(worker, LocalWorker):
        os.killpg(worker.pid, signal.SIGSTOP if stop else signal.SIGKILL)
    elif stop:
        worker.container.pause()
    else:
        worker.container.kill()


@pytest.mark.parametrize("culprit", [KILLER, STOPPER])
def test_a_worker_killing_snippet_fails_alone_and_every_other_answer_is_graded(backend, monkeypatch, culprit):
    monkeypatch.setattr("sandbox.pool.REQUEST_GRACE_S", 0.5)
    _sabotage(LocalWorker if backend == "local" else ContainerWorker, monkeypatch)
    codes = [f"print({i} * 2)" for i in range(20)]
    codes.insert(7, culprit)
    with make_pool(backend, workers=2, timeout_s=3.0, wall_timeout_s=3.0) as pool:  # the take-down comes 0.2 s in
        results = pool.run_many(codes)
        stats = pool.stats()
    assert results[7].error_kind == "worker_killed" and not results[7].ok
    assert "fresh workers" in results[7].stderr
    others = results[:7] + results[8:]
    assert [r.stdout for r in others] == [f"{i * 2}\n" for i in range(20)]
    assert all(r.ok for r in others)
    assert stats["worker_kills"] == 1 and stats["infra_errors"] == 0 and stats["executions"] == 21


def test_a_graded_batch_with_one_worker_killing_answer_grades_every_other_answer(backend, monkeypatch):
    # issue 13's check through the code reward: 20 right answers and one that takes its worker
    # down, graded in one batch; the 20 get reward 1, the culprit 0 counted as killed
    from tasks.rewards.code import grade_code_batch
    from tasks.rewards.config import RewardConfig
    from tasks.rewards.harness import PREFIX_MODULES

    monkeypatch.setattr("sandbox.pool.REQUEST_GRACE_S", 0.5)
    _sabotage(LocalWorker if backend == "local" else ContainerWorker, monkeypatch)
    spec = {"fn_name": "square", "inputs": ["3", "-4"], "outputs": ["9", "16"]}
    right = "```python\ndef square(x):\n    return x * x\n```"
    culprit = "```python\n# KILL_MY_WORKER\nimport time\ntime.sleep(10)\n\ndef square(x):\n    return x * x\n```"
    items = [("code", right, spec, {"id": i}) for i in range(20)]
    items.insert(7, ("code", culprit, spec, {"id": "culprit"}))
    with make_pool(backend, workers=2, timeout_s=5.0, preimport=PREFIX_MODULES) as pool:
        graded = grade_code_batch(items, sandbox=pool, cfg=RewardConfig(code_timeout_s=5.0))
        stats = pool.stats()
    bad = graded.pop(7)
    assert [(r.reward, r.metrics["tests_passed"]) for r in graded] == [(1.0, 2.0)] * 20
    assert bad.reward == 0.0 and bad.metrics["suspected_hacks/killed"] == 2.0, bad.metrics
    assert stats["worker_kills"] == 2 and stats["infra_errors"] == 0 and stats["executions"] == 42


def test_a_worker_lost_once_under_an_innocent_snippet_is_retried_not_blamed(backend, monkeypatch):
    _sabotage(LocalWorker if backend == "local" else ContainerWorker, monkeypatch, once=[])
    with make_pool(backend, workers=1) as pool:
        r = pool.run("# KILL_MY_WORKER (only the first time)\nimport time\ntime.sleep(0.5)\nprint('innocent')")
        stats = pool.stats()
    assert r.ok and r.stdout == "innocent\n"
    assert stats["worker_kills"] == 0 and stats["infra_retries"] == 1 and stats["spares_used"] == 1


# -- replacement without stalls ---------------------------------------------------------------

def test_retirements_never_leave_a_caller_waiting_for_a_worker(backend):
    from concurrent.futures import ThreadPoolExecutor

    # 2 workers retire after 30 runs (the first ones after 15 and 30: staggered), so with two
    # callers a retirement comes every ~15 runs (~0.75 s of 100 ms snippets) and each of the 2
    # spares has ~1.5 s to be replaced, even on a busy machine.  No caller may wait for a
    # worker longer than one snippet takes.
    snippet_s, n = 0.1, 150  # 75 runs a worker: retirements at 15, 45, 75 and 30, 60
    with make_pool(backend, workers=2, spare_workers=2, runs_per_container=30, timeout_s=10) as pool:
        with ThreadPoolExecutor(max_workers=2) as ex:
            codes = [f"import time\ntime.sleep({snippet_s})\nprint({i})" for i in range(n)]
            results = list(ex.map(pool.run, codes))
        stats = pool.stats()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    assert stats["retired"] >= 4 and stats["spares_used"] >= 4
    assert stats["max_worker_wait_s"] < snippet_s, stats
