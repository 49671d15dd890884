"""Local sandbox backend: results, error kinds, limits, ordering and infra-failure handling."""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from sandbox.executor import error_kind_of
from sandbox.local import LocalSandbox
from sandbox.pool import FairQueue
from sandbox.result import SandboxInfraError

TIMEOUT_S = 1.0  # CPU seconds
WALL_S = 5.0  # the wall-clock backstop: a spinner reaches it only below 1/5 of a CPU
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}:\n    pass\nprint('spun')"
"""A snippet that uses {} CPU seconds."""


@pytest.fixture(scope="module")
def sb():
    cfg = SandboxConfig(backend="local", workers=2, timeout_s=TIMEOUT_S, wall_timeout_s=WALL_S, memory_mb=256,
                        max_output_bytes=4096, preimport=["math"])
    with make_sandbox(cfg) as box:
        yield box


def test_ok_run_captures_stdout(sb):
    r = sb.run("import math\nprint(math.factorial(5))\nprint('done')")
    assert r.ok and r.exit_code == 0 and r.error_kind is None
    assert r.stdout == "120\ndone\n"
    assert r.model_text() == "120\ndone"
    assert sb.isolation in {"bwrap", "rlimits"}


@pytest.mark.parametrize(
    "code, kind, last_line",
    [
        ("x = (", "SyntaxError", "SyntaxError: '(' was never closed"),
        ("  x = 1", "IndentationError", "IndentationError: unexpected indent"),
        ("pritn(1)", "NameError", "NameError: name 'pritn' is not defined. Did you mean: 'print'?"),
        ("print(1 / 0)", "ZeroDivisionError", "ZeroDivisionError: division by zero"),
        ("len(3)", "TypeError", "TypeError: object of type 'int' has no len()"),
        ("int('a')", "ValueError", "ValueError: invalid literal for int() with base 10: 'a'"),
        ("[][1]", "IndexError", "IndexError: list index out of range"),
        ("{}['k']", "KeyError", "KeyError: 'k'"),
        ("import no_such_mod", "ModuleNotFoundError", "ModuleNotFoundError: No module named 'no_such_mod'"),
        ("(1).foo", "AttributeError", "AttributeError: 'int' object has no attribute 'foo'"),
        ("assert 1 == 2", "AssertionError", "AssertionError"),
        ("def f(): return f()\nf()", "RecursionError", "RecursionError: maximum recursion depth exceeded"),
        ("class MyOwnFailure(Exception): pass\nraise MyOwnFailure('x')", "MyOwnFailure", "MyOwnFailure: x"),
        ("import sys; sys.exit(3)", "exit:3", "Error: exit:3"),
        ("import os; os.kill(os.getpid(), 11)", "signal:SIGSEGV", "Error: signal:SIGSEGV"),
    ],
)
def test_error_kinds(sb, code, kind, last_line):
    r = sb.run(code)
    assert not r.ok
    assert r.error_kind == kind
    assert r.model_text().splitlines()[-1].startswith(last_line)


def test_traceback_looks_like_python_c(sb):
    r = sb.run("x = 1\ny = undefined_name")
    assert 'File "<string>", line 2, in <module>' in r.stderr
    assert "executor" not in r.stderr


@pytest.mark.parametrize("code", ["xs = [3]\nprint(sortd(xs))", "values = 1\nprint(valuse)", "[].apend(1)", "print(1 +"])
def test_error_line_is_the_interpreters(sb, code):
    """The last line is what ``python -c`` prints, "Did you mean" suggestions included (3.10/3.11 print them
    only from the interpreter's own display, not from the ``traceback`` module)."""
    import subprocess
    import sys

    want = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr.strip().splitlines()[-1]
    assert sb.run(code).model_text().splitlines()[-1] == want


def test_stdout_before_error_is_kept(sb):
    r = sb.run("print('partial')\nraise ValueError('bad')")
    assert r.stdout == "partial\n"
    assert r.model_text() == "partial\nValueError: bad"


