"""The store against its row log: what a test checks instead of ``count(*) - count(DISTINCT key)``, which the
tables' primary keys make 0 whatever happened.

``differences`` ingests, then compares every table's rows of some runs in the store with the newest row-log
versions of those runs (``tasks.stores.rowlog.load``), row for row both ways: a unit whose newest version never
reached the store, a stale version, a row the store kept after its unit dropped it — each shows up.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tasks.stores import db, rowlog
from tasks.stores.schema import UNITS

TABLES = sorted({t for tables, _ in UNITS.values() for t in tables})


def differences(store: str | Path, run_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Table → (rows only in the store, rows only in the row log) for the rows of ``run_ids``; {} when equal."""
    db.ingest(store)
    mem = rowlog.load(store, run_ids, TABLES)
    try:
        mem.execute(f"ATTACH '{str(store).replace(chr(39), chr(39) * 2)}' AS s (READ_ONLY)")
        out = {}
        for table in TABLES:
            ours = f"SELECT * FROM s.{table} WHERE list_contains(?::VARCHAR[], run_id)"
            logged = f"SELECT * FROM {table}"
            extra = mem.execute(f"SELECT count(*) FROM ({ours} EXCEPT ALL {logged})", [list(run_ids)]).fetchone()[0]
            missing = mem.execute(f"SELECT count(*) FROM ({logged} EXCEPT ALL {ours})", [list(run_ids)]).fetchone()[0]
            if extra or missing:
                out[table] = (extra, missing)
        return out
    finally:
        mem.close()
