"""Where a training step's wall time goes: stages vs orchestration + tracking, and cached reruns.

``profile_table`` reads the stage timings each stage recorded (``time/<stage>_s`` in DuckDB's
``metrics``) and the flow's measured wall time per step, and reports the share of wall time
spent outside the compute stages (Prefect orchestration + MLflow/DuckDB logging), plus the
per-step cost of rerunning the finished run with every stage cached.
"""

from __future__ import annotations

from statistics import mean

from rich.table import Table

from tasks.stores.db import run_metrics

COMPUTE = ("rollout", "score", "mix", "advantage", "update")


def profile_figures(duckdb_path: str, run_id: str, walls: dict, cached_walls: dict) -> dict[str, float]:
    df = run_metrics(duckdb_path, run_id, "time/")
    steps = sorted(int(s) for s in walls)
    stage = {name: mean(df.filter((df["key"] == f"time/{name}_s") & df["step"].is_in(steps))["value"].to_list() or [0.0])
             for name in COMPUTE}
    wall = mean(float(walls[s] if s in walls else walls[str(s)]) for s in steps)
    compute = sum(stage[n] for n in COMPUTE)
    return {**{f"{n}_s": v for n, v in stage.items()}, "wall_s": wall, "compute_s": compute,
            "overhead_s": wall - compute, "overhead_share": (wall - compute) / wall if wall else 0.0,
            "cached_rerun_step_s": mean(float(v) for v in cached_walls.values()) if cached_walls else 0.0}


def profile_table(duckdb_path: str, run_id: str, walls: dict, cached_walls: dict) -> Table:
    f = profile_figures(duckdb_path, run_id, walls, cached_walls)
    table = Table(title=f"step time of {run_id} (mean over {len(walls)} steps)")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share of wall", justify="right")
    for name in COMPUTE:
        table.add_row(name, f"{f[name + '_s']:.3f}", f"{f[name + '_s'] / f['wall_s']:.1%}")
    table.add_row("orchestration + tracking (Prefect, MLflow, DuckDB)", f"{f['overhead_s']:.3f}", f"{f['overhead_share']:.1%}")
    table.add_row("step wall time", f"{f['wall_s']:.3f}", "100%")
    table.add_row("cached rerun of a finished step", f"{f['cached_rerun_step_s']:.3f}", "")
    return table