def test_sys_exit_zero_is_ok(sb):
    assert sb.run("import sys; print('a'); sys.exit(0)").ok


def test_a_sleeper_ends_at_the_wall_clock_backstop(sb):
    start = time.monotonic()
    r = sb.run("import time\nprint('started', flush=True)\ntime.sleep(30)")
    elapsed = time.monotonic() - start
    assert r.timed_out and r.error_kind == "wall_timeout" and not r.ok
    assert r.model_text() == "started\nTimeoutError: execution timed out (wall-clock limit: blocked or waiting)"
    assert r.stdout == "started\n"
    assert WALL_S <= elapsed < WALL_S + 3


def test_a_spinner_ends_at_its_cpu_limit(sb):
    r = sb.run("print('started', flush=True)\nwhile True:\n    pass")
    assert r.timed_out and r.error_kind == "timeout" and not r.ok
    assert r.model_text() == "started\nTimeoutError: execution timed out"


def test_a_shorter_per_call_limit_is_enforced_and_a_longer_one_capped(sb):
    """``timeout_s`` of ``run`` / ``run_many``: the executor kills at that CPU limit, never past the config's."""
    short, quick = sb.run_many([SPIN.format(0.6), SPIN.format(0.02)], timeout_s=0.3)
    assert short.error_kind == "timeout" and short.stdout == "" and quick.ok and quick.stdout == "spun\n"
    capped = sb.run(SPIN.format(TIMEOUT_S + 0.5), timeout_s=60)
    assert capped.error_kind == "timeout"
    with pytest.raises(ValueError, match="timeout_s"):
        sb.run("pass", timeout_s=0)


def test_memory_hog_is_memory_exceeded(sb):
    r = sb.run("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))")
    assert r.memory_exceeded and r.error_kind == "memory" and not r.ok


def test_huge_output_is_truncated_and_bounded(sb):
    r = sb.run("import sys\nfor _ in range(200):\n    sys.stdout.write('y' * 10000)\nprint('end')")
    assert r.stdout_truncated
    assert len(r.stdout.encode()) <= 4096
    assert r.stdout.startswith("yyyy")


def test_huge_stderr_keeps_the_error_line(sb):
    r = sb.run("import sys\nsys.stderr.write('n' * 100000)\nraise KeyError('last')")
    assert r.stderr_truncated and r.error_kind == "KeyError"
    assert len(r.stderr.encode()) <= 4096 + 64
    assert r.model_text().endswith("KeyError: 'last'")


def test_stdin_is_closed(sb):
    r = sb.run("input()")
    assert r.error_kind == "EOFError"


def test_each_run_gets_a_fresh_work_dir(sb):
    code = "import os, tempfile\nprint(sorted(os.listdir('.')), tempfile.gettempdir() == os.getcwd())\nopen('f.txt', 'w').write('x')"
    results = [sb.run(code) for _ in range(4)]
    assert [r.stdout for r in results] == ["[] True\n"] * 4


def test_run_many_keeps_input_order(sb):
    codes = [f"import time\ntime.sleep({0.05 * (i % 3)})\nprint({i})" for i in range(12)]
    results = sb.run_many(codes)
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(12)]


def test_killed_executor_is_retried_transparently():
    cfg = SandboxConfig(workers=1, timeout_s=TIMEOUT_S, preimport=[], infra_retries=2)
    with LocalSandbox(cfg) as box:
        (pid,) = box.worker_pids()
        os.killpg(pid, signal.SIGKILL)
        r = box.run("print('survived')")
        assert r.ok and r.stdout == "survived\n"
        stats = box.stats()
        assert stats["infra_retries"] == 1 and stats["worker_restarts"] == 1
        assert box.worker_pids() != [pid]


