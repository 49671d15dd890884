"""What a grader reads of a trajectory besides its decoded text: its structured turns and the executions that ran.

A response's text is decoded tokens, and a policy can write any text — the frame of a tool response, and the end
of a turn too: ``<|im_end|>`` spelled with ordinary tokens (4 in the tiny model's tokenizer) decodes to the same
characters as the end-of-turn id. So a grader that must know where turns end, or what a call printed, reads this
record, built from the trajectory's own fields, never the text::

    extra_info["rollout"] = {
        "turns": [{"role": "assistant" | "tool" | ..., "content": str}, ...],
        "executions": [{"position": int, "attempt": int, "code": str | None, "ok": bool, "stdout": str}, ...],
    }

``turns`` are the response's messages as the rollout appended them (``Trajectory.messages`` after the prompt: one
assistant message per assistant turn, whatever its text holds — a turn ends on the end-of-turn id the engine
stopped on, so text that merely looks like a boundary stays inside its turn); ``executions`` are every sandbox
execution the rollout recorded (``Trajectory.executions``, SAAR's failed attempts included): ``position`` is the
assistant turn (from 0) whose call it ran, ``attempt`` the SAAR retry (0 first), ``stdout`` what it printed.
The rollout-stage grade, the score stage (from the step's ``trajectories`` and ``executions`` tables), the gates
and the verl agent loop (through ``extra_fields``, which verl merges into ``extra_info``) all pass it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ROLLOUT = "rollout"
"""The ``extra_info`` key of the record."""


@dataclass(frozen=True)
class Ran:
    """One recorded execution."""

    position: int
    attempt: int
    code: str | None
    ok: bool
    stdout: str


def response_turns(messages: list[dict], num_turns: int) -> list[dict]:
    """The response's messages of a conversation: from its ``num_turns``-th last assistant message on (the prompt's
    few-shot assistant turns come before it)."""
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if num_turns < 0 or len(starts) < num_turns:
        raise ValueError(f"{num_turns} assistant turns claimed, {len(starts)} assistant messages recorded")
    return [{"role": m["role"], "content": m["content"]} for m in messages[starts[-num_turns]:]] if num_turns else []


def record(messages: list[dict], num_turns: int, executions: list[dict]) -> dict:
    """The record of a trajectory's messages, its assistant-turn count and its execution rows."""
    runs = [{"position": int(e["position"]), "attempt": int(e["attempt"]), "code": e["code"], "ok": bool(e["ok"]),
             "stdout": e["stdout"] or ""} for e in executions]
    return {"turns": response_turns(messages, num_turns), "executions": runs}


def trajectory_info(t) -> dict:
    """A rollout ``Trajectory``'s ``extra_info`` for grading: its prompt's ``extra_info`` plus its record."""
    runs = [{"position": e.position, "attempt": e.attempt, "code": e.code, "ok": e.result.ok,
             "stdout": e.result.stdout} for e in t.executions]
    return {**(t.item.extra_info or {}), ROLLOUT: record(t.messages, t.assistant_turns, runs)}


def row_info(row: dict, executions: list[dict]) -> dict:
    """The same from a ``trajectories`` table row (``messages`` JSON, ``num_turns``, ``extra_info`` JSON when the
    table has it) and that trajectory's ``executions`` rows in ``exec_idx`` order."""
    extra = json.loads(row["extra_info"]) if row.get("extra_info") else {}
    return {**extra, ROLLOUT: record(json.loads(row["messages"]), int(row["num_turns"]), executions)}


def read_record(extra_info: dict | None, grader: str) -> tuple[list[dict], list[Ran]]:
    """``(turns, executions)`` of ``extra_info``'s record; a missing or malformed one is an error naming the field."""
    rec = (extra_info or {}).get(ROLLOUT)
    if not isinstance(rec, dict) or not isinstance(rec.get("turns"), list) or not isinstance(rec.get("executions"), list):
        raise ValueError(f"{grader}: extra_info[{ROLLOUT!r}] (the trajectory's turns and executions, "
                         "tasks.rewards.record) is missing or malformed; this grader never reads the decoded text")
    try:
        runs = [Ran(int(e["position"]), int(e["attempt"]), e["code"], bool(e["ok"]), str(e["stdout"] or ""))
                for e in rec["executions"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{grader}: extra_info[{ROLLOUT!r}]['executions']: a row is malformed ({err!r})") from err
    return rec["turns"], runs
