"""Benchmark: one RL step with the SGLang HTTP engine vs the in-process engine (bar: HTTP <= 1.3x).

What: ``bench_engines(model_path, work_dir)`` runs the same RL steps — rollout (with the weight
sync), score, mix, advantage, update, through the plain stage functions of ``tasks.training.stages`` (no
Prefect, no stores) — with ``engine.kind=transformers`` and with ``engine.kind=sglang``, step by
step in turn so a change of machine load hits both alike; the latter talks to the CPU test server
(``models.sglang_test_server``, started on a free loopback port, stopped by its process group).
It prints and returns the median step time of each (robust to load spikes from other processes
on a shared machine), their ratio, and the rollout time per generated token (the two engines
sample different tokens, so the per-token figure is the fairer one for the rollout alone).

Simplifies: one seed, the tiny model, one torch thread for both sides; the first step of each
engine is a warm-up (model load, first sandbox) and is left out when ``steps`` > 1.
Run: ``python -c "from tasks.training.bench_engines import bench_engines; bench_engines('assets/tiny-warm', '/tmp/bench')"``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path


def _configs(work: Path, steps: int, prompts: int, n_samples: int, max_new_tokens: int, seed: int) -> dict:
    from models.config import TrainerConfig
    from sandbox.config import SandboxConfig
    from tasks.data.config import DataConfig
    from tasks.data.loader import ensure_files
    from tasks.rewards.config import RewardConfig, ScoreConfig
    from tasks.rollout.config import RolloutConfig
    from tasks.training.config import MixConfig

    data = DataConfig(train_path=str(work / "train.parquet"), eval_path=str(work / "eval.parquet"),
                      n_train=max(64, prompts * steps), n_eval=8, prompts_per_step=prompts, seed=seed)
    ensure_files(data)
    return {"data": data, "rollout": RolloutConfig(n_samples=n_samples, max_new_tokens=max_new_tokens,
                                                   max_response_tokens=4 * max_new_tokens),
            "sandbox": SandboxConfig(backend="local", workers=2), "reward": RewardConfig(), "score": ScoreConfig(),
            "mix": MixConfig(), "trainer": TrainerConfig(), "seed": seed}


def _one_step(kind: str, urls: list[str], ckpt: str, step: int, work: Path, c: dict) -> tuple[float, float, int, str]:
    """One RL step with engine ``kind``: (step seconds, rollout seconds, generated tokens, next checkpoint)."""
    from models.config import ChatConfig, EngineConfig
    from tasks.training import stages
    from tasks.training.setups import AdvantageSetup, MixSetup, RolloutSetup, ScoreSetup, UpdateSetup

    folder = work / kind / "steps" / f"{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    data, rollout, sandbox, reward = c["data"], c["rollout"], c["sandbox"], c["reward"]
    roll = RolloutSetup(seed=c["seed"], chat=ChatConfig(), train_path=data.train_path,
                        prompts_per_step=data.prompts_per_step, refill_rounds=data.refill_rounds, rollout=rollout,
                        engine=EngineConfig(kind=kind, server_urls=urls), sandbox=sandbox, reward=reward)
    t0 = time.perf_counter()
    stages.rollout_stage(folder, step, ckpt, kind, roll)
    stages.score_stage(folder, ScoreSetup(reward=reward, score=c["score"],
                                          max_response_tokens=rollout.max_response_tokens, sandbox=sandbox))
    stages.mix_stage(folder, MixSetup(mix=c["mix"], mini_batches=c["trainer"].mini_batches))
    stages.advantage_stage(folder, AdvantageSetup(mix=c["mix"]))
    out = work / kind / "checkpoints" / f"policy_{step + 1:06d}"
    ckpt = str(stages.update_stage(folder, ckpt, out, UpdateSetup(trainer=c["trainer"], seed=c["seed"])))
    elapsed = time.perf_counter() - t0
    rollout_s = json.loads((folder / "rollout.metrics.json").read_text())["time/rollout_s"]
    return elapsed, rollout_s, _generated_tokens(folder), ckpt


def _summary(rows: list[tuple[float, float, int]], steps: int) -> dict:
    timed = rows[1:] if steps > 1 else rows
    rollout_s, tokens = sum(r[1] for r in timed), sum(r[2] for r in timed)
    return {"step_s": statistics.median(r[0] for r in timed), "steps_s": [r[0] for r in rows],
            "rollout_s": rollout_s / len(timed), "rollout_ms_per_token": 1000 * rollout_s / max(tokens, 1),
            "generated_tokens": tokens}


def _generated_tokens(folder: Path) -> int:
    from tasks.stores.records import read_table

    df = read_table(folder, "trajectories")
    return int(sum(sum(mask) for mask in df["response_mask"].to_list()))


def bench_engines(model_path: str | Path, work_dir: str | Path, steps: int = 6, prompts: int = 4, n_samples: int = 8,
                  max_new_tokens: int = 64, seed: int = 0, threads: int = 1, echo=print) -> dict:
    """Median RL-step time in-process vs through HTTP with the same configs; prints and returns the figures."""
    import torch

    from models.sglang_test_server import start_test_server, stop_server
    from tasks.training import live

    torch.set_num_threads(threads)
    work = Path(work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    c = _configs(work, steps, prompts, n_samples, max_new_tokens, seed)
    rows: dict[str, list] = {"transformers": [], "sglang": []}
    ckpts = {kind: str(model_path) for kind in rows}
    proc, url = start_test_server(model_path, threads=threads, log_path=work / "server.log")
    try:
        for step in range(steps):
            for kind, urls in (("transformers", []), ("sglang", [url])):
                *row, ckpts[kind] = _one_step(kind, urls, ckpts[kind], step, work, c)
                rows[kind].append(row)
    finally:
        stop_server(proc)
        live.close_live()
    results = {kind: _summary(r, steps) for kind, r in rows.items()}
    results["ratio_step"] = results["sglang"]["step_s"] / results["transformers"]["step_s"]
    results["ratio_rollout_per_token"] = (results["sglang"]["rollout_ms_per_token"]
                                          / results["transformers"]["rollout_ms_per_token"])
    for kind in ("transformers", "sglang"):
        r = results[kind]
        every = ", ".join(f"{t:.2f}" for t in r["steps_s"])
        echo(f"{kind:>12}: step {r['step_s']:.2f}s (steps {every}s; rollout {r['rollout_s']:.2f}s, "
             f"{r['generated_tokens']} tokens, {r['rollout_ms_per_token']:.2f} ms/token)")
    echo(f"HTTP / in-process: step {results['ratio_step']:.2f}x, rollout per token "
         f"{results['ratio_rollout_per_token']:.2f}x (bar: step <= 1.3x)")
    return results
