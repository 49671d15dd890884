"""The sandbox that forgets: empty every writable directory before the next snippet starts.

``wipe(dirs)`` deletes everything inside each directory (iteratively, so depth is no limit;
directories a snippet made unreadable are opened up first; symlinks are removed, never
followed) and returns the directories that are still not empty, which the executor treats as
fatal: a worker that cannot forget must not run another snippet.  The snippet's processes
are killed before, so nothing writes while it runs.  Stdlib only (this package runs inside
containers).
"""

from __future__ import annotations

import os


def wipe(dirs: list[str]) -> list[str]:
    """Empty each of ``dirs`` (which stay); return those that could not be emptied."""
    left = []
    for root in dirs:
        try:
            if os.stat(root).st_size == 0:  # an empty tmpfs (or btrfs) directory: nothing to do
                continue
            fd = os.open(root, _DIR_FLAGS)
        except FileNotFoundError:
            continue
        except OSError:
            left.append(root)
            continue
        try:
            if os.listdir(fd):
                _empty(os.dup(fd))
                if os.listdir(fd):
                    left.append(root)
        except OSError:
            left.append(root)
        finally:
            os.close(fd)
    return left


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _empty(fd: int) -> None:
    """Delete everything below the directory open as ``fd`` (closed on return).  Works on
    file descriptors (paths may exceed PATH_MAX) and climbs back with ``..`` instead of keeping
    one descriptor per level (depth is bounded by the inode cap, not by the fd limit)."""
    stack: list[tuple[list[str], str]] = []
    pending = _clear_files(fd)
    while True:
        if pending:
            name = pending.pop()
            _quiet(os.chmod, name, 0o700, dir_fd=fd)  # a snippet may have locked it
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            stack.append((pending, name))
            os.close(fd)
            fd, pending = child, _clear_files(child)
        elif stack:
            pending, name = stack.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            _quiet(os.rmdir, name, dir_fd=fd)
        else:
            os.close(fd)
            return


def _clear_files(fd: int) -> list[str]:
    """Unlink every non-directory in the directory ``fd``; return the subdirectories' names."""
    subdirs = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                else:
                    _quiet(os.unlink, entry.name, dir_fd=fd)
    except OSError:
        pass
    return subdirs


def _quiet(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except OSError:
        pass
