"""Sandbox benchmark: executions/s and latency percentiles, each backend against a plain interpreter.

For every pool backend measured (``docker``, ``local``) the benchmark also runs its *plain*
twin: the same sandbox, the same interpreter build, the same isolation, but each snippet runs
in a freshly exec'd interpreter (``python -S -c``: no ``site``, no ``.pth`` files, site-packages
on ``PYTHONPATH``) instead of a fork of the warm executor.  ``× plain`` is the ratio to that twin,
so it measures the fork server and nothing else.  ``subprocess`` is a plain interpreter started
on the host per snippet (the base interpreter of this Python, same ``-S`` form), the reference a
user without a sandbox would have; ``× host`` is the ratio to it.  Preimports are the same on both
sides of every ratio: the plain runners import the pool's ``preimport`` modules before the
snippet (their start-up cost per worker is reported separately).  Every row names its
interpreter.  Cells (snippet × concurrency) are measured ``reps`` times, runners in rotated
order each time, so drifting load on a shared machine hits them alike; every result is checked
(ok and the expected stdout), so a fast but wrong runner cannot win.  The *long* rows run each
pool past its retirement limit (``long_factor`` × ``runs_per_container`` × workers snippets) and
report retirements, spares used and *replacement gaps* (a worker retired with no spare ready,
leaving the pool one short until its successor started).

Run: ``cleaner sandbox bench`` (see ``flows/cli_sandbox.py``) or ``run_bench(...)`` from Python.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from sandbox.config import SandboxConfig
from sandbox.result import SandboxInfraError

SNIPPETS: dict[str, tuple[str, str]] = {
    "trivial": ("print(6 * 7)", "42"),
    "cpu_50ms": ("s = 0\nfor i in range(300_000):\n    s += i * i\nprint(s % 97)",
                 str(sum(i * i for i in range(300_000)) % 97)),
    "numpy": ("import numpy as np\nprint(int(np.arange(10).sum()))", "45"),
}
"""name -> (code, expected stdout)."""
POOLS = ("docker", "local")
BACKENDS = (*POOLS, "subprocess")


@dataclass
class BenchRow:
    backend: str
    snippet: str
    concurrency: int
    executions: int
    failures: int
    execs_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    interpreter: str = ""
    phase: str = "short"
    retired: int = 0
    spares_used: int = 0
    gaps: int = 0
    max_gap_ms: float = 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)  # nearest-rank percentile
    idx = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[idx]


def _samples(run: Callable[[str], tuple[bool, str]], snippet: str, concurrency: int, n: int):
    """``n`` executions of ``snippet`` with ``concurrency`` callers: (latencies, oks, wall s)."""
    code, expected = SNIPPETS[snippet]

    def one(_):
        start = time.perf_counter()
        ok, out = run(code)
        return time.perf_counter() - start, ok and out.strip() == expected

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        done = list(ex.map(one, range(n)))
    return [s for s, _ in done], [ok for _, ok in done], time.perf_counter() - start


def _row(backend: str, snippet: str, concurrency: int, lat: list[float], oks: list[bool], wall: float,
         interpreter: str = "", **extra) -> BenchRow:
    return BenchRow(backend, snippet, concurrency, len(lat), sum(not ok for ok in oks),
                    round(len(lat) / wall, 1), round(_percentile(lat, 50) * 1e3, 2),
                    round(_percentile(lat, 95) * 1e3, 2), round(_percentile(lat, 99) * 1e3, 2),
                    interpreter, **extra)


def measure(run: Callable[[str], tuple[bool, str]], backend: str, snippet: str,
            concurrency: int, n: int) -> BenchRow:
    """Run ``n`` executions of ``snippet`` through ``run`` with ``concurrency`` callers."""
    run(SNIPPETS[snippet][0])  # warm caches (page cache, pool) outside the measurement
    return _row(backend, snippet, concurrency, *_samples(run, snippet, concurrency, n))


def host_python() -> tuple[str, dict]:
    """The base interpreter of this Python (no venv) and the environment that lets it import
    this venv's packages without ``site``: the host's plain-subprocess baseline."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sorted(dirs)), PYTHONNOUSERSITE="1")
    return exe, env


def _subprocess_runner(timeout_s: float, prelude: str) -> tuple[Callable, str]:
    exe, env = host_python()

    def run(code: str) -> tuple[bool, str]:
        try:
            proc = subprocess.run([exe, "-S", "-c", prelude + code], capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL, env=env, check=False)
        except subprocess.TimeoutExpired:
            return False, ""
        return proc.returncode == 0, proc.stdout

    return run, f"{sys.version.split()[0]} {exe} -S (host)"


