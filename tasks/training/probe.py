"""Fixed-probe entropy: the same policy tokens scored by every checkpoint, so arms compare like for like.

``train/entropy`` is measured over each run's own trained tokens, a different set per arm (CLEANER's
spliced fixes, DAPO's kept failed calls): at step 0, where the policies are identical, it differed ×1.23
between arms. The probe fixes the token set instead:

* ``build_probe``: the starting policy rolls out the first ``n_prompts`` held-out prompts once each with SAAR off
  (seeded), and its own tokens (mask 1) are the probe, saved as Parquet (``prompt_ids``, ``response_ids``,
  ``response_mask``) in the compare folder — written once, reused by a resumed compare;
* ``probe_entropy``: a checkpoint's mean next-token entropy (nats) over the probe's tokens, teacher-forced
  (``models.forward.response_logprobs_entropy``).

The compare scores each run's final checkpoint (``final_checkpoint``) and reports it per arm and paired by seed.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from models.forward import response_logprobs_entropy
from models.trainer import Sample
from tasks.data.loader import load_prompts
from tasks.rollout.machine import Rollout
from tasks.training.live import get_chat, get_engine, get_sandbox
from tasks.training.setups import EvalSetup

PROBE_FILE = "probe.parquet"


def build_probe(ckpt: str, setup: EvalSetup, n_prompts: int, path: Path) -> pl.DataFrame:
    """The probe at ``path``, rolled out by ``ckpt`` (SAAR off, one sample per prompt) when the file is missing."""
    path = Path(path)
    if path.exists():
        return pl.read_parquet(path)
    items = list(load_prompts(setup.eval_path))[:n_prompts]
    saar = setup.rollout.saar.model_copy(update={"enabled": False, "raw_share": 0.0})
    roll_cfg = setup.rollout.model_copy(update={"saar": saar, "n_samples": 1})
    chat = get_chat(ckpt, setup.chat)
    runner = Rollout(roll_cfg, get_engine(setup.engine.model_copy(update={"temperature": setup.eval.temperature}),
                                          ckpt, chat), chat, get_sandbox(setup.sandbox))
    trajs = runner.run(items, setup.seed, step=0, progress=False)
    df = pl.DataFrame({"prompt_ids": [t.prompt_ids for t in trajs], "response_ids": [t.response_ids for t in trajs],
                       "response_mask": [t.response_mask for t in trajs]},
                      schema={"prompt_ids": pl.List(pl.Int32), "response_ids": pl.List(pl.Int32),
                              "response_mask": pl.List(pl.Int8)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    df.write_parquet(tmp)
    tmp.replace(path)
    return df


def probe_entropy(ckpt: str | Path, probe: pl.DataFrame, micro_batch: int = 16) -> dict[str, float]:
    """``entropy``: mean next-token entropy of ``ckpt`` over the probe's mask-1 tokens; ``tokens``: how many."""
    import torch

    from models.engine import load_causal_lm

    samples = [Sample(list(p), list(r), list(m), 0.0)
               for p, r, m in zip(probe["prompt_ids"], probe["response_ids"], probe["response_mask"]) if sum(m)]
    if not samples:
        raise ValueError("the probe holds no policy token (every response mask is 0)")
    model = load_causal_lm(Path(ckpt), "cpu")
    model.eval()
    pad = get_chat(str(ckpt), None).tokenizer.pad_token_id or 0
    total = tokens = 0.0
    with torch.no_grad():
        for lo in range(0, len(samples), micro_batch):
            _, mask, ent = response_logprobs_entropy(model, samples[lo: lo + micro_batch], pad)
            total += float((ent * mask).sum())
            tokens += float(mask.sum())
    return {"entropy": total / tokens, "tokens": tokens}


def final_checkpoint(run_dir: Path) -> Path:
    """The last policy checkpoint a finished run kept (``checkpoints/policy_<version>``)."""
    folders = sorted((Path(run_dir) / "checkpoints").glob("policy_??????"))
    if not folders:
        raise FileNotFoundError(f"{run_dir}/checkpoints holds no policy_<version> folder: the run has not trained")
    return folders[-1]
