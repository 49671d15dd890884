"""Sandbox benchmark: executions/s and latency percentiles per backend, snippet and concurrency.

Measures, in one run (backends take turns for every cell), the docker backend, the local backend and a naive baseline that starts a
fresh interpreter per snippet (``subprocess.run([python, "-c", code])``), for a trivial
snippet, a ~50 ms CPU snippet and an ``import numpy`` snippet, each at client concurrency
1, 8 and 32 (the pools have ``workers`` executors, by default one per CPU core; extra callers
queue, served in arrival order).  More executors than cores do not add throughput for CPU-bound
snippets, only contention: on 2 cores at concurrency 8 the trivial snippet's p99 was 27 ms with 2
containers and 41 ms with 8, at the same executions/s.  Every result is
checked (ok and the expected stdout), so a fast but wrong backend cannot win.

Run: ``cleaner sandbox bench`` (see ``flows/cli_sandbox.py``) or ``run_bench(...)`` from Python.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from sandbox.config import SandboxConfig
from sandbox.result import SandboxInfraError

SNIPPETS: dict[str, tuple[str, str]] = {
    "trivial": ("print(6 * 7)", "42"),
    "cpu_50ms": ("s = 0\nfor i in range(300_000):\n    s += i * i\nprint(s % 97)",
                 str(sum(i * i for i in range(300_000)) % 97)),
    "numpy": ("import numpy as np\nprint(int(np.arange(10).sum()))", "45"),
}
"""name -> (code, expected stdout)."""


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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)  # nearest-rank percentile
    idx = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[idx]


def measure(run: Callable[[str], tuple[bool, str]], backend: str, snippet: str,
            concurrency: int, n: int) -> BenchRow:
    """Run ``n`` executions of ``snippet`` through ``run`` with ``concurrency`` callers."""
    code, expected = SNIPPETS[snippet]

    def one(_):
        start = time.perf_counter()
        ok, out = run(code)
        return time.perf_counter() - start, ok and out.strip() == expected

    run(code)  # warm caches (page cache, pool) outside the measurement
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        samples = list(ex.map(one, range(n)))
    wall = time.perf_counter() - start
    lat = [s for s, _ in samples]
    return BenchRow(backend, snippet, concurrency, n, sum(not ok for _, ok in samples),
                    round(n / wall, 1), round(_percentile(lat, 50) * 1e3, 2),
                    round(_percentile(lat, 95) * 1e3, 2), round(_percentile(lat, 99) * 1e3, 2))


def _subprocess_runner(timeout_s: float) -> Callable[[str], tuple[bool, str]]:
    def run(code: str) -> tuple[bool, str]:
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False, ""
        return proc.returncode == 0, proc.stdout

    return run


def _sandbox_runner(box) -> Callable[[str], tuple[bool, str]]:
    def run(code: str) -> tuple[bool, str]:
        result = box.run(code)
        return result.ok, result.stdout

    return run


def run_bench(backends=("docker", "local", "subprocess"), snippets=tuple(SNIPPETS),
              concurrency=(1, 8, 32), n: int = 200, workers: int | None = None,
              cfg: SandboxConfig | None = None) -> dict:
    """Benchmark every backend; returns ``{"rows": [...], "skipped": {...}, "config": {...}}``."""
    from sandbox.base import make_sandbox

    unknown = set(snippets) - set(SNIPPETS)
    if unknown:
        raise ValueError(f"snippets: unknown {sorted(unknown)}; valid: {sorted(SNIPPETS)}")
    workers = workers or os.cpu_count() or 1
    cfg = cfg or SandboxConfig(workers=workers, preimport=["math", "numpy"], timeout_s=30)
    runners, skipped, isolation, boxes = {}, {}, {}, []
    try:
        for backend in backends:
            if backend == "subprocess":
                runners[backend] = _subprocess_runner(cfg.timeout_s)
                continue
            try:
                box = make_sandbox(cfg.model_copy(update={"backend": backend}))
            except SandboxInfraError as exc:
                skipped[backend] = str(exc)
                continue
            boxes.append(box)
            runners[backend], isolation[backend] = _sandbox_runner(box), box.isolation
        # backends take turns per cell, so drifting load on a shared machine hits them alike
        rows = [measure(runners[backend], backend, snippet, conc, max(n, 2 * conc))
                for snippet in snippets for conc in concurrency for backend in runners]
    finally:
        for box in boxes:
            box.close()
    rows.sort(key=lambda r: list(runners).index(r.backend))
    return {"rows": [asdict(r) for r in rows], "skipped": skipped, "isolation": isolation,
            "config": {"workers": cfg.workers, "n": n, "preimport": cfg.preimport,
                       "python": sys.version.split()[0]},
            "speedup_vs_subprocess": speedups(rows)}


def speedups(rows: list[BenchRow]) -> dict[str, float]:
    """executions/s of each backend over the subprocess baseline, per snippet and concurrency."""
    base = {(r.snippet, r.concurrency): r.execs_per_s for r in rows if r.backend == "subprocess"}
    return {f"{r.backend}/{r.snippet}/c{r.concurrency}": round(r.execs_per_s / base[(r.snippet, r.concurrency)], 1)
            for r in rows if r.backend != "subprocess" and base.get((r.snippet, r.concurrency))}


def render(report: dict) -> None:
    """Print the report as a rich table (plus skipped backends)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sandbox bench (workers={report['config']['workers']})")
    for col in ("backend", "snippet", "conc", "n", "fail", "exec/s", "p50 ms", "p95 ms", "p99 ms", "× subprocess"):
        table.add_column(col, justify="left" if col in ("backend", "snippet") else "right")
    speed = report["speedup_vs_subprocess"]
    for r in report["rows"]:
        key = f"{r['backend']}/{r['snippet']}/c{r['concurrency']}"
        table.add_row(r["backend"], r["snippet"], str(r["concurrency"]), str(r["executions"]),
                      str(r["failures"]), f"{r['execs_per_s']:.1f}", f"{r['p50_ms']:.1f}",
                      f"{r['p95_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      f"{speed[key]:.1f}" if key in speed else "-")
    console = Console(width=None if sys.stdout.isatty() else 140)
    console.print(table)
    for backend, reason in report["skipped"].items():
        console.print(f"[yellow]skipped {backend}: {reason}[/yellow]")


def write_json(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return path


def summary(report: dict) -> str:
    """One line per backend: median exec/s over all rows (for logs)."""
    lines = []
    for backend in sorted({r["backend"] for r in report["rows"]}):
        rates = [r["execs_per_s"] for r in report["rows"] if r["backend"] == backend]
        lines.append(f"{backend}: median {statistics.median(rates):.1f} exec/s over {len(rates)} rows")
    return "\n".join(lines)
