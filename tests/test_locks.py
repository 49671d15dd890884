"""The stores' file lock (``tasks.stores.locks.locked``): exclusive against every other holder, shared with other
shared holders, a deadline that fails naming the file, and the lock dropped when its block ends (also on an error).

``flock`` locks belong to an open file, so two ``locked`` blocks of one process contend like two processes do.
"""

from __future__ import annotations

import os

import pytest

from tasks.stores.locks import locked


def test_an_exclusive_lock_holds_off_every_other_holder_until_its_block_ends(tmp_path):
    path = tmp_path / "x.lock"
    with locked(path):
        assert path.exists()  # an exclusive lock creates its file
        for exclusive in (True, False):
            with pytest.raises(TimeoutError) as caught, locked(path, exclusive, wait_s=0.1):
                pass
            assert str(caught.value) == f"{path}: still locked by another process after 0.1 s"
    with locked(path, wait_s=0.1):
        pass


def test_shared_locks_share_and_hold_off_an_exclusive_one(tmp_path):
    path = tmp_path / "attempt"
    path.write_text("a")
    with locked(path, False) as first, locked(path, False, wait_s=0.1) as second:
        assert os.pread(first, 1, 0) == os.pread(second, 1, 0) == b"a"
        with pytest.raises(TimeoutError, match="still locked by the writer after 0.2 s \\(wait\\)$"), \
                locked(path, wait_s=0.2, holder="the writer", advice="(wait)"):
            pass


def test_a_shared_lock_needs_the_file_and_an_error_in_the_block_drops_the_lock(tmp_path):
    with pytest.raises(FileNotFoundError):
        with locked(tmp_path / "missing", False):
            pass
    assert not (tmp_path / "missing").exists()
    with pytest.raises(RuntimeError), locked(tmp_path / "x.lock"):
        raise RuntimeError("in the block")
    with locked(tmp_path / "x.lock", wait_s=0.1):
        pass
