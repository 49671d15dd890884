"""Checkpoint folders written atomically: the policy after an update (``save_checkpoint``) or unchanged after a step
that trained nothing (``copy_checkpoint``).

A folder is written under a temporary name and swapped in; the folder it replaces is moved aside first and deleted
only after the new one is in place, so a crash at any point leaves a complete checkpoint at ``out_dir`` or at
``.<name>.old``. The temporary folder's name is the writing process's own (pid and a random tail), so two processes
writing the same checkpoint never fill one folder (a killed writer's is left behind: the train flow's pruning
removes it); the swap runs inside ``commit(out_dir)``, a context the caller
passes to make it conditional (the train flow's attempt fence, ``tasks.stores.fence.guarded``: a replaced attempt
stops there without swapping anything in).

``policy_version(ckpt)`` reads which policy version a checkpoint holds (the number every sampled token is stamped
with, ``tasks.stores.records``, and the trainer's staleness is measured against).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from models.critic import save_critic
from models.lora import copy_tokenizer

Commit = Callable[[Path], AbstractContextManager]
"""What a checkpoint's swap-in runs inside (given the final folder); raises to stop it."""


POLICY_NAME = re.compile(r"^policy_(\d{6})$")
"""A checkpoint folder of a run (``flows.prepare.ckpt_dir``): ``policy_NNNNNN`` holds policy version NNNNNN."""


def policy_version(ckpt: str | Path) -> int:
    """The policy version ``ckpt`` holds: its ``trainer_state.json``'s ``policy_version`` (``"policy_000007"`` → 7,
    written by every update), else its folder name ``policy_NNNNNN``, else 0 for a model folder no update wrote (no
    ``trainer_state.json``: the run's start policy). Anything else — a missing folder, a malformed state or
    version, a trainer-written folder that says no version, a name and a state that disagree — is an error naming
    the path. (A run started from another run's checkpoint starts at that checkpoint's version.)"""
    path = Path(ckpt)
    if not path.is_dir():
        raise ValueError(f"{path}: no checkpoint folder there; its policy version cannot be read")
    named = POLICY_NAME.match(path.name)
    state_path = path / "trainer_state.json"
    if not state_path.exists():
        return int(named.group(1)) if named else 0
    try:
        stated = json.loads(state_path.read_text()).get("policy_version")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{state_path}: not a JSON object ({err}); the policy version cannot be read") from err
    if stated is None:
        if named:
            return int(named.group(1))
        raise ValueError(f"{state_path}: no policy_version, and the folder is not named policy_NNNNNN")
    match = POLICY_NAME.match(str(stated))
    if not match:
        raise ValueError(f"{state_path}: policy_version {stated!r} is not of the form policy_NNNNNN")
    if named and named.group(1) != match.group(1):
        raise ValueError(f"{state_path}: policy_version {stated!r} disagrees with the folder's name {path.name!r}")
    return int(match.group(1))


def _tmp_of(out_dir: Path) -> Path:
    return out_dir.with_name(f".{out_dir.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def save_checkpoint(model, src_dir: Path, out_dir: Path, opt=None, extra: dict | None = None, critic=None,
                    commit: Commit = nullcontext) -> Path:
    """Write ``out_dir`` atomically: weights (only the adapter's for a peft model: the base is shared),
    tokenizer files of ``src_dir``, optimizer state.

    A folder being replaced is moved aside first and deleted only after the new one is in place,
    so a crash at any point leaves a complete checkpoint at ``out_dir`` or at ``.<name>.old``.
    """
    out_dir = Path(out_dir)
    tmp = _tmp_of(out_dir)
    model.save_pretrained(tmp)
    copy_tokenizer(src_dir, tmp)
    if opt is not None:
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
    if critic is not None:
        save_critic(critic[0], critic[1], tmp)
    (tmp / "trainer_state.json").write_text(json.dumps({"source": str(src_dir), **(extra or {})}, indent=1))
    return _swap_in(tmp, out_dir, commit)


def copy_checkpoint(src_dir: Path, out_dir: Path, extra: dict | None = None, commit: Commit = nullcontext) -> Path:
    """``out_dir`` = the checkpoint ``src_dir`` unchanged (a step that trained nothing), with a new trainer state."""
    out_dir = Path(out_dir)
    tmp = _tmp_of(out_dir)
    shutil.copytree(src_dir, tmp)
    (tmp / "trainer_state.json").write_text(json.dumps({"source": str(src_dir), **(extra or {})}, indent=1))
    return _swap_in(tmp, out_dir, commit)


def _swap_in(tmp: Path, out_dir: Path, commit: Commit) -> Path:
    """Move ``tmp`` to ``out_dir`` (inside ``commit``); ``tmp`` is removed when ``commit`` refuses."""
    try:
        with commit(out_dir):
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            if out_dir.exists():
                out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
            _clear_leftovers(out_dir, keep=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _clear_leftovers(out_dir: Path, keep: Path) -> None:
    """Remove the temporary folders of ``out_dir`` that crashed or replaced writers left (``.<name>.tmp`` of older
    code, ``.<name>.<pid>-<hex>.tmp`` now). Called inside the commit, where this writer holds the run: any other
    writer of the same folder is dead or fenced, and its half-written copy would never be swapped in."""
    pattern = re.compile(rf"^\.{re.escape(out_dir.name)}(\.\d+-[0-9a-f]{{8}})?\.tmp$")
    for p in out_dir.parent.iterdir():
        if p != keep and pattern.match(p.name):
            shutil.rmtree(p, ignore_errors=True)
