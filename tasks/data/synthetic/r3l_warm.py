"""Teach a warmed-up tiny policy to reflect: a short SFT on a corpus rich in R3L transcripts.

``assets/tiny-r3l`` (the policy of the tiny R3L runs, ``docs/methods.md``) is ``assets/tiny-warm``
fine-tuned by this module: a fresh corpus of the current generator (``tasks.data.synthetic``,
``sft`` questions only) in which about half the solving transcripts also get a reflection with the
right diagnosis and half the imperfect ones a guided retry (``R3LWarm.mix``), framed and tokenised as
the warm-up does (``models.sft.warmup``, loss on assistant turns). The solving transcripts stay in
the mix so the policy keeps solving. Simplifies: one stage, no gate (run ``cleaner warmup-gate``
on the result to measure it).

Run: ``python -m tasks.data.synthetic.r3l_warm --out assets/tiny-r3l`` (see ``R3LWarm`` for the knobs).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import typer

from models.config import ChatConfig, WarmupConfig
from tasks.data.synthetic import CorpusMix


@dataclass
class R3LWarm:
    init: str = "assets/tiny-warm"
    transcripts: int = 4000
    seed: int = 2
    mix: CorpusMix = CorpusMix(mistake_share=0.72, reflect_share=0.5, retry_share=0.5)
    sft: WarmupConfig = field(default_factory=lambda: WarmupConfig(
        lr=1e-3, min_lr=1e-4, warmup_steps=20, decay_start=0.5, max_steps=500, time_budget_s=1800,
        max_len=512, checkpoint_every=50, seed=2))


def run(out: Path, work: Path, spec: R3LWarm = R3LWarm()) -> dict:
    """Write the corpus into ``work`` (kept when present), fine-tune ``spec.init`` on it, save to ``out``."""
    from models.sft import warmup
    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig
    from tasks.data.synthetic import read_sft_corpus, read_sft_types, write_sft_corpus

    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        with make_sandbox(SandboxConfig(backend="local", workers=2)) as box:
            write_sft_corpus(corpus, spec.transcripts, spec.seed, box, spec.mix)
    load = os.getloadavg()[0]
    result = warmup(Path(spec.init), read_sft_corpus(corpus), spec.sft, out, ChatConfig(),
                    state_dir=work / "sft-state", kinds=read_sft_types(corpus))
    result.update(load_start=load, load_end=os.getloadavg()[0], init=spec.init, corpus_seed=spec.seed,
                  transcripts=spec.transcripts, mix=asdict(spec.mix))
    (work / "result.json").write_text(json.dumps(result, indent=2))
    return result


def main(out: Path = typer.Option(Path("assets/tiny-r3l")), work: Path = typer.Option(Path("runs/r3l-warm"))) -> None:
    result = run(out, work)
    print(json.dumps({k: v for k, v in result.items() if k != "loss_curve"}, indent=2))


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    typer.run(main)
