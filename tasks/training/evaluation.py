"""Evaluation: roll a policy out on held-out prompts with SAAR off and on, and grade it.

With SAAR **off** the numbers say what the policy does on its own — CLEANER's claim is that
accuracy holds there (internalisation): pass@1 and pass@k (overall and by data source),
first-attempt tool success, failures counted per failure, mean turns and tokens, and the
share of trajectories containing an error-and-retry loop. With SAAR **on** (raw share 0)
they add how often the policy fixes a failed call once it sees the error
(``saar/global_recovery_rate``). What a failed call costs — first-call success per trajectory, the share cut at
the turn cap, P(correct | every call clean) — is ``tasks.training.eval_measures``'s. Metric names are prefixed
``eval/<mode>/``.

pass@k counts every attempted trajectory: one the grader could not grade (an infrastructure failure
that outlived its retries, a malformed ground truth) counts as a failure, so the denominator never
shrinks; ``eval/grader_errors`` (beside ``eval/graded``) says how many there were.

``evaluate_fresh``: the same evaluation on the fresh split (``data.fresh_path``, a run's last evaluation only),
its metrics named ``eval_fresh/<mode>/``.
Both modes in one pass (``eval.shared_pass``, the default): a trajectory's SAAR-off and SAAR-on rollouts are the
same until its first failed call SAAR acts on, and each turn's draws are the trajectory's own, so
``tasks.rollout.paired`` rolls SAAR on out once and forks the SAAR-off twin at that failure: the same
trajectories, token for token, as two separate passes with the same seed (``tests/test_paired_eval.py``), the
shared turns decoded and executed once. The figures are the ones the two separate passes gave — the same draws,
not only the same distribution — up to a token that batch-shape float noise flips at a near-tie (as between any two
runs of the continuous driver). Rounds scheduling or an engine that samples on its own (SGLang) runs the two passes.
"""

from __future__ import annotations

import polars as pl

from tasks.rewards.config import ScoreConfig
from tasks.rewards.registry import pass_at_k_by_source
from tasks.rewards.scoring import score_rows
from tasks.rollout.config import RolloutConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.paired import PairedRollout, shares_work
from tasks.rollout.saar import aggregate_stats
from tasks.rollout.types import PromptItem, Trajectory
from tasks.stores.records import trajectory_frames
from tasks.training import eval_measures
from tasks.training.live import get_chat, get_engine, get_sandbox
from tasks.training.setups import EvalSetup


def summarize(trajs: pl.DataFrame, stats: dict[str, float], ks: list[int]) -> dict[str, float]:
    """Evaluation metrics of one mode from the scored trajectories table and the SAAR statistics."""
    graded = trajs.filter(pl.col("graded"))
    # every attempted trajectory counts: one that could not be graded is no success (never a smaller n)
    correct = (trajs["graded"].fill_null(False) & trajs["correct"].fill_null(False)).to_list()
    records = list(zip(trajs["data_source"], trajs["prompt_id"], correct))
    by_source = pass_at_k_by_source(records, tuple(ks))
    overall = pass_at_k_by_source([("all", p, c) for _, p, c in records], tuple(ks))
    out = {**stats, **_mlflow_names(overall), **{f"by_source/{k}": v for k, v in _mlflow_names(by_source).items()}}
    out["tools/first_attempt_failure_rate"] = (1.0 - stats["tools/first_attempt_success_rate"]
                                              if stats["tools/first_attempt_total"] else 0.0)
    out["rollout/tool_use_rate"] = float((trajs["tool_calls"] > 0).mean()) if trajs.height else 0.0
    out["rollout/response_tokens_mean"] = float(trajs["response_ids"].list.len().mean() or 0.0)
    out["rollout/turns_mean"] = float(trajs["num_turns"].mean() or 0.0)
    out["eval/graded"] = graded.height
    out["eval/grader_errors"] = trajs.height - graded.height
    return out


def _mlflow_names(metrics: dict[str, float]) -> dict[str, float]:
    """``pass@k`` → ``pass_at_k``: MLflow metric names may not contain ``@``."""
    return {k.replace("@", "_at_"): v for k, v in metrics.items()}


def rollout_config(setup: EvalSetup, mode: str) -> RolloutConfig:
    """The rollout of evaluation mode ``mode``: SAAR on (raw share 0) or off, ``eval.samples`` per prompt."""
    saar = setup.rollout.saar.model_copy(update={"enabled": mode == "saar_on", "raw_share": 0.0})
    return setup.rollout.model_copy(update={"saar": saar, "n_samples": setup.eval.samples})


def _live(ckpt: str, setup: EvalSetup):
    """The chat format, engine (at the evaluation's temperature) and sandbox of this process."""
    chat = get_chat(ckpt, setup.chat)
    engine = get_engine(setup.engine.model_copy(update={"temperature": setup.eval.temperature}), ckpt, chat)
    return chat, engine, get_sandbox(setup.sandbox)


def _grading(ckpt: str, setup: EvalSetup):
    """The chat format and sandbox that grade this process's trajectories (no engine: grading samples nothing)."""
    return get_chat(ckpt, setup.chat), get_sandbox(setup.sandbox)


def grade(trajs: list[Trajectory], setup: EvalSetup, roll_cfg: RolloutConfig, chat,
          box) -> tuple[dict[str, float], dict[str, pl.DataFrame]]:
    """Metrics of one mode's trajectories and its tables (``trajectories`` joined with their scores,
    ``executions``, ``saar_events``)."""
    frames = trajectory_frames(trajs, "eval", 0, chat.decode)
    scores, _ = score_rows(frames["trajectories"], setup.reward, ScoreConfig(), roll_cfg.max_response_tokens, box,
                           frames["executions"])
    scored = frames["trajectories"].join(scores, on=["run_id", "step", "traj_id"])
    stats = aggregate_stats([t.stats for t in trajs], [t.raw for t in trajs])
    metrics = {**summarize(scored, stats, setup.eval.ks), **eval_measures.measures(scored, frames["executions"])}
    return metrics, {**frames, "trajectories": scored}


