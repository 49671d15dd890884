"""The row log under crashes (``tasks.stores.rowlog``, docs/store.md): a writer killed at any point between the
steps of a unit write leaves the store equal to the row log after the next ingest.

* every filesystem call of ``write_unit`` (mkdir, open, fsync, rename, replace, unlink, rmdir) in turn raises an
  injected fault, as if the process died there; after the next ingest the store holds exactly the row log's newest
  version — the new rows when the rename happened, the old ones otherwise;
* the same with the writer a real process, killed by SIGKILL at each point (slow);
* an ingest that runs between the marker and the rename keeps the marker, so the next ingest loads the new version;
* the new version's files and folder and its marker are flushed (fsync) before the rename that publishes it, and
  the unit's folder after it, before older versions go;
* a marker of a write killed before its rename goes with the unit's next write, even one made on a machine whose
  clock is behind the killed writer's;
* that next write removes the hidden folders of writers that died (on this host, older than its version), and no
  other: not a live process's write in progress, not one of another machine, not one of unknown host.

Run: ``pytest tests/test_rowlog_crash.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl
import pytest

from tasks.stores import db, rowlog
from tests import storecheck

ROOT = Path(__file__).resolve().parents[1]
OPS = ("mkdir", "open", "fsync", "rename", "replace", "unlink", "rmdir")


class Killed(BaseException):
    """The injected fault: a BaseException, so no ``except Exception`` (or ``ignore_errors``) of the writer hides it."""


def _metrics(value: float) -> dict[str, pl.DataFrame]:
    return {"metrics": pl.DataFrame({"run_id": "r", "step": 0, "key": ["a", "b"], "value": [value, value + 0.5]})}


@contextmanager
def _filesystem(kill_at: int | None = None, before_rename=None) -> Iterator[list[tuple[str, str]]]:
    """Patch ``os``'s filesystem calls: record (call, path) — fsync as the path its descriptor was opened on —
    raise ``Killed`` instead of the ``kill_at``-th call (1-based), and call ``before_rename`` before a rename."""
    seen: list[tuple[str, str]] = []
    fds: dict[int, str] = {}
    real = {name: getattr(os, name) for name in OPS}

    def wrap(name: str):
        def call(*args, **kwargs):
            if kill_at is not None and len(seen) + 1 == kill_at:
                raise Killed(name)
            path = fds.get(args[0], "?") if name == "fsync" else str(args[0])
            seen.append((name, path))
            if name == "rename" and before_rename is not None:
                before_rename()
            out = real[name](*args, **kwargs)
            if name == "open":
                fds[out] = path
            return out
        return call

    for name in OPS:
        setattr(os, name, wrap(name))
    try:
        yield seen
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def _store_rows(store: Path) -> list[tuple]:
    with duckdb.connect(str(store), read_only=True) as con:
        return con.execute("SELECT key, value FROM metrics WHERE run_id = 'r' AND step = 0 ORDER BY key").fetchall()


def _log_rows(store: Path) -> list[tuple]:
    return sorted(rowlog.read_unit(store, "r", "step", 0)["metrics"].select("key", "value").rows())


def _published(seen: list[tuple[str, str]]) -> bool:
    return any(name == "rename" and "/.tmp-" in path for name, path in seen)


def test_a_writer_failing_at_any_point_leaves_the_store_equal_to_the_row_log(tmp_path):
    store = tmp_path / "s.duckdb"
    db.replace_step(store, "r", 0, _metrics(1.0))  # version 1, in the store
    whole, point = 1.0, 1
    while True:
        new = float(point + 1)
        with _filesystem(kill_at=point) as seen:
            try:
                rowlog.write_unit(store, "r", "step", 0, _metrics(new))
                killed = False
            except Killed:
                killed = True
        whole = new if _published(seen) else whole
        db.ingest(store)
        assert _store_rows(store) == _log_rows(store) == [("a", whole), ("b", whole + 0.5)], (point, seen)
        if not killed:
            break
        point += 1
    assert point > 15, seen  # every call of a whole write was a failure point once
    assert not rowlog.pending(store), "a marker of a write killed before its rename outlived the next write"


KILLED_WRITER = """
import os, signal, sys
import polars as pl
from tasks.stores import rowlog
store, kill_at, value = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
calls = 0
def wrap(fn):
    def call(*args, **kwargs):
        global calls
        calls += 1
        if calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)
    return call
for name in sys.argv[4].split(","):
    setattr(os, name, wrap(getattr(os, name)))
rowlog.write_unit(store, "r", "step", 0, {"metrics": pl.DataFrame(
    {"run_id": "r", "step": 0, "key": ["a", "b"], "value": [value, value + 0.5]})})
