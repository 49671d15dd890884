"""The lines a training run prints: one a step, one an evaluation, and the summary at its end.

    step 3 | reward 0.625 | accuracy 0.625 | first try 0.812 | rollbacks 3 (2 recovered) | loss -3.3e-05 | 11.9 s
    eval policy 5 | pass@1 SAAR off 0.562 (start 0.531) | SAAR on 0.594 (start 0.562) | first try 0.81 (start 0.78)
    held-out pass@1 SAAR off: 0.531 at the start → 0.562 after 10 steps

A step's figures are its training batch's (``rollout/reward_mean``, ``rollout/accuracy``,
``tools/first_attempt_success_rate``, SAAR's rollbacks, ``train/loss``) and its wall time; an evaluation's are the
held-out ones (``eval/<mode>/all/pass_at_1`` SAAR off and on, first-attempt success with SAAR off) beside the
starting policy's (policy 0), when the run evaluated it. An environment run (``env:``) shows its own figures: group
spread and filter counts a step, the success rate an evaluation. Pure formatting: nothing here reads a store.
"""

from __future__ import annotations

import math
from pathlib import Path

PASS_KEY = "eval/{mode}/all/pass_at_1"
FIRST_TRY_KEY = "eval/{mode}/tools/first_attempt_success_rate"
MODES = ("saar_off", "saar_on")
MODE_NAMES = {"saar_off": "SAAR off", "saar_on": "SAAR on"}


def _num(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def step_line(step: int, m: dict, seconds: float | None = None) -> str:
    """One line for training step ``step`` from its metrics ``m`` (and its wall time)."""
    parts = [f"step {step}", f"reward {_num(m.get('rollout/reward_mean'))}", f"accuracy {_num(m.get('rollout/accuracy'))}"]
    if "rollout/in_group_std" in m and "tools/first_attempt_success_rate" not in m:  # an environment run
        parts += [f"group std {_num(m.get('rollout/in_group_std'))}",
                  f"groups kept {_num(m.get('rollout/filter_kept_count'))}", f"entropy {_num(m.get('train/entropy'))}"]
    else:
        parts += [f"first try {_num(m.get('tools/first_attempt_success_rate'))}",
                  f"rollbacks {int(m.get('saar/rollbacks_triggered', 0))} "
                  f"({int(m.get('saar/rollbacks_recovered', 0))} recovered)"]
    if m.get("train/skipped"):
        parts.append(f"no informative groups ({int(m.get('train/no_informative_groups', 0))} dropped)")
    else:
        parts.append(f"loss {_num(m.get('train/loss'))}")
    if seconds is not None:
        parts.append(f"{seconds:.1f} s")
    return " | ".join(parts)


def _with_start(value: float | None, start: float | None) -> str:
    return _num(value) + (f" (start {_num(start)})" if start is not None else "")


def success_key(m: dict) -> str | None:
    """An environment evaluation's held-out success rate (``eval/<env>/success``), when ``m`` has one."""
    return next((k for k in sorted(m) if k.startswith("eval/") and k.endswith("/success") and k.count("/") == 2), None)


def eval_line(version: int, m: dict, start: dict | None = None, policy: str | None = None) -> str:
    """One line for the held-out evaluation of policy ``version`` (metrics ``m``), each figure beside the starting
    policy's (``start``: policy 0's metrics) when there is one and this is not policy 0 itself; ``policy`` names
    the policy instead of its version (``cleaner eval``'s checkpoint or model)."""
    start = start if version else None
    parts = [f"eval {policy}" if policy else f"eval policy {version}" + (" (the starting policy)" * (version == 0))]
    modes = [mode for mode in MODES if PASS_KEY.format(mode=mode) in m]
    for mode in modes:
        key = PASS_KEY.format(mode=mode)
        parts.append(f"pass@1 {MODE_NAMES[mode]} {_with_start(m[key], start.get(key) if start else None)}")
    if modes:
        key = FIRST_TRY_KEY.format(mode=modes[0])
        parts.append(f"first try {_with_start(m.get(key), start.get(key) if start else None)}")
    elif success_key(m):
        key = success_key(m)
        parts.append(f"{key.split('/')[1]} success {_with_start(m[key], start.get(key) if start else None)}")
    if "time/eval_s" in m:
        parts.append(f"{m['time/eval_s']:.1f} s")
    return " | ".join(parts)


def score_of(m: dict) -> tuple[str, float] | None:
    """(what, value) that ranks an evaluated policy, as the registry ranks it: pass@1 SAAR off, else SAAR on, else an
    environment's success rate."""
    for mode in MODES:
        if PASS_KEY.format(mode=mode) in m:
            return f"pass@1 {MODE_NAMES[mode]}", m[PASS_KEY.format(mode=mode)]
    key = success_key(m)
    return (f"{key.split('/')[1]} success", m[key]) if key else None


def _scored(evals: dict[int, dict]) -> dict[int, tuple[str, float]]:
    return {v: score_of(m) for v, m in sorted(evals.items()) if score_of(m) is not None}


def outcome_line(evals: dict[int, dict]) -> str:
    """Start → final held-out score from every evaluation of a run (policy version → metrics); says so when the
    run evaluated nothing."""
    scored = _scored(evals)
    if not scored:
        return "held-out evaluation: none in this run (train.eval_every=0)"
    what = next(iter(scored.values()))[0]
    first, last = min(scored), max(scored)
    text = f"held-out {what}: "
    if first == 0 and last:
        text += f"{_num(scored[0][1])} at the start → "
    return text + f"{_num(scored[last][1])} " + ("at the start" if last == 0 else f"after {last} step{'s' * (last > 1)}")


def best_policy(evals: dict[int, dict]) -> tuple[int, str, float] | None:
    """(version, what, score) of the best evaluated policy: the highest score, the newest of a tie (the registry's
    rule for ``@best``); None when the run evaluated nothing."""
    scored = _scored(evals)
    if not scored:
        return None
    best = max(scored, key=lambda v: (scored[v][1], v))
    return best, *scored[best]


def duration(seconds: float) -> str:
    """``95.2`` → ``1 min 35 s``; under a minute ``42 s``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def best_checkpoint_line(result: dict, model_name: str) -> str | None:
    """Where the run's best evaluated policy is: its checkpoint folder (unless pruned: ``train.keep_checkpoints``)
    and its registered version when the run registered (``models:/<name>/<version>``)."""
    best = best_policy(result.get("evaluations") or {})
    if best is None:
        return None
    version, what, score = best
    folder = Path(result["start_ckpt"]) if version == 0 else Path(result["run_dir"]) / "checkpoints" / f"policy_{version:06d}"
    where = [str(folder) if folder.exists() else "its folder pruned (train.keep_checkpoints); a logged model of the run"]
    registered = result.get("registered") or {}
    if registered.get("run_best"):
        where.append(f"models:/{model_name}/{registered['run_best']}"
                     + (f" (@best is version {registered['best']})" if registered.get("best") else ""))
    return f"best checkpoint: policy {version} ({what} {_num(score)}): " + " | ".join(where)


def train_summary(result: dict, model_name: str, seconds: float) -> str:
    """The lines a finished training command prints: the run, its wall time, start → final held-out score, the best
    checkpoint."""
    lines = [f"run {result['run_id']} finished in {duration(seconds)}; final checkpoint {result['final_checkpoint']}",
             outcome_line(result.get("evaluations") or {})]
    best = best_checkpoint_line(result, model_name)
    return "\n".join([*lines, *([best] if best else [])])
