"""Run the multi-call regime's gate (``tasks.training.chain_gate``) on a config's policy: figures and pass/fail.

``python -m flows.chain_gate --config configs/regimes/multicall.yaml [--model DIR] [--out FILE]`` rolls the policy
out with SAAR off on held-out chains ``skip .. skip + prompts`` × ``samples`` (default 128..199 × 4 = 288
trajectories), each with its turn budget (calls + 1), prints every measure beside its bar and the verdict, and
with ``--out`` writes the JSON. Exit status 0 when the gate passes, 1 when it does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flows.config import load_config
from tasks.data.loader import ensure_files
from tasks.training.chain_gate import run_chain_gate
from tasks.training.config import ChainGateConfig

BARS = {"trajectories": "≥ {min_trajectories}", "next_step_after_clean": "≥ {next_step}",
        "binds_previous": "≥ {binds}", "call_failure_rate": "{call_failure[0]}–{call_failure[1]}",
        "p_correct_all_clean": "{p_correct_clean[0]}–{p_correct_clean[1]}"}


def table(report: dict) -> str:
    """The gate's figures as text: each barred measure with its bar and verdict, then the others."""
    gate, m = report["gate"], report["measures"]
    lines = [f"{'measure':<24} {'value':>8}  bar         ok"]
    for name, bar in BARS.items():
        lines.append(f"{name:<24} {m[name]:>8.3f}  {bar.format(**gate):<11} {'yes' if report['checks'][name] else 'NO'}")
    lines += [f"{name:<24} {value:>8.3f}" for name, value in m.items() if name not in BARS]
    lines.append(f"gate: {'PASSED' if report['passed'] else 'FAILED'} ({report['model']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/regimes/multicall.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--model", default=None, help="policy folder (default: model.path)")
    parser.add_argument("--skip", type=int, default=ChainGateConfig().skip)
    parser.add_argument("--prompts", type=int, default=ChainGateConfig().prompts)
    parser.add_argument("--samples", type=int, default=ChainGateConfig().samples)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    ensure_files(cfg.data)
    gate = ChainGateConfig(skip=args.skip, prompts=args.prompts, samples=args.samples)
    report = run_chain_gate(args.model or cfg.model.path, cfg.setups().eval, gate)
    return emit(report, args.out, table(report))


def emit(report: dict, out: Path | None, text: str) -> dict:
    """Write ``report`` as JSON to ``out`` (when given), print its table ``text``; returns the report."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
    print(text)
    return report


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    sys.exit(0 if main()["passed"] else 1)