"""


@pytest.mark.slow
def test_a_writer_killed_at_any_point_leaves_the_store_equal_to_the_row_log(tmp_path):
    store = tmp_path / "s.duckdb"
    db.replace_step(store, "r", 0, _metrics(1.0))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outcomes = set()
    for point in range(1, 100):
        args = [str(store), str(point), str(point + 1.0), ",".join(OPS)]
        done = subprocess.run([sys.executable, "-c", KILLED_WRITER, *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode in (0, -9), done.stderr[-2000:]
        db.ingest(store)
        rows = _store_rows(store)
        assert rows == _log_rows(store) and rows[0][1] in (1.0, *(float(p + 1) for p in range(1, point + 1))), point
        outcomes.add((done.returncode, rows[0][1] == point + 1.0))
        if done.returncode == 0:
            break
    assert outcomes == {(-9, False), (-9, True), (0, True)} and point > 15, outcomes  # killed before and after rename
    assert not rowlog.pending(store)


def test_an_ingest_between_the_marker_and_the_rename_keeps_the_marker(tmp_path):
    store = tmp_path / "s.duckdb"
    db.replace_step(store, "r", 0, _metrics(1.0))
    with _filesystem(before_rename=lambda: db.ingest(store)):
        rowlog.write_unit(store, "r", "step", 0, _metrics(2.0))
    assert _store_rows(store) == [("a", 1.0), ("b", 1.5)]  # the ingest ran before the new version was in
    assert len(rowlog.pending(store)) == 1
    db.ingest(store)
    assert _store_rows(store) == _log_rows(store) == [("a", 2.0), ("b", 2.5)]
    assert not rowlog.pending(store)


def test_a_version_is_on_disk_before_it_is_published_and_before_the_old_one_goes(tmp_path):
    store = tmp_path / "s.duckdb"
    db.replace_step(store, "r", 0, _metrics(1.0))
    old = rowlog.latest(store, "r", "step-000000")
    with _filesystem() as seen:
        new = rowlog.write_unit(store, "r", "step", 0, _metrics(2.0))
    [publish] = [i for i, (name, path) in enumerate(seen) if name == "rename"]
    tmp = Path(seen[publish][1])
    synced = [path for name, path in seen[:publish] if name == "fsync"]
    assert str(tmp / "metrics.parquet") in synced and str(tmp) in synced
    [marker] = [Path(path) for name, path in seen[:publish] if name == "replace"]  # its hidden file, renamed
    assert marker.parent == rowlog.rows_dir(store) / "pending"
    assert str(marker) in synced and str(marker.parent) in synced, "the marker was not on disk before the rename"
    first_removal = min(i for i, (name, path) in enumerate(seen) if name in ("unlink", "rmdir") and str(old) in path)
    assert ("fsync", str(new.parent)) in seen[publish:first_removal]


def test_a_killed_writes_marker_goes_with_the_next_write_on_a_slower_clock(tmp_path, monkeypatch):
    store = tmp_path / "s.duckdb"
    db.replace_step(store, "r", 0, _metrics(1.0))
    ahead = rowlog.time.time_ns() + 10**15
    monkeypatch.setattr(rowlog.time, "time_ns", lambda: ahead)  # a machine whose clock is ahead, killed before rename
    with _filesystem(before_rename=lambda: (_ for _ in ()).throw(Killed("rename"))):
        with pytest.raises(Killed):
            rowlog.write_unit(store, "r", "step", 0, _metrics(2.0))
    monkeypatch.undo()
    db.ingest(store)
    assert _store_rows(store) == [("a", 1.0), ("b", 1.5)] and len(rowlog.pending(store)) == 1
    rowlog.write_unit(store, "r", "step", 0, _metrics(3.0))
    assert int(rowlog.latest(store, "r", "step-000000").name) > ahead
    db.ingest(store)
    assert _store_rows(store) == _log_rows(store) == [("a", 3.0), ("b", 3.5)]
    assert not rowlog.pending(store)


def test_the_store_check_sees_a_version_the_store_lacks(tmp_path):
    """``tests.storecheck.differences`` (what the flow tests assert) is not 0 whatever happened."""
    store = tmp_path / "s.duckdb"
    db.replace_step(store, "r", 0, _metrics(1.0))
    assert storecheck.differences(store, ["r"]) == {}
    rowlog.write_unit(store, "r", "step", 0, {"metrics": _metrics(2.0)["metrics"].head(1)})
    for mark in rowlog.pending(store)[("r", "step-000000")]:
        mark.path.unlink()  # what the old order left after a kill between the rename and the marker
    assert storecheck.differences(store, ["r"]) == {"metrics": (2, 1)}


def test_the_next_write_removes_the_hidden_folders_of_dead_writers_only(tmp_path, monkeypatch):
    store = tmp_path / "s.duckdb"
    unit = rowlog.write_unit(store, "r", "step", 0, _metrics(1.0)).parent
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead, host, old = int(gone.stdout), socket.gethostname(), f"{1:020d}"
    with pytest.raises(ProcessLookupError):
        os.kill(dead, 0)  # the writer is gone (and its pid not reused)
    names = {"dead": f".tmp-{old}-{dead}-0badc0de-{host}", "live": f".tmp-{old}-{os.getpid()}-12345678-{host}",
             "elsewhere": f".tmp-{old}-{dead}-0badc0de-another-machine", "unknown host": f".tmp-{old}-{dead}-0badc0de"}
    real_mark = rowlog._mark_pending

    def a_later_writer_dies(store_, run_id, name, version):  # started after this write chose its version
        names["newer"] = f".tmp-{int(version) + 1:020d}-{dead}-0badc0de-{host}"
        (unit / names["newer"]).mkdir()
        real_mark(store_, run_id, name, version)

    for name in names.values():
        (unit / name).mkdir()
        _metrics(9.0)["metrics"].write_parquet(unit / name / "metrics.parquet")
    monkeypatch.setattr(rowlog, "_mark_pending", a_later_writer_dies)
    written = rowlog.write_unit(store, "r", "step", 0, _metrics(2.0))
    left = sorted(p.name for p in unit.iterdir())
    assert left == sorted([written.name, *(names[k] for k in ("live", "elsewhere", "unknown host", "newer"))])
    assert _log_rows(store) == [("a", 2.0), ("b", 2.5)]
