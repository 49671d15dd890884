"""Rerun one arm × seed of a comparison alone and check it against the committed numbers.

A comparison's child run is a pure function of its config, its overrides and its seed (sampling, raw-share
draws and the update are seeded by (seed, step); one torch thread; tool calls rejoin the decoding batch in
lockstep, ``rollout.tool_lag_steps`` ≥ 1, so the sandbox's timing changes nothing). ``rerun`` trains that child again with
the very overrides ``cleaner compare`` gives it (``flows.compare.compare_jobs``) and the same run id, but
into a scratch folder with its own DuckDB file, MLflow store and run folder, so nothing of the comparison
is touched. Each call trains into a fresh folder, ``<into>/<run id>-<n>`` (``fresh_folder``): a folder that
held an earlier rerun would hand back its finished stages and cached evaluations without training, and
report "equal" even after a code change. It then reads the rerun's final evaluation and sets it beside the committed one: a report
``compare.json`` or any JSON holding such reports (``docs/regimes.json``), searched for the run id in
``per_seed`` rows.

It compares the final evaluation (pass@1 in both modes and the first-call success with SAAR off): ``equal``
(bit for bit) and ``within_noise`` (the difference within twice the binomial s.e. of that final evaluation —
over its graded trajectories for pass@1, over its first calls for first-call success — for
runs made before lockstep, ``tool_lag_steps=0``: their batches followed the sandbox's timing, so a rerun of one
is the same until a near-tie token falls the other way, and then only as close as another evaluation).
A rerun's curve is in its own store.

Run: ``cleaner compare --config configs/regimes/t4.yaml --set sandbox.backend=local --compare-id regime-t4
--rerun cleaner:21 --into /tmp/rerun --against docs/regimes.json`` (≈ 5 min on one core).
"""

from __future__ import annotations

import json
from pathlib import Path

from flows.compare import _train_process, compare_jobs
from flows.config import load_config
from tasks.reports.compare import ACC, ACC_ON, GRADED, TOOL, final_values
from tasks.stores import db

FIELDS = {"final_pass_at_1": (ACC, GRADED), "final_pass_at_1_saar_on": (ACC_ON, GRADED.replace("saar_off", "saar_on")),
          "final_first_attempt_success": (TOOL, "eval/saar_off/tools/first_attempt_total")}
"""Per-seed fields of a compare report → (the evaluation key each is read from, the key of the count it is a rate
over: graded trajectories for pass@1, first calls for first-call success)."""


def parse_job(spec: str) -> tuple[str, int]:
    """``ARM:SEED`` → (arm, seed); a clear error otherwise."""
    arm, sep, seed = spec.rpartition(":")
    if not sep or not arm or not seed.isdigit():
        raise ValueError(f"--rerun: {spec!r} is not ARM:SEED (e.g. cleaner:21)")
    return arm, int(seed)


def scratch_overrides(into: Path) -> list[str]:
    """Every place a run writes, moved under ``into``."""
    into = into.resolve()
    return [f"output_dir={into / 'runs'}", f"tracking.duckdb_path={into / 'cleaner.duckdb'}",
            f"tracking.mlflow_uri=sqlite:///{into / 'mlflow.db'}", f"tracking.artifact_root={into / 'mlartifacts'}"]


def fresh_folder(into: Path, run_id: str) -> Path:
    """A new, empty folder ``<into>/<run_id>-<n>`` (n one above the highest there), claimed by creating it."""
    into.mkdir(parents=True, exist_ok=True)
    taken = [p.name.removeprefix(f"{run_id}-") for p in into.glob(f"{run_id}-*")]
    n = max((int(t) for t in taken if t.isdigit()), default=0) + 1
    while True:
        try:
            (into / f"{run_id}-{n}").mkdir()
            return into / f"{run_id}-{n}"
        except FileExistsError:  # another rerun claimed it meanwhile
            n += 1