def _pool_runner(box) -> tuple[Callable, str]:
    def run(code: str) -> tuple[bool, str]:
        result = box.run(code)
        return result.ok, result.stdout

    hello = box._idle.queue[0].hello
    how = " -S (fresh per snippet)" if getattr(box, "spawn", False) else " (fork server)"
    return run, f"{hello.get('python')} {hello.get('executable')}{how}"


def _make_pool(backend: str, cfg: SandboxConfig, spawn: bool):
    if backend == "docker":
        from sandbox.docker_backend import DockerSandbox

        return DockerSandbox(cfg.model_copy(update={"backend": "docker"}), spawn=spawn)
    from sandbox.local import LocalSandbox

    return LocalSandbox(cfg.model_copy(update={"backend": "local"}), spawn=spawn)


def _start_runners(backends, cfg: SandboxConfig) -> tuple[dict, dict, dict, list]:
    runners, skipped, pools, boxes = {}, {}, {}, []
    prelude = "".join(f"import {m}\n" for m in cfg.preimport)
    for backend in backends:
        if backend == "subprocess":
            runners[backend] = _subprocess_runner(cfg.timeout_s, prelude)
            continue
        try:
            for name, spawn in ((backend, False), (f"{backend}-plain", True)):
                box = _make_pool(backend, cfg, spawn)
                boxes.append(box)
                runners[name] = _pool_runner(box)
                pools[name] = box
        except SandboxInfraError as exc:
            skipped[backend] = str(exc)
    return runners, skipped, pools, boxes


def run_bench(backends=BACKENDS, snippets=tuple(SNIPPETS), concurrency=(1, 8, 32), n: int = 200,
              workers: int | None = None, cfg: SandboxConfig | None = None, reps: int = 2,
              long_factor: float = 2.0, progress: bool = True) -> dict:
    """Benchmark the backends; returns ``{"rows": [...], "skipped": {...}, "config": {...}, ...}``.

    ``progress``: a bar on stderr counting executions (cell and long run in its description)."""
    unknown = set(snippets) - set(SNIPPETS)
    if unknown:
        raise ValueError(f"snippets: unknown {sorted(unknown)}; valid: {sorted(SNIPPETS)}")
    bad = set(backends) - set(BACKENDS)
    if bad:
        raise ValueError(f"backends: unknown {sorted(bad)}; valid: {list(BACKENDS)}")
    workers = workers or os.cpu_count() or 1
    cfg = cfg or SandboxConfig(workers=workers, preimport=["math"], timeout_s=30)
    runners, skipped, pools, boxes = _start_runners(backends, cfg)
    n_long = int(long_factor * cfg.runs_per_container * cfg.workers)
    total = sum(reps * max(1, math.ceil(max(n, 2 * c) / reps)) for c in concurrency) * len(snippets) * len(runners)
    total += n_long * sum(not box.spawn for box in pools.values())
    bar = tqdm(total=total, desc="sandbox bench", unit="exec", disable=not progress)
    try:
        rows = _cells(runners, snippets, concurrency, n, reps, bar)
        if n_long > 0:
            long_conc = 8 if 8 in concurrency else max(concurrency)  # the reference cell
            rows += _long_rows(runners, pools, n_long, long_conc, bar)
    finally:
        bar.close()
        for box in boxes:
            box.close()
    order = list(runners)
    rows.sort(key=lambda r: (r.phase != "short", order.index(r.backend)))
    preimport_s = {name: box.stats()["preimport_s"] for name, box in pools.items()}
    return {"rows": [asdict(r) for r in rows], "skipped": skipped,
            "isolation": {name: box.isolation for name, box in pools.items()},
            "config": {"workers": cfg.workers, "spare_workers": cfg.spare_workers, "n": n, "reps": reps,
                       "preimport": cfg.preimport, "preimport_s": preimport_s,
                       "runs_per_container": cfg.runs_per_container, "host_python": sys.version.split()[0]},
            "speedup_vs_plain": speedups(rows, "plain"), "speedup_vs_host": speedups(rows, "host")}


def _cells(runners: dict, snippets, concurrency, n: int, reps: int, bar) -> list[BenchRow]:
    rows = []
    for snippet in snippets:
        for conc in concurrency:
            per_rep = max(1, math.ceil(max(n, 2 * conc) / reps))
            got = {name: ([], [], 0.0) for name in runners}
            for rep in range(reps):
                names = list(runners)
                names = names[rep % len(names):] + names[:rep % len(names)]
                for name in names:
                    bar.set_description(f"{snippet} c={conc} rep {rep + 1}/{reps} {name}")
                    run = runners[name][0]
                    run(SNIPPETS[snippet][0])  # warm-up outside the measurement
                    lat, oks, wall = _samples(run, snippet, conc, per_rep)
                    bar.update(per_rep)
                    acc = got[name]
                    got[name] = (acc[0] + lat, acc[1] + oks, acc[2] + wall)
            rows += [_row(name, snippet, conc, *got[name], interpreter=runners[name][1]) for name in runners]
    return rows