def test_persistent_failure_raises_infra_error():
    cfg = SandboxConfig(workers=1, timeout_s=TIMEOUT_S, preimport=[], infra_retries=2, spare_workers=0)
    with LocalSandbox(cfg) as box:
        box._argv = lambda slot: [sys.executable, "-c", "pass"]
        os.killpg(box.worker_pids()[0], signal.SIGKILL)
        with pytest.raises(SandboxInfraError, match="infra_retries=2"):
            box.run("print(1)")
        stats = box.stats()
        assert stats["infra_retries"] == 2 and stats["infra_errors"] == 1
        assert stats["executions"] == 0


def test_garbage_answer_is_infra_not_code_failure():
    garbage = ("import os, struct, sys, json\n"
               "hello = json.dumps({'ready': True}).encode()\n"
               "os.write(1, struct.pack('>I', len(hello)) + hello)\n"
               "sys.stdin.buffer.read(8)\n"
               "os.write(1, struct.pack('>I', 5) + b'{oops')\n"
               "sys.stdin.buffer.read()\n")
    cfg = SandboxConfig(workers=1, timeout_s=TIMEOUT_S, preimport=[], infra_retries=1, spare_workers=0)
    with LocalSandbox(cfg) as box:
        box._argv = lambda slot: [sys.executable, "-c", garbage]
        os.killpg(box.worker_pids()[0], signal.SIGKILL)
        with pytest.raises(SandboxInfraError, match="garbage"):
            box.run("print(1)")


def test_run_after_close_raises():
    box = LocalSandbox(SandboxConfig(workers=1, preimport=[]))
    box.close()
    with pytest.raises(SandboxInfraError, match="after close"):
        box.run("print(1)")


@pytest.mark.parametrize(
    "stderr, kind",
    [
        ("Traceback (most recent call last):\n  File \"<string>\", line 1\nnumpy.linalg.LinAlgError: Singular matrix\n", "LinAlgError"),
        ("just some words\n", None),
        ("Traceback (most recent call last):\nBlockingIOError: [Errno 11] x\n  File \"<stri\n", "BlockingIOError"),
        ("", None),
        ("  File \"<string>\", line 1\n    x = (\n        ^\nSyntaxError: '(' was never closed\n", "SyntaxError"),
    ],
)
def test_error_kind_parser(stderr, kind):
    assert error_kind_of(stderr) == kind


def test_rlimits_only_mode_warns_loudly(monkeypatch, caplog):
    monkeypatch.setattr("sandbox.local.bwrap_works", lambda: False)
    cfg = SandboxConfig(workers=1, timeout_s=TIMEOUT_S, preimport=[])
    with caplog.at_level("WARNING", logger="sandbox.local"), LocalSandbox(cfg) as box:
        assert box.isolation == "rlimits"
        assert box.run("print(2 + 2)").stdout == "4\n"
        assert box.run("pritn(1)").error_kind == "NameError"
    assert "NO ISOLATION" in caplog.text


def test_hung_executor_is_replaced(monkeypatch):
    monkeypatch.setattr("sandbox.pool.REQUEST_GRACE_S", 0.5)
    cfg = SandboxConfig(workers=1, timeout_s=0.5, wall_timeout_s=1.0, preimport=[], infra_retries=1)
    with LocalSandbox(cfg) as box:
        (pid,) = box.worker_pids()
        os.killpg(pid, signal.SIGSTOP)
        start = time.monotonic()
        r = box.run("print('fresh')")
        assert r.ok and r.stdout == "fresh\n"
        assert time.monotonic() - start < 10
        assert box.stats()["infra_retries"] == 1


def test_executor_refuses_malformed_requests():
    from sandbox.executor import Executor

    ex = Executor()
    assert "error" in ex.handle({"op": "run", "code": "print(1)"})
    assert "error" in ex.handle({"op": "run", "code": 3})
    assert ex.handle({"op": "ping"})["pong"] is True