def roll_mode(ckpt: str, items: list[PromptItem], setup: EvalSetup, mode: str) -> list[Trajectory]:
    """The trajectories of one mode (``saar_off`` / ``saar_on``) rolled out alone."""
    chat, engine, box = _live(ckpt, setup)
    return Rollout(rollout_config(setup, mode), engine, chat, box).run(items, setup.seed, step=0, progress=False)


def roll_pair(ckpt: str, items: list[PromptItem], setup: EvalSetup) -> dict[str, list[Trajectory]] | None:
    """Both modes' trajectories from one paired pass (``tasks.rollout.paired``), or None where the engine or the
    scheduling cannot share it."""
    roll_cfg = rollout_config(setup, "saar_on")
    chat, engine, box = _live(ckpt, setup)
    if not shares_work(roll_cfg.scheduling, engine):
        return None
    off, on = PairedRollout(roll_cfg, engine, chat, box).run_pair(items, setup.seed, step=0)
    return {"saar_off": off, "saar_on": on}


def roll_modes(ckpt: str, items: list[PromptItem], setup: EvalSetup) -> dict[str, list[Trajectory]]:
    """Every mode's trajectories, in ``items``' order: one paired pass when ``eval.shared_pass`` and the engine
    allow it, else a rollout per mode. A prompt's trajectories are its own (each turn seeded by the trajectory,
    ``models.decode``), so rolling ``items`` in parts and joining them gives the same tokens
    (``tasks.training.eval_shards``)."""
    modes = setup.eval.modes
    paired = (roll_pair(ckpt, items, setup)
              if setup.eval.shared_pass and sorted(set(modes)) == ["saar_off", "saar_on"] else None)
    return paired or {mode: roll_mode(ckpt, items, setup, mode) for mode in modes}


def evaluate_mode(ckpt: str, items: list[PromptItem], setup: EvalSetup,
                  mode: str) -> tuple[dict[str, float], dict[str, pl.DataFrame]]:
    """Metrics of one mode (``saar_off`` / ``saar_on``) rolled out alone, and its tables (see ``grade``)."""
    chat, box = _grading(ckpt, setup)
    return grade(roll_mode(ckpt, items, setup, mode), setup, rollout_config(setup, mode), chat, box)


def evaluate_pair(ckpt: str, items: list[PromptItem],
                  setup: EvalSetup) -> dict[str, tuple[dict[str, float], dict[str, pl.DataFrame]]] | None:
    """Both modes from one paired pass (``tasks.rollout.paired``), or None where the engine or the scheduling
    cannot share it (then each mode is rolled out alone)."""
    pair = roll_pair(ckpt, items, setup)
    return None if pair is None else grade_modes(ckpt, setup, pair)


def grade_modes(ckpt: str, setup: EvalSetup,
                rolled: dict[str, list[Trajectory]]) -> dict[str, tuple[dict[str, float], dict[str, pl.DataFrame]]]:
    """Each mode's metrics and tables (``grade``) from its trajectories."""
    chat, box = _grading(ckpt, setup)
    return {mode: grade(trajs, setup, rollout_config(setup, mode), chat, box) for mode, trajs in rolled.items()}


def evaluate(ckpt: str, items: list[PromptItem], setup: EvalSetup, on_mode=None,
             rolled: dict[str, list[Trajectory]] | None = None) -> dict[str, float]:
    """``eval/<mode>/<metric>`` for every mode of ``setup.eval``; ``on_mode(mode, tables)`` sees each mode's tables.
    The trajectories are ``rolled`` (``roll_modes``'s, rolled elsewhere) or rolled out here (``roll_modes``)."""
    graded = grade_modes(ckpt, setup, rolled if rolled is not None else roll_modes(ckpt, items, setup))
    out: dict[str, float] = {}
    for mode in setup.eval.modes:
        metrics, tables = graded[mode]
        out.update({f"eval/{mode}/{k}": v for k, v in metrics.items()})
        if on_mode is not None:
            on_mode(mode, tables)
    return out


FRESH = "eval_fresh"
"""Prefix of the fresh split's metrics (``eval_fresh/<mode>/<metric>``)."""


def fresh_split(setup: EvalSetup) -> tuple[list[PromptItem], EvalSetup]:
    """The fresh split's prompts (``setup.fresh_path``'s first ``eval.fresh_prompts``, all by default) and the setup
    that evaluates them (``eval.fresh_samples`` samples, default: the evaluation's)."""
    from tasks.data.loader import load_prompts

    cfg = setup.eval
    items = list(load_prompts(setup.fresh_path))
    n = cfg.fresh_prompts or len(items)
    if n > len(items):
        raise ValueError(f"eval.fresh_prompts={n}: {setup.fresh_path} holds only {len(items)} prompts")
    fresh = setup.model_copy(update={"eval": cfg.model_copy(update={"n_prompts": n,
                                                                     "samples": cfg.fresh_samples or cfg.samples})})
    return items[:n], fresh


def evaluate_fresh(ckpt: str, setup: EvalSetup, rolled: dict[str, list[Trajectory]] | None = None) -> dict[str, float]:
    """``evaluate`` on the fresh split (``fresh_split``), every mode, from ``rolled`` when given; metrics
    ``eval_fresh/<mode>/…``."""
    items, fresh = fresh_split(setup)
    return {FRESH + k[len("eval"):]: v for k, v in evaluate(ckpt, items, fresh, rolled=rolled).items()}
