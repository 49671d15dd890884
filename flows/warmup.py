"""Prefect flow ``warmup``: build the tiny model and warm it up by SFT on synthetic transcripts.

Stages: write the SFT corpus (sandbox-checked transcripts with realistic mistakes and fixes)
→ build the tokenizer and the randomly initialised Qwen2 model → SFT on assistant tokens →
a ``save_pretrained`` folder at ``model.path``. Each stage writes files under
``<output_dir>/warmup/`` and is skipped when its output exists.

Run: ``cleaner warmup --config configs/tiny.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import RunConfig, load_config


def _work_dir(cfg: RunConfig) -> Path:
    return Path(cfg.output_dir) / "warmup" / f"seed{cfg.warmup.seed}-n{cfg.warmup.n_transcripts}"


@task(name="sft-corpus", cache_policy=NO_CACHE)
def corpus_task(cfg: RunConfig) -> str:
    from sandbox.base import make_sandbox
    from tasks.synthetic import write_sft_corpus

    path = _work_dir(cfg) / "corpus.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with make_sandbox(cfg.sandbox) as box:
            write_sft_corpus(path, cfg.warmup.n_transcripts, cfg.warmup.seed, cfg.warmup.mistake_share, box,
                             deep_fix_share=cfg.warmup.deep_fix_share)
    return str(path)


@task(name="build-tiny", cache_policy=NO_CACHE)
def build_task(cfg: RunConfig, corpus: str) -> str:
    import json

    from models.tiny import build_tiny

    out = _work_dir(cfg) / "init"
    if not (out / "config.json").exists():
        rows = map(json.loads, Path(corpus).read_text().splitlines())
        build_tiny(out, cfg.tiny, (m["content"] for row in rows for m in row["messages"]))
    return str(out)


@task(name="sft", cache_policy=NO_CACHE)
def sft_task(cfg: RunConfig, init_dir: str, corpus: str) -> dict:
    from models.sft import warmup
    from tasks.synthetic import read_sft_corpus

    transcripts = read_sft_corpus(Path(corpus))
    if not transcripts:
        raise ValueError(f"warm-up corpus {corpus} holds no transcripts")
    return warmup(Path(init_dir), transcripts, cfg.warmup, Path(cfg.model.path))


def build_and_warm(cfg: RunConfig) -> dict:
    corpus = corpus_task(cfg)
    init_dir = build_task(cfg, corpus)
    return sft_task(cfg, init_dir, corpus)


@task(name="env-warmup", cache_policy=NO_CACHE)
def env_warm_task(cfg: RunConfig) -> dict:
    from tasks.envs.warmup import GRID_CHARS, build_env_policy

    tiny = cfg.tiny if cfg.tiny.atomic_chars else cfg.tiny.model_copy(update={"atomic_chars": GRID_CHARS})
    work = Path(cfg.output_dir) / "warmup" / f"env-seed{cfg.env_warmup.seed}"
    return build_env_policy(work, Path(cfg.model.path), cfg.env_warmup, tiny, cfg.warmup)


def build_env_warm(cfg: RunConfig) -> dict:
    """The text-game policy (``model.build: tiny-env``): scripted corpus → tiny model → SFT → measured card."""
    return env_warm_task(cfg)


@flow(name="warmup", log_prints=True)
def warmup_flow(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None) -> dict:
    """Build and warm up the tiny model into ``model.path`` (the text-game one for ``model.build: tiny-env``)."""
    cfg = load_config(config_path, overrides)
    result = build_env_warm(cfg) if cfg.model.build == "tiny-env" else build_and_warm(cfg)
    print(f"warm-up done: {result}")
    return result
