"""A snippet's time limit is CPU time, so its verdict does not depend on how loaded the machine is
(``sandbox/executor/cputime.py``): under a CPU hog (a spinning process per core, started here and
stopped by PID) a snippet using 0.6x its limit passes and one using 2x times out, on both backends;
a snippet that blocks ends at the wall-clock backstop with its own verdict (``wall_timeout``); and a
lockstep rollout of the tiny model with CPU-bound tool calls is the same bit for bit quiet and beside
the hog."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from sandbox.config import SandboxConfig
from sandbox.executor.protocol import ProtocolError, default_wall_s, encode_run, run_fields

LIMIT_S = 0.5
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}:\n    pass\nprint('spun')"
"""A snippet that uses {} CPU seconds (its own process)."""


@contextmanager
def cpu_hog(per_core: int = 1):
    """``per_core`` processes spinning on every core until the block ends (stopped by PID)."""
    n = per_core * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(n)]
    try:
        time.sleep(0.2)
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _box(backend: str, **cfg):
    from sandbox.base import make_sandbox

    if backend == "docker":
        from tests.test_sandbox_isolation import _docker_or_skip

        _docker_or_skip()
    return make_sandbox(SandboxConfig(backend=backend, workers=2, preimport=["math"], **cfg))


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_under_a_cpu_hog_0_6x_the_cpu_limit_passes_and_2x_times_out(backend):
    with _box(backend, timeout_s=LIMIT_S) as box:
        box.run("pass")
        with cpu_hog():
            fits, over = box.run_many([SPIN.format(0.6 * LIMIT_S), SPIN.format(2 * LIMIT_S)])
    assert fits.ok and fits.stdout == "spun\n", fits
    assert over.error_kind == "timeout" and over.timed_out and not over.ok and over.stdout == "", over


def test_the_limit_is_the_snippets_cpu_time_to_within_a_few_ticks():
    """The snippet prints its CPU time every ~10 ms of it: the last value printed before the kill is the
    limit, not what a wall-clock limit (less under load) or the 2 s RLIMIT_CPU backstop would leave."""
    tick = ("import time\nlast = 0.0\nwhile True:\n    t = time.process_time()\n"
            "    if t - last >= 0.01:\n        print(round(t, 3), flush=True)\n        last = t")
    with _box("local", timeout_s=LIMIT_S) as box, cpu_hog():
        r = box.run(tick)
    assert r.error_kind == "timeout", r
    # the executor reads the clock every >= 20 ms of wall time, and /proc reports it in 10 ms ticks (rounded down)
    assert LIMIT_S - 0.1 <= float(r.stdout.split()[-1]) <= LIMIT_S + 0.06, r.stdout[-200:]


def test_children_count_and_a_snippet_that_ignores_sigxcpu_still_ends_as_a_timeout():
    forked = ("import os\nif os.fork() == 0:\n" + "\n".join("    " + ln for ln in SPIN.format(5).splitlines())
              + "\n    os._exit(0)\nos.wait()\nprint('parent done')")
    stubborn = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" + SPIN.format(5)
    with _box("local", timeout_s=LIMIT_S) as box:
        child, ignorer = box.run_many([forked, stubborn])
    for r in (child, ignorer):
        assert r.error_kind == "timeout" and r.stdout == "" and r.duration_s < default_wall_s(LIMIT_S), r


def test_a_sleeper_ends_at_the_wall_clock_backstop_with_its_own_verdict():
    with _box("local", timeout_s=LIMIT_S, wall_timeout_s=1.5) as box, cpu_hog():
        start = time.monotonic()
        r = box.run("import time\nprint('zz', flush=True)\ntime.sleep(60)")
        elapsed = time.monotonic() - start
    assert r.error_kind == "wall_timeout" and r.timed_out and not r.ok and r.stdout == "zz\n", r
    assert r.model_text() == "zz\nTimeoutError: execution timed out (wall-clock limit: blocked or waiting)"
    assert 1.5 <= elapsed < 4.5


def test_the_run_frame_carries_both_limits_and_refuses_a_wall_below_the_cpu_limit():
    req = {"code": "pass", "timeout_s": 0.5, "memory_mb": 64, "max_output_bytes": 256, "max_processes": 4}
    assert run_fields(encode_run(req)[4:])[:2] == (0.5, 10.5)  # max(5 x 0.5, 0.5 + 10)
    assert run_fields(encode_run({**req, "timeout_s": 4.0})[4:])[:2] == (4.0, 20.0)
    assert run_fields(encode_run({**req, "wall_timeout_s": 0.75})[4:])[:2] == (0.5, 0.75)
    with pytest.raises(ProtocolError, match="wall_timeout_s"):
        run_fields(encode_run({**req, "wall_timeout_s": 0.25})[4:])
    with pytest.raises(ValueError, match="wall_timeout_s"):
        SandboxConfig(timeout_s=2.0, wall_timeout_s=1.0)


# -- a lockstep rollout beside a CPU hog --------------------------------------------------------------

BURN_S = 0.08
"""CPU seconds of work added to every tool call of the rollout test (before its code), under a limit of 0.15 s: on a
loaded machine such a call takes longer than 0.15 s of wall time, so a wall-clock limit would time it out."""


class _Burning:
    """The sandbox, with ``BURN_S`` of CPU work in front of every call's code; records each call's verdict and
    wall time."""

    def __init__(self, box):
        self.box, self.calls = box, []

    def run(self, code, setup=None, timeout_s=None):
        return self.run_many([code], [setup], timeout_s)[0]

    def run_many(self, codes, setups=None, timeout_s=None):
        burn = f"import time as _t\n_s = _t.process_time()\nwhile _t.process_time() - _s < {BURN_S}:\n    pass\n"
        out = self.box.run_many([burn + c for c in codes], setups, timeout_s)
        self.calls += [(r.error_kind, r.duration_s) for r in out]
        return out


def _rollout(warm_model_dir, chat, work, box) -> tuple[list[tuple], list[str | None]]:
    from models.config import EngineConfig
    from models.engine import TransformersEngine
    from tasks.data.loader import load_prompts
    from tasks.data.synthetic import write_task_parquet
    from tasks.rollout.config import RolloutConfig
    from tasks.rollout.machine import Rollout

    items = list(load_prompts(str(write_task_parquet(work / "eval.parquet", 3, 0, "eval"))))
    engine = TransformersEngine(EngineConfig(max_batch=6), warm_model_dir, chat.eos_id, chat.tokenizer.pad_token_id)
    sandbox = _Burning(box)
    cfg = RolloutConfig(n_samples=2, max_new_tokens=96, tool_lag_steps=1, tool_threads=2)
    trajs = Rollout(cfg, engine, chat, sandbox).run(items, 3, 1, progress=False)
    return [(tuple(t.response_ids), tuple(t.logprobs)) for t in trajs], sandbox.calls


def test_a_lockstep_rollout_with_cpu_bound_calls_is_the_same_bit_for_bit_beside_a_cpu_hog(warm_model_dir, chat,
                                                                                         tmp_path):
    with _box("local", timeout_s=0.15) as box:
        quiet, quiet_calls = _rollout(warm_model_dir, chat, tmp_path, box)
        with cpu_hog(per_core=2):
            loaded, loaded_calls = _rollout(warm_model_dir, chat, tmp_path, box)
    assert sum(len(ids) for ids, _ in quiet) > 3 * 2 * 20 and len(quiet_calls) >= 3  # real rollouts with calls
    limits = {"timeout", "wall_timeout", "setup_error"}
    assert not [kind for kind, _ in quiet_calls + loaded_calls if kind in limits], (quiet_calls, loaded_calls)
    assert loaded == quiet, (f"{len(quiet_calls)} calls; wall s per call quiet max {max(d for _, d in quiet_calls):.3f}, "
                             f"beside the hog {max(d for _, d in loaded_calls):.3f} (CPU limit 0.15 s)")


def test_the_hog_is_gone():
    """``cpu_hog`` stops its processes by PID: none is left after the block."""
    with cpu_hog() as procs:
        pids = [p.pid for p in procs]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
