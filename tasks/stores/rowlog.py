"""Row log: the store's rows as Parquet files that runs write without ever opening the DuckDB file.

DuckDB allows one process per file, so runs that wrote into ``cleaner.duckdb`` directly waited for each other
and failed when a scheduled run or a notebook held it. Instead every run writes its rows here, in **units**
(``tasks.stores.schema.UNITS``: its ``runs`` row, one step's rows, one evaluation's rows), each replaced whole;
``tasks.stores.db.ingest`` — one process at a time, under DuckDB's own lock — loads pending units into the
store, replacing the unit's rows by key. Layout beside the store (``cleaner.duckdb`` → ``cleaner.duckdb.rows/``)::

    runs/<run_id>/run/<version>/runs.parquet
    runs/<run_id>/step-000003/<version>/{trajectories,turns,metrics,...}.parquet
    runs/<run_id>/eval-000002/<version>/evaluations.parquet
    pending/<version>-<random>.json          {"run_id": ..., "unit": ..., "version": ...}: versions not yet loaded

A unit version is written into a hidden folder, its files and the folder flushed to disk (fsync), then its
pending marker — naming the version — is written and flushed, and only then is the folder renamed into place (a
reader never sees half of one) and the unit's folder flushed; older versions are removed last. Versions grow
(``max(now, newest + 1)`` in ns, counting crashed writes' hidden folders too, so a machine with a slow clock, or a
unit written again after a crash, still supersedes). ``ingest`` removes a marker only once it has loaded a version
at least as new as the marker's. So a crash (or a power loss) at any point leaves the old or the new version whole
with a marker for every version the store may lack: killed before the rename, the store keeps the old rows, as the
row log does; killed after it, the marker makes the next ingest load the new ones. At worst a marker names a
version already loaded (loading again leaves the store unchanged), or one that never appeared (a write killed
before its rename: the unit is loaded again at each ingest, unchanged, until the unit is written again).
A hidden folder is named ``.tmp-<version>-<pid>-<random>-<host>``: the unit's next write removes those of writers
on its own host that no longer run (a write in progress, or one of another machine sharing the row log, is kept).
Files are written through an in-memory DuckDB holding the store's schema: types and primary keys are checked in
the run that wrote them, and every file has exactly its table's columns (as of the code that wrote it: a column
added later is NULL in older files, whatever order the files are read in).

Readers of one run's rows (plots, the compare report) read the files of those runs (``load``), not the store.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import duckdb
import polars as pl

from sandbox.pids import pid_running
from tasks.stores.schema import SCHEMA, UNITS


def rows_dir(store: str | Path) -> Path:
    """The row log of the store at ``store``: ``<store>.rows`` beside it."""
    return Path(f"{store}.rows")


def unit_name(kind: str, key: int | None) -> str:
    return kind if key is None else f"{kind}-{key:06d}"


def parse_unit(name: str) -> tuple[str, int | None]:
    kind, _, key = name.partition("-")
    if kind not in UNITS:
        raise ValueError(f"row log unit {name!r}: unknown kind {kind!r}; valid: {sorted(UNITS)}")
    return kind, int(key) if key else None


class Mark(NamedTuple):
    """A pending marker: its file and the unit version it announces (0 for a marker written before markers named
    their version: any load satisfies it)."""

    path: Path
    version: int


def _versions(unit_dir: Path) -> list[str]:
    """Complete versions of a unit, oldest first (hidden ``.tmp-*`` folders are writes in progress or crashed)."""
    try:
        return sorted((p.name for p in unit_dir.iterdir() if p.name.isdigit()), key=int)
    except FileNotFoundError:
        return []


def latest(store: str | Path, run_id: str, unit: str) -> Path | None:
    versions = _versions(rows_dir(store) / "runs" / run_id / unit)
    return rows_dir(store) / "runs" / run_id / unit / versions[-1] if versions else None


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"  # COPY and read_parquet lists take no parameters


def _checked(kind: str, run_id: str, key: int | None, frames: dict[str, pl.DataFrame]) -> duckdb.DuckDBPyConnection:
    """The frames in an in-memory store (types, primary keys); every row must belong to the unit."""
    tables, column = UNITS[kind]
    unknown = set(frames) - set(tables)
    if unknown:
        raise ValueError(f"{kind} rows: unknown tables {sorted(unknown)}; valid: {list(tables)}")
    mem = duckdb.connect()
    mem.execute(SCHEMA)
    for table, df in frames.items():
        if not df.height:
            continue
        mem.register("_batch", df.to_arrow())
        mem.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
        mem.unregister("_batch")
        where = "run_id IS DISTINCT FROM ?" + (f" OR {column} IS DISTINCT FROM ?" if column else "")
        foreign = mem.execute(f"SELECT count(*) FROM {table} WHERE {where}", [run_id, *([key] if column else [])])
        n = foreign.fetchone()[0]
        if n:
            mem.close()
            raise ValueError(f"{table}: {n} row(s) are not of run {run_id!r}" + (f" {column} {key}" if column else "")
                             + "; a unit holds only its own rows")
    return mem


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's contents (a folder: its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _next_version(unit_dir: Path, older: list[str]) -> int:
    """Newer than every version of the unit, complete or hidden (a write in progress or killed), and than now."""
    hidden = [int(p.name.split("-")[1]) for p in unit_dir.glob(".tmp-*") if p.name.split("-")[1].isdigit()]
    return max([time.time_ns(), *(int(v) + 1 for v in older), *(v + 1 for v in hidden)])


def write_unit(store: str | Path, run_id: str, kind: str, key: int | None, frames: dict[str, pl.DataFrame]) -> Path:
    """Write a new version of one unit (replacing the unit's rows of every table of its kind) and mark it
    pending; returns the version folder. Order: files, fsync, marker, rename, fsync, older versions removed."""
    mem = _checked(kind, run_id, key, frames)
    name = unit_name(kind, key)
    unit_dir = rows_dir(store) / "runs" / run_id / name
    unit_dir.mkdir(parents=True, exist_ok=True)
    older = _versions(unit_dir)
    version = f"{_next_version(unit_dir, older):020d}"
    tmp = unit_dir / f".tmp-{version}-{os.getpid()}-{uuid.uuid4().hex[:8]}-{socket.gethostname()}"
    tmp.mkdir()
    try:
        for table in frames:
            if mem.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:
                mem.execute(f"COPY {table} TO {_literal(tmp / f'{table}.parquet')} (FORMAT parquet)")
    finally:
        mem.close()
    for file in sorted(tmp.iterdir()):
        _fsync(file)
    _fsync(tmp)
    _mark_pending(store, run_id, name, version)
    tmp.rename(unit_dir / version)
    _fsync(unit_dir)
    for old in older:
        shutil.rmtree(unit_dir / old, ignore_errors=True)
    _remove_leftovers(unit_dir, int(version))
    return unit_dir / version


def _remove_leftovers(unit_dir: Path, version: int) -> None:
    """Remove the hidden folders of writes that will never finish: older than ``version`` (the one just renamed
    into place, so the next version still exceeds any marker they wrote), written on this host (the name says) by
    a process no longer running. A write in progress is never removed: its process runs, or it is on another
    machine, whose processes this one cannot see (a row log on a shared folder). Hidden folders of writers before
    names carried the host (``.tmp-<version>-<pid>-<random>``) are kept: their host is unknown."""
    host = socket.gethostname()
    for leftover in unit_dir.glob(".tmp-*"):
        parts = leftover.name.split("-", 4)  # .tmp, version, pid, random, host
        if (len(parts) == 5 and parts[4] == host and parts[1].isdigit() and int(parts[1]) < version
                and parts[2].isdigit() and not pid_running(int(parts[2]))):
            shutil.rmtree(leftover, ignore_errors=True)


def _mark_pending(store: str | Path, run_id: str, unit: str, version: str) -> None:
    """A marker announcing ``version`` of the unit, on disk (fsynced, and its folder) when this returns."""
    folder = rows_dir(store) / "pending"
    folder.mkdir(parents=True, exist_ok=True)
    mark = folder / f"{version}-{uuid.uuid4().hex[:8]}.json"
    tmp = folder / f".{mark.name}.tmp"
    tmp.write_text(json.dumps({"run_id": run_id, "unit": unit, "version": int(version)}))
    _fsync(tmp)
    tmp.replace(mark)
    _fsync(folder)


def mark_all_pending(store: str | Path) -> int:
    """Mark the newest version of every unit pending (the next ingest rebuilds a deleted or damaged store); returns
    the units marked."""
    n = 0
    for unit_dir in sorted((rows_dir(store) / "runs").glob("*/*")):
        versions = _versions(unit_dir)
        if versions:
            _mark_pending(store, unit_dir.parent.name, unit_dir.name, versions[-1])
            n += 1
    return n


def pending(store: str | Path) -> dict[tuple[str, str], list[Mark]]:
    """Units with versions the store may lack: (run id, unit) → their pending markers."""
    folder = rows_dir(store) / "pending"
    out: dict[tuple[str, str], list[Mark]] = {}
    if not folder.is_dir():
        return out
    for mark in sorted(folder.glob("*.json")):
        try:
            found = json.loads(mark.read_text())
        except FileNotFoundError:  # loaded and removed by another process meanwhile
            continue
        out.setdefault((found["run_id"], found["unit"]), []).append(Mark(mark, int(found.get("version", 0))))
    return out


def table_files(store: str | Path, run_ids: Iterable[str], tables: Iterable[str]) -> dict[str, list[Path]]:
    """The newest version's Parquet file of every unit of ``run_ids``, per table in ``tables``."""
    wanted = set(tables)
    out: dict[str, list[Path]] = {t: [] for t in wanted}
    for run_id in run_ids:
        run_dir = rows_dir(store) / "runs" / run_id
        units = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
        for unit in units:
            newest = latest(store, run_id, unit)
            if newest is None:
                continue
            for table in wanted & set(UNITS[parse_unit(unit)[0]][0]):
                if (newest / f"{table}.parquet").exists():
                    out[table].append(newest / f"{table}.parquet")
    return out


def load(store: str | Path, run_ids: Iterable[str], tables: Iterable[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the store's schema holding the rows of ``run_ids`` in ``tables`` from their files
    (a version replaced while it is read is read again)."""
    run_ids, tables = list(run_ids), list(tables)
    for attempt in range(3):
        mem = duckdb.connect()
        mem.execute(SCHEMA)
        try:
            for table, files in table_files(store, run_ids, tables).items():
                if files:
                    # by name: a unit written before a column existed lacks it (NULL), whichever file comes first
                    mem.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet([{', '.join(map(_literal, files))}], "
                                f"hive_partitioning = false, union_by_name = true)")
            return mem
        except duckdb.IOException:
            mem.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def read_unit(store: str | Path, run_id: str, kind: str, key: int | None = None) -> dict[str, pl.DataFrame] | None:
    """The newest version of one unit as frames (table → rows), or None when the run never wrote it. Read through
    DuckDB, which maps its own types back (a JSON column stays text, not bytes)."""
    for _ in range(3):
        newest = latest(store, run_id, unit_name(kind, key))
        if newest is None:
            return None
        try:
            with duckdb.connect() as mem:
                return {p.stem: mem.execute("SELECT * FROM read_parquet(?, hive_partitioning = false)", [str(p)]).pl()
                        for p in sorted(newest.glob("*.parquet"))}
        except duckdb.IOException:  # replaced by a newer version while read
            continue
    return None
