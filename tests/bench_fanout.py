"""Benchmark: one dispatched compare (2 arms × 2 seeds, tiny) with 1 worker, with 2 workers, and with 2 workers of
which one is killed (with its flow process) once a run has logged its first step — the worker running that run;
wall times and ratios, all in one process on one served stack (``tests/test_fanout.py``'s ``Fanout``: every worker
and the compare on a host of its own, so it needs root).

Run: ``PYTHONPATH=$PWD .venv/bin/python -m tests.bench_fanout [--out bench.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from tests.conftest import WARM
from tests.test_fanout import DEPLOYMENT, Fanout, _descendants, _first_logged, _flow_pid


def timed_compare(f: Fanout, compare_id: str, parallel: int, kill: bool = False) -> dict:
    t0 = time.time()
    proc = f.compare(compare_id, "--dispatch", DEPLOYMENT, "--set", f"compare.parallel={parallel}")
    killed = None
    if kill:
        victim = _first_logged(f, compare_id)
        [run] = f.flow_runs(victim)
        flow_pid = _flow_pid(run)
        owner = next(name for name, p in f.workers.items() if flow_pid in _descendants(p.pid))
        killed = {"run": victim, "after_s": round(time.time() - t0, 1), "worker": owner,
                  "flow_pids": f.kill_worker(owner)}
    code = proc.wait(timeout=3600)
    wall = time.time() - t0
    if code != 0:
        raise RuntimeError((f.tmp / f"{compare_id}.log").read_text()[-4000:])
    report = json.loads((f.nfs / "runs" / compare_id / "report" / "compare.json").read_text())
    return {"compare": compare_id, "wall_s": round(wall, 1), "runs_wall_s": report["wall_s"], "killed": killed,
            "load_avg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    tmp.chmod(0o755)  # the stack's PostgreSQL runs as the postgres user, which must reach its folder
    f = Fanout(tmp, WARM)
    f.start()
    try:
        f.start_worker("w1")
        one = timed_compare(f, "one-worker", parallel=1)
        f.start_worker("w2")
        two = timed_compare(f, "two-workers", parallel=2)
        lost = timed_compare(f, "two-workers-one-lost", parallel=2, kill=True)
    finally:
        f.stop()
    out = {"one_worker": one, "two_workers": two, "two_workers_one_lost": lost,
           "speedup_two_vs_one": round(one["wall_s"] / two["wall_s"], 2),
           "lost_worker_vs_undisturbed": round(lost["wall_s"] / two["wall_s"], 2)}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
