"""Run the turn-budget gate (``tasks.training.turn_gate``) on a config's policy and print its JSON.

``python -m flows.turn_gate --config configs/tiny.yaml --set rollout.max_turns=2 --skip 128 --prompts 128``
rolls ``model.path`` out on held-out prompts 128..255 × ``eval.samples`` (SAAR off and on) and prints, per
mode, the share of trajectories that answer in turn 2; ``--out FILE`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.config import load_config
from tasks.data.loader import ensure_files
from tasks.training.turn_gate import turn_gate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--skip", type=int, default=128, help="held-out prompts skipped (the compare's eval set)")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--threshold", type=float, default=0.8,
                        help="pass: share answered in turn 2 after a clean first call, SAAR off")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    ensure_files(cfg.data)
    result = turn_gate(cfg.model.path, cfg.setups().eval, args.skip, args.prompts)
    result["gate"] = {"threshold": args.threshold, "max_turns": cfg.rollout.max_turns,
                      "samples": cfg.eval.samples, "skip": args.skip, "prompts": args.prompts,
                      "passed": result["saar_off"]["answered_after_ok_call"] >= args.threshold}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    main()