def test_auto_without_engine_falls_back_to_local(monkeypatch, caplog):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/cleaner-docker.sock")
    cfg = SandboxConfig(backend="auto", workers=1, preimport=[])
    with caplog.at_level("WARNING", logger="sandbox.docker_backend"), make_sandbox(cfg) as box:
        assert box.name == "local" and box.run("print(3)").stdout == "3\n"
    assert "no Docker engine answers" in caplog.text


def test_docker_backend_without_engine_raises_a_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/cleaner-docker.sock")
    with pytest.raises(SandboxInfraError, match="sandbox.backend=docker: no Docker engine"):
        make_sandbox(SandboxConfig(backend="docker", workers=1))


def test_close_removes_the_pool_dir_and_executors():
    box = LocalSandbox(SandboxConfig(workers=2, preimport=[]))
    tmp, pids = box._tmp, box.worker_pids() + [w.pid for w in box._spares]
    assert len(pids) == 3
    box.close()
    assert not os.path.exists(tmp)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _waiting(q: FairQueue, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(q._waiters) < n:
        assert time.monotonic() < deadline, f"{len(q._waiters)} callers waiting, not {n}"
        time.sleep(0.001)


def test_idle_workers_go_to_waiting_callers_in_arrival_order():
    """Callers that block on an empty FairQueue get the workers put back in the order they arrived, whatever the
    threads' scheduling: each caller is started only once the one before it waits (no timing in the check)."""
    q, got, threads = FairQueue(), {}, []
    for i in range(5):
        threads.append(threading.Thread(target=lambda i=i: got.__setitem__(i, q.get())))
        threads[-1].start()
        _waiting(q, i + 1)
    for worker in ("w0", "w1", "w2", "w3", "w4"):
        q.put(worker)
    for t in threads:
        t.join(timeout=30)
    assert got == {0: "w0", 1: "w1", 2: "w2", 3: "w3", 4: "w4"}
    with pytest.raises(queue.Empty):
        q.get_nowait()


def test_a_worker_put_back_goes_to_a_waiter_not_back_to_the_caller_that_returned_it():
    """queue.Queue lets the caller that just returned a worker take it straight back (its ``get`` barges ahead of
    the woken waiter), so under contention a caller can run all its rounds while the others starve. FairQueue hands
    the worker to the oldest waiter inside ``put``: the returning caller finds the queue empty and waits its turn."""
    q, got = FairQueue(), []
    q.put("w")
    assert q.get() == "w"
    waiter = threading.Thread(target=lambda: got.append(q.get()))
    waiter.start()
    _waiting(q, 1)
    q.put("w")
    with pytest.raises(queue.Empty):
        q.get_nowait()
    waiter.join(timeout=30)
    assert got == ["w"] and not q._waiters
    q.put("w")
    assert q.get_nowait() == "w"  # nobody waiting: the worker goes to the queue


@pytest.mark.parametrize("side, expected", [
    ("right", "A" * 10 + "...(truncated)"),
    ("left", "(truncated)..." + "B" * 10),
    ("middle", "A" * 5 + "...(truncated)..." + "B" * 5),
])
def test_a_long_tool_response_is_cut_on_the_side_asked(side, expected):
    """verl's ``tool_response_truncate_side`` names and markers; the pipeline's default keeps the head."""
    from sandbox.result import ExecutionResult
    from tasks.rollout.config import RolloutConfig

    r = ExecutionResult(True, 0, "A" * 12 + "B" * 12 + "\n", "", None, False, False, 0.0)
    assert r.model_text(10, side) == expected and r.model_text(24, side) == "A" * 12 + "B" * 12
    assert r.model_text(10) == r.model_text(10, RolloutConfig().tool_response_truncate_side) == "A" * 10 + "...(truncated)"
    with pytest.raises(ValueError, match="unknown truncation side 'top'; known: right, left, middle"):
        r.model_text(10, "top")