def committed_row(against: Path, run_id: str) -> dict:
    """The ``per_seed`` row of ``run_id`` in ``against`` (a compare report, or JSON that holds reports)."""

    def walk(node):
        if isinstance(node, dict):
            per_seed = node.get("per_seed")
            for arm_rows in (per_seed.values() if isinstance(per_seed, dict) else ()):
                for row in (arm_rows if isinstance(arm_rows, list) else ()):  # a counter's per_seed maps seed → count
                    if isinstance(row, dict) and row.get("run_id") == run_id:
                        yield row
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    if not against.is_file():
        raise ValueError(f"--against: {against} is not a file")
    try:
        tree = json.loads(against.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"--against: {against} is not JSON ({err})") from None
    rows = list(walk(tree))
    if not rows:
        raise ValueError(f"--against: no per_seed row of run {run_id!r} in {against}")
    return rows[-1]


def final_of(duckdb_path: Path, run_id: str) -> dict:
    """The run's last evaluation: ``FIELDS`` by name (``None`` where the key was not evaluated)."""
    rows = db.evaluation_rows(duckdb_path, [run_id])
    if rows.is_empty():
        raise RuntimeError(f"rerun {run_id}: no evaluation rows in {duckdb_path}")

    def final(key: str) -> float | None:
        return final_values(rows, key).get(run_id)

    return {"policy_version": int(rows["policy_version"].max()), **{f: final(k) for f, (k, _) in FIELDS.items()},
            "counts": {f: final(n) for f, (_, n) in FIELDS.items()}}


def noise_bound(p: float, n: float | None) -> float | None:
    """Twice the binomial s.e. of a rate ``p`` over ``n`` trials (``None`` without ``n``)."""
    return 2 * (p * (1 - p) / n) ** 0.5 if n else None


def rerun(config_path: str, overrides: list[str], compare_id: str, spec: str, into: Path,
          against: Path | None = None) -> dict:
    """Train ``spec`` (ARM:SEED) of comparison ``compare_id`` again into ``into``; its final numbers, the
    committed ones (from ``against``) and whether each field is equal."""
    arm, seed = parse_job(spec)
    cfg = load_config(config_path, overrides)
    jobs = {(a, s): (run_id, ov) for a, s, run_id, ov in compare_jobs(cfg, overrides, compare_id)}
    if (arm, seed) not in jobs:
        valid = ", ".join(f"{a}:{s}" for a, s in sorted(jobs))
        raise ValueError(f"--rerun: {spec!r} is not a run of this comparison; valid: {valid}")
    run_id, ov = jobs[(arm, seed)]
    want = committed_row(against, run_id) if against is not None else None  # a bad file fails before training
    folder = fresh_folder(into, run_id)
    _train_process(config_path, [*ov, *scratch_overrides(folder)], run_id, None, folder / f"{run_id}.log", None)
    got = final_of(folder / "cleaner.duckdb", run_id)
    out = {"run_id": run_id, "folder": str(folder), "rerun": got}
    if want is not None:
        out["committed"] = {f: want.get(f) for f in FIELDS}
        fields = [f for f in FIELDS if want.get(f) is not None and got[f] is not None]
        out["equal"] = {f: want[f] == got[f] for f in fields}
        out["difference"] = {f: got[f] - want[f] for f in fields}
        bounds = {f: noise_bound(want[f], got["counts"][f]) for f in fields}
        out["within_noise"] = {f: bounds[f] is not None and abs(got[f] - want[f]) <= bounds[f] for f in fields}
    return out


def rerun_cli(config_path: str, overrides: list[str], compare_id: str | None, spec: str, into: Path,
              against: Path | None, console) -> None:
    """``cleaner compare --rerun``: print the result as JSON; exit 2 on bad input, 1 when a field differs by more
    than the evaluation's noise."""
    import typer

    if not compare_id:
        console.print("[red]--rerun needs the comparison's --compare-id (its run ids carry it)[/red]")
        raise typer.Exit(2)
    try:
        out = rerun(config_path, overrides, compare_id, spec, into, against)
    except ValueError as err:
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    console.print_json(data=out)
    if not all(out.get("within_noise", {}).values()):
        console.print(f"[red]{out['run_id']}: the rerun differs from {against} beyond the evaluation's noise[/red]")
        raise typer.Exit(1)
    if not all(out.get("equal", {}).values()):
        console.print(f"[yellow]{out['run_id']}: the rerun is within the evaluation's noise of {against}, not equal "
                      "(a run made before lockstep tool calls; rerun it with --set rollout.tool_lag_steps=0)[/yellow]")