def _long_rows(runners: dict, pools: dict, n: int, conc: int, bar) -> list[BenchRow]:
    """Each fork-server pool, trivial snippet, ``n`` executions: past its retirement limit."""
    rows = []
    for name, box in pools.items():
        if box.spawn:
            continue
        bar.set_description(f"long run c={conc} {name}")
        before = box.stats()
        box._stats["max_replacement_gap_s"] = 0.0
        lat, oks, wall = _samples(runners[name][0], "trivial", conc, n)
        bar.update(n)
        after = box.stats()
        rows.append(_row(name, "trivial", conc, lat, oks, wall, interpreter=runners[name][1], phase="long",
                         **{k: int(after[s] - before[s]) for k, s in
                            (("retired", "retired"), ("spares_used", "spares_used"), ("gaps", "replacement_gaps"))},
                         max_gap_ms=round(after["max_replacement_gap_s"] * 1e3, 2)))
    return rows


def speedups(rows: list[BenchRow], against: str = "plain") -> dict[str, float]:
    """exec/s of each fork-server row over its plain twin (``plain``) or the host subprocess (``host``)."""
    rate = {(r.backend, r.snippet, r.concurrency): r.execs_per_s for r in rows if r.phase == "short"}
    out = {}
    for r in rows:
        if r.phase != "short" or r.backend not in POOLS:
            continue
        base = rate.get((f"{r.backend}-plain" if against == "plain" else "subprocess", r.snippet, r.concurrency))
        if base:
            out[f"{r.backend}/{r.snippet}/c{r.concurrency}"] = round(r.execs_per_s / base, 2)
    return out


def render(report: dict) -> None:
    """Print the report as rich tables (short cells, long runs) plus skipped backends."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 170)
    cfg = report["config"]
    starts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in cfg["preimport_s"].items())
    table = Table(title=f"sandbox bench: workers={cfg['workers']} (+{cfg['spare_workers']} spare), "
                        f"preimport={','.join(cfg['preimport'])} on both sides of every ratio "
                        f"(import time per worker start: {starts or '-'}), {cfg['reps']} interleaved reps")
    cols = ("backend", "snippet", "conc", "n", "fail", "exec/s", "p50 ms", "p95 ms", "p99 ms", "× plain",
            "× host", "interpreter")
    for col in cols:
        table.add_column(col, justify="left" if col in ("backend", "snippet", "interpreter") else "right")
    for r in (r for r in report["rows"] if r["phase"] == "short"):
        key = f"{r['backend']}/{r['snippet']}/c{r['concurrency']}"
        table.add_row(r["backend"], r["snippet"], str(r["concurrency"]), str(r["executions"]),
                      str(r["failures"]), f"{r['execs_per_s']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{r['p99_ms']:.1f}", _ratio(report["speedup_vs_plain"], key),
                      _ratio(report["speedup_vs_host"], key), r["interpreter"])
    console.print(table)
    long_rows = [r for r in report["rows"] if r["phase"] == "long"]
    if long_rows:
        lt = Table(title=f"long run past the retirement limit (runs_per_container={cfg['runs_per_container']})")
        for col in ("backend", "conc", "n", "fail", "exec/s", "p50 ms", "p99 ms", "p99/p50", "retired",
                    "spares used", "gaps", "max gap ms"):
            lt.add_column(col, justify="left" if col == "backend" else "right")
        for r in long_rows:
            lt.add_row(r["backend"], str(r["concurrency"]), str(r["executions"]), str(r["failures"]),
                       f"{r['execs_per_s']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                       f"{r['p99_ms'] / r['p50_ms']:.2f}" if r["p50_ms"] else "-", str(r["retired"]),
                       str(r["spares_used"]), str(r["gaps"]), f"{r['max_gap_ms']:.1f}")
        console.print(lt)
    for backend, reason in report["skipped"].items():
        console.print(f"[yellow]skipped {backend}: {reason}[/yellow]")


def _ratio(table: dict, key: str) -> str:
    return f"{table[key]:.2f}" if key in table else "-"


def write_json(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return path


def summary(report: dict) -> str:
    """One line per backend: median exec/s over its short rows (for logs)."""
    lines = []
    for backend in sorted({r["backend"] for r in report["rows"]}):
        rates = [r["execs_per_s"] for r in report["rows"] if r["backend"] == backend and r["phase"] == "short"]
        lines.append(f"{backend}: median {statistics.median(rates):.1f} exec/s over {len(rates)} rows")
    return "\n".join(lines)
