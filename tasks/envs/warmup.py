"""Warm-up checkpoint for text games: scripted episodes → tiny tokenizer + model → SFT → measured.

Stages (each skipped when its output exists under ``work_dir``)::

    corpus.jsonl   scripted episodes per game (``tasks.envs.solver``; ``explore`` share of random turns;
                   FrozenLake's grid-reading teacher ``tasks.envs.lake_teacher`` when ``lake_teacher`` is set)
    init/          ``models.tiny.build_tiny`` on the corpus text, grid symbols kept one token per cell
                   (or ``cfg.base``: an existing checkpoint, its tokenizer kept, fine-tuned further)
    out_dir        SFT on assistant tokens (``models.sft.train_loop`` with ``EnvChat`` ids: exactly the
                   rollout's ids, forced ``<think>`` and observations masked)
    card.json      held-out figures per game: valid-action rate, success, Bandit's hi-arm rate

The result is a policy that answers in RAGEN's format with valid actions but plays no better
than its noisy teacher — the starting point of environment RL.

Run: ``build_env_policy(Path("runs/env-warmup"), Path("assets/tiny-env"), EnvWarmupConfig(),
TinyModelConfig(atomic_chars=GRID_CHARS), WarmupConfig(max_len=1024, batch_size=8, max_steps=1500))``.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from models.config import TinyModelConfig, WarmupConfig
from tasks.envs.config import EnvWarmupConfig, env_config
from tasks.envs.lake_teacher import grid_lake_turn
from tasks.envs.solver import read_corpus, write_corpus

GRID_CHARS = "_#OXPSG√\n"
"""Grid symbols of FrozenLake and Sokoban (and the row break): BPE never merges them with each other."""


def write_env_corpus(path: Path, cfg: EnvWarmupConfig) -> dict[str, dict[str, float]]:
    """All games' scripted episodes in one JSONL file; per-game teacher success and score."""
    parts, summary = [], {}
    for name, n in cfg.episodes.items():
        part = path.with_name(f".{path.stem}-{name}.jsonl")
        experts, explore, per_turn = {}, cfg.explore, cfg.actions_per_turn
        if name == "frozen_lake" and cfg.lake_teacher is not None:
            experts = {name: partial(grid_lake_turn, cfg=cfg.lake_teacher)}
            explore, per_turn = 0.0, {**per_turn, name: cfg.lake_teacher.max_actions}
        summary.update(write_corpus(part, [env_config(name)], n, cfg.seed, explore, per_turn, experts))
        parts.append(part)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        for part in parts:
            fh.write(part.read_text())
            part.unlink()
    tmp.replace(path)
    return summary


def sft_env(init_dir: Path, transcripts: list[list[dict]], cfg: WarmupConfig, out_dir: Path) -> dict:
    """SFT the model at ``init_dir`` on environment transcripts; save to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.sft import save_atomic, train_loop
    from tasks.envs.tokens import EnvChat

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    result = train_loop(model, EnvChat(tokenizer), transcripts, cfg)
    model.eval()
    save_atomic(model, tokenizer, out_dir)
    return result


def build_env_policy(work_dir: Path, out_dir: Path, cfg: EnvWarmupConfig, tiny: TinyModelConfig,
                     sft: WarmupConfig) -> dict:
    """Run the stages above; returns the card: teacher figures, SFT result, measured figures."""
    from models.tiny import build_tiny
    from tasks.envs.evaluate import evaluate_env

    work_dir.mkdir(parents=True, exist_ok=True)
    corpus, card_path = work_dir / "corpus.jsonl", work_dir / "card.json"
    init = Path(cfg.base) if cfg.base else work_dir / "init"
    if cfg.base and not (init / "config.json").exists():
        raise FileNotFoundError(f"env_warmup.base: no checkpoint at {init}")
    card = json.loads(card_path.read_text()) if card_path.exists() else {}
    if not corpus.exists():
        card["teacher"] = write_env_corpus(corpus, cfg)
    rows = read_corpus(corpus)
    if not (init / "config.json").exists():
        build_tiny(init, tiny, (m["content"] for row in rows[::4] for m in row["messages"]))
    if not (out_dir / "config.json").exists():
        card["sft"] = sft_env(init, [row["messages"] for row in rows], sft, out_dir)
    card_path.write_text(json.dumps(card, indent=1))
    card["measured"] = {name: evaluate_env(out_dir, env_config(name), cfg.eval_states, cfg.eval_samples, seed=cfg.seed)
                        for name in cfg.episodes}
    card["config"] = {"warmup": cfg.model_dump(), "tiny": tiny.model_dump(), "sft": sft.model_dump()}
    card_path.write_text(json.dumps(card, indent=1))
    return card
