"""R3L reflections as a table: one row per reflection (``r3l_reflections.parquet`` → DuckDB ``r3l_reflections``).

The DuckDB table is declared in ``tasks.stores.db``. Keys ``(run_id, step, traj_id)`` with ``traj_id`` the base attempt reflected on. Columns: the
base reward and steps, the reflection text, the parsed report (JSON, null when it did not
parse), validity, perfect, the reason (``tasks.r3l.report.REASONS`` plus ``too_long`` and
``ungraded``), the pivot (``retry_from_step``), the retry and distill trajectory ids, the retry reward and steps,
whether the retry succeeded (and so trained as reflect + retry rows), and every replayed tool
call (JSON, with how it went the first time) with the count of those that changed, and the
retry's conversation with its guidance (JSON; the retry row itself trains only when it succeeded).
"""

from __future__ import annotations

import json

import polars as pl

SCHEMA = {
    "run_id": pl.String, "step": pl.Int64, "traj_id": pl.String, "prompt_id": pl.String, "sample_idx": pl.Int64,
    "base_reward": pl.Float64, "base_steps": pl.Int64, "reflection_text": pl.String, "reflection_tokens": pl.Int64,
    "finish_reason": pl.String, "report": pl.String, "valid": pl.Boolean, "perfect": pl.Boolean,
    "reason": pl.String, "retry_from_step": pl.Int64, "retry_traj_id": pl.String, "distill_traj_id": pl.String,
    "retry_reward": pl.Float64, "retry_steps": pl.Int64, "retry_succeeded": pl.Boolean, "replays": pl.String,
    "replay_changed": pl.Int64, "note": pl.String, "retry_messages": pl.String,
}



def reflection_frame(reflections: list, run_id: str, step: int) -> pl.DataFrame:
    """One row per ``tasks.r3l.driver.Reflection``."""
    rows = []
    for r in reflections:
        rows.append({
            "run_id": run_id, "step": step, "traj_id": r.base.traj_id, "prompt_id": r.base.item.prompt_id,
            "sample_idx": r.base.sample_idx, "base_reward": r.r1, "base_steps": r.steps1,
            "reflection_text": r.text, "reflection_tokens": len(r.response_ids), "finish_reason": r.finish_reason,
            "report": json.dumps(r.report, ensure_ascii=False) if r.report is not None else None,
            "valid": r.check.valid, "perfect": r.check.perfect, "reason": r.check.reason, "retry_from_step": r.check.pivot,
            "retry_traj_id": r.retry.traj_id if r.retry is not None else None,
            "distill_traj_id": r.distill.traj_id if r.distill is not None else None,
            "retry_reward": r.r2, "retry_steps": r.steps2, "retry_succeeded": r.succeeded,
            "replays": json.dumps([{**p.__dict__, "changed": p.changed} for p in r.replays], ensure_ascii=False),
            "replay_changed": sum(p.changed for p in r.replays), "note": r.note,
            "retry_messages": json.dumps(r.retry.messages, ensure_ascii=False) if r.retry is not None else None,
        })
    return pl.DataFrame(rows, schema=SCHEMA)


def empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)
