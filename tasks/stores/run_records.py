"""A comparison's finished runs kept as committed records, so that a later session, on a fresh clone, reuses them.

A study's runs outlive the session that ran them only through the repository: its stores (the DuckDB file, the
row log, MLflow, the checkpoints) are the machine's. With ``compare.records_dir`` set, each child run that finishes
writes ``<records_dir>/<run id>.json`` at once, holding what the compare report reads of it —

    evaluations   every (policy_version, key, value) row of its evaluations
    metrics       every per-step metric, key → [[step, value], ...]
    kinds         its trained trajectories by kind (``tasks.stores.db.kept_kinds``)
    probe         the fixed-probe entropy of its final checkpoint

— with what made it: its resolved configuration (less ``compare`` and ``tracking``, which say where rows go, not
what is trained), the overrides that spelled it, and the commit. A rerun of the comparison under the same id
trains no run that has a record; the report reads the record in place of the store. A record made under another
configuration is refused, naming the record and the fields that differ: such a run would not be the one the
comparison asks for. The shared initial evaluation and the probe's tokens are kept beside them
(``initial_eval.json``, ``probe.parquet``); the initial evaluation with its configuration too, checked the same way
(``write_initial``, ``read_initial``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import polars as pl

VERSION = 1
IGNORED = ("compare", "tracking")  # where rows go and how the comparison is driven, not what a run trains


class RecordMismatch(ValueError):
    """A record exists for a run but was made under another configuration."""


def run_config(config: dict) -> dict:
    """The part of a child's resolved configuration (``model_dump(mode="json")``) that decides what it trains."""
    return {k: v for k, v in config.items() if k not in IGNORED}


def digest(config: dict) -> str:
    """SHA-256 of ``run_config(config)`` as canonical JSON."""
    return hashlib.sha256(json.dumps(run_config(config), sort_keys=True).encode()).hexdigest()


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except OSError:
        return None
    return out.stdout.strip() or None


def make(run_id: str, overrides: list[str], config: dict, evals: pl.DataFrame, metrics: pl.DataFrame,
         kinds: pl.DataFrame, probe: dict | None, wall_s: float) -> dict:
    """The record of one finished run (see the module's docstring); ``config`` is its resolved configuration."""
    return {"version": VERSION, "run_id": run_id, "overrides": list(overrides), "config_sha256": digest(config),
            "config": run_config(config), "commit": _commit(), "wall_s": round(wall_s, 1),
            "evaluations": evals.select("policy_version", "key", "value").rows(),
            "metrics": {key: sorted(map(list, part.select("step", "value").rows()))
                        for (key,), part in metrics.group_by("key", maintain_order=True)},
            "kinds": kinds.select("kind", "n", "reward", "advantage").rows(),
            "probe": probe}


def write(folder: str | Path, record: dict) -> Path:
    """Write ``record`` to ``<folder>/<run id>.json`` whole or not at all (a temporary file, then a rename)."""
    path = Path(folder) / f"{record['run_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def _diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted names of the fields whose values differ between two nested dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _kept(path: Path, what: str, redo: str) -> dict:
    """The JSON kept at ``path``; ``RecordMismatch`` naming ``what`` when it is not valid JSON (``redo``: what
    removing it does)."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RecordMismatch(f"{what} {path} is not valid JSON ({e}); remove it to {redo}") from None


def _same_config(kept: dict, config: dict, path: Path, what: str, redo: str) -> None:
    """``RecordMismatch`` naming the fields that differ when ``kept`` was made under another configuration."""
    if kept["config_sha256"] != digest(config):
        fields = _diff(kept["config"], run_config(config))
        raise RecordMismatch(f"{what} {path} was made under another configuration (fields that differ: "
                             f"{', '.join(fields) or 'none named: the digest differs'}); remove it to {redo}")


def read(folder: str | Path, run_id: str, config: dict) -> dict | None:
    """The record of ``run_id`` in ``folder`` if there is one; it must have been made by the same resolved
    configuration (however its overrides spelled it), or ``RecordMismatch`` names the fields that differ."""
    path, redo = Path(folder) / f"{run_id}.json", f"train {run_id} again"
    if not path.exists():
        return None
    record = _kept(path, "run record", redo)
    if record.get("version") != VERSION:
        raise RecordMismatch(f"run record {path}: version {record.get('version')!r}, this code reads {VERSION}")
    _same_config(record, config, path, "run record", redo)
    return record


INITIAL = "initial_eval.json"


def write_initial(folder: str | Path, config: dict, metrics: dict[str, float]) -> Path:
    """Keep the shared initial evaluation in ``<folder>/initial_eval.json`` with the configuration that made it
    (``config``: the resolved configuration it evaluated, as ``make`` takes a run's)."""
    return write(folder, {"version": VERSION, "run_id": INITIAL.removesuffix(".json"), "config_sha256": digest(config),
                          "config": run_config(config), "commit": _commit(), "metrics": metrics})


def read_initial(folder: str | Path, config: dict) -> dict[str, float] | None:
    """The kept initial evaluation's metrics, if there are any; made under another configuration, ``RecordMismatch``
    names the fields that differ (its metrics would be another starting policy's, or another evaluation's). A file
    kept before the configuration was written beside the metrics (the metrics alone) is read as it is."""
    path, redo = Path(folder) / INITIAL, "evaluate the starting policy again"
    if not path.exists():
        return None
    kept = _kept(path, "initial evaluation", redo)
    if "config_sha256" not in kept:
        return kept
    _same_config(kept, config, path, "initial evaluation", redo)
    return kept["metrics"]


def load(folder: str | Path, run_ids: list[str]) -> list[dict]:
    """The records of ``run_ids`` (each checked by ``read`` before its run was skipped or trained)."""
    missing = [r for r in run_ids if not (Path(folder) / f"{r}.json").exists()]
    if missing:
        raise FileNotFoundError(f"{folder} holds no run record for {', '.join(missing)}")
    return [json.loads((Path(folder) / f"{r}.json").read_text()) for r in run_ids]


def frames(records: list[dict]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The records' rows as the store's queries give them: (evaluations, per-step metrics, kinds), with ``run_id``."""
    def table(rows: list[tuple], columns: dict) -> pl.DataFrame:
        return pl.DataFrame(rows, schema={"run_id": pl.String, **columns}, orient="row")

    steps = [(r["run_id"], step, key, value) for r in records for key, pairs in r["metrics"].items()
             for step, value in pairs]
    return (table([(r["run_id"], *row) for r in records for row in r["evaluations"]],
                  {"policy_version": pl.Int64, "key": pl.String, "value": pl.Float64}),
            table(steps, {"step": pl.Int64, "key": pl.String, "value": pl.Float64}),
            table([(r["run_id"], *row) for r in records for row in r["kinds"]],
                  {"kind": pl.String, "n": pl.Int64, "reward": pl.Float64, "advantage": pl.Float64}))


def totals(metrics: pl.DataFrame, keys: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> pl.DataFrame:
    """(run_id, key, total, steps) of the per-step metrics in ``keys`` or under one of ``prefixes``, as
    ``tasks.stores.db.step_totals`` gives them from the store."""
    wanted = pl.col("key").is_in(list(keys))
    for prefix in prefixes:
        wanted = wanted | pl.col("key").str.starts_with(prefix)
    return (metrics.filter(wanted).group_by("run_id", "key", maintain_order=True)
            .agg(pl.col("value").sum().alias("total"), pl.len().cast(pl.Int64).alias("steps")))
