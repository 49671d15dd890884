"""The warm-up gate: is a warmed-up policy a fair starting point for CLEANER?

CLEANER's premise is a policy that often fails a first tool call, usually fixes it once it
sees the error, and whose fixed trajectories end as often right as clean ones. The gate
measures that on held-out prompts (``eval`` split, bound inputs), sampling at temperature 1
with SAAR on and no raw share, ``n_prompts × samples`` trajectories (≥ 500 by default):

* **tool-call rate**: the trajectory calls the tool at all;
* **first-call failure rate**: of those, the first tool call failed (per trajectory; not the evaluation's
  ``tools/first_attempt_failure_rate``, which counts every first attempt at every call position);
* **recovery rate**: of those, the failed position was fixed (a regenerated call ran);
* **P(correct | clean)**: the answer is right when the first call ran;
* **P(correct | recovered)**: the answer is right when the first call failed and was fixed;

overall (each with its binomial standard error), by task kind and by failure kind, plus the
checks of ``GateConfig`` (the issue's bar: failure 30–50 %, recovery ≥ 70 %, P(correct | clean)
0.4–0.7, |P(correct | recovered) − P(correct | clean)| ≤ 0.1).

``run_gate`` rolls out and returns the report; ``write_gate`` writes it as JSON beside the model
(``gate.json``) and into the model card (between ``<!-- gate -->`` markers); ``log_gate`` logs
it to MLflow (rates overall and per kind, the JSON and the card section as artifacts).
A long gate runs in parts (``gate.start``/``gate.n_prompts`` ranges, each report keeps its rows) that
``combine_reports`` merges (``cleaner warmup-gate --combine a.json --combine b.json``).
Run: ``cleaner warmup-gate --model assets/tiny-warm`` (config: ``tasks.training.config.GateConfig``).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path

from tasks.training.config import GateConfig

CARD_START, CARD_END = "<!-- gate -->", "<!-- /gate -->"


def trajectory_facts(traj, correct: bool) -> dict:
    """What the gate needs of one rolled-out trajectory (``tasks.rollout.Trajectory``)."""
    first = traj.executions[0] if traj.executions else None
    failed = first is not None and not first.result.ok
    recovered = failed and any(e.kind == "recovered" and e.position == first.position for e in traj.events)
    return {"kind": traj.item.extra_info.get("kind", traj.item.data_source), "has_call": first is not None,
            "first_failed": failed, "failure": first.result.error_kind if failed else None,
            "recovered": recovered, "correct": bool(correct)}


def _rate(hits: int, n: int) -> dict:
    p = hits / n if n else None
    return {"rate": p, "n": n, "se": math.sqrt(p * (1 - p) / n) if n else None}


def _rates(rows: list[dict]) -> dict:
    called = [r for r in rows if r["has_call"]]
    failed = [r for r in called if r["first_failed"]]
    clean = [r for r in called if not r["first_failed"]]
    recovered = [r for r in failed if r["recovered"]]
    return {
        "trajectories": len(rows),
        "accuracy": _rate(sum(r["correct"] for r in rows), len(rows)),
        "tool_call": _rate(len(called), len(rows)),
        "no_call": _rate(len(rows) - len(called), len(rows)),
        "first_call_failure": _rate(len(failed), len(called)),
        "recovery": _rate(len(recovered), len(failed)),
        "p_correct_clean": _rate(sum(r["correct"] for r in clean), len(clean)),
        "p_correct_recovered": _rate(sum(r["correct"] for r in recovered), len(recovered)),
        "p_correct_unrecovered": _rate(sum(r["correct"] for r in failed if not r["recovered"]),
                                       len(failed) - len(recovered)),
    }


def gate_figures(rows: list[dict], cfg: GateConfig) -> dict:
    """Overall, per kind and per failure kind rates, and the checks against ``cfg``."""
    by_kind, by_failure = defaultdict(list), defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r)
        if r["first_failed"]:
            by_failure[r["failure"] or "unknown"].append(r)
    overall = _rates(rows)
    fail, rec = overall["first_call_failure"]["rate"], overall["recovery"]["rate"]
    clean, fixed = overall["p_correct_clean"]["rate"], overall["p_correct_recovered"]["rate"]
    gap = None if clean is None or fixed is None else fixed - clean
    checks = {
        "first_call_failure": fail is not None and cfg.first_call_failure[0] <= fail <= cfg.first_call_failure[1],
        "recovery": rec is not None and rec >= cfg.min_recovery,
        "p_correct_clean": clean is not None and cfg.p_correct_clean[0] <= clean <= cfg.p_correct_clean[1],
        "gap": gap is not None and abs(gap) <= cfg.max_gap,
    }
    failures = {k: {"count": len(v), "recovery": _rate(sum(r["recovered"] for r in v), len(v)),
                    "p_correct_recovered": _rate(sum(r["correct"] for r in v if r["recovered"]),
                                                 sum(r["recovered"] for r in v))}
                for k, v in sorted(by_failure.items(), key=lambda kv: -len(kv[1]))}
    return {"overall": overall, "gap": gap, "checks": checks, "passed": all(checks.values()),
            "by_kind": {k: _rates(v) for k, v in sorted(by_kind.items())}, "by_failure": failures,
            "bar": cfg.model_dump(mode="json")}


def gate_items(cfg: GateConfig):
    """The gate's fixed held-out prompts ``start``..``n_prompts`` − 1 as ``PromptItem`` (eval split, bound
    inputs in ``extra_info``); the draw is prefix-stable, so parts of one gate cover disjoint prompts."""
    from tasks.data.synthetic import make_problems, task_rows
    from tasks.rollout.machine import PromptItem

    rows = task_rows(make_problems(cfg.n_prompts, cfg.seed, "eval"), "eval")[cfg.start:]
    return [PromptItem(f"gate/{r['extra_info']['index']}", r["prompt"], r["data_source"],
                       r["reward_model"]["ground_truth"], r["extra_info"]) for r in rows]


def tokenizer_dir(model_dir: str | Path) -> Path:
    """Where the tokenizer of a policy folder is: the folder, or for a compacted LoRA adapter (no tokenizer
    files) its base."""
    from models.lora import TOKENIZER_PREFIXES, base_of, is_adapter

    folder = Path(model_dir)
    if is_adapter(folder) and not any(f.name.startswith(TOKENIZER_PREFIXES) for f in folder.iterdir()):
        return base_of(folder)
    return folder


def run_gate(model_dir: str | Path, cfg: GateConfig, rollout, engine, sandbox_cfg, progress: bool = True,
             chat_cfg=None) -> dict:
    """Roll the model out on the gate prompts (SAAR on, raw share 0, T = 1) and measure it; ``chat_cfg``
    (``models.config.ChatConfig``, the run's ``model.chat``) frames the prompts as in training."""
    from transformers import AutoTokenizer

    from models.chat import ChatFormat
    from models.config import ChatConfig
    from models.engine import make_engine
    from sandbox.base import make_sandbox
    from tasks.rewards.config import RewardConfig
    from tasks.rewards.record import trajectory_info
    from tasks.rewards.registry import compute_reward
    from tasks.rollout.machine import Rollout

    saar = rollout.saar.model_copy(update={"enabled": True, "raw_share": 0.0})
    roll_cfg = rollout.model_copy(update={"saar": saar, "n_samples": cfg.samples})
    chat_cfg = chat_cfg or ChatConfig()
    chat = ChatFormat(AutoTokenizer.from_pretrained(str(tokenizer_dir(model_dir))), chat_cfg.system_prompt,
                      fewshot=chat_cfg.fewshot)
    pad = chat.tokenizer.pad_token_id if chat.tokenizer.pad_token_id is not None else chat.eos_id
    eng = make_engine(engine.model_copy(update={"temperature": 1.0, "top_p": 1.0}), model_dir, chat.eos_id, pad)
    t0 = time.perf_counter()
    reward = RewardConfig()
    with make_sandbox(sandbox_cfg) as box:
        trajs = Rollout(roll_cfg, eng, chat, box).run(gate_items(cfg), cfg.seed, step=0, progress=progress)
        rows = [{**trajectory_facts(t, compute_reward(t.item.data_source, chat.decode(t.response_ids),
                                                      t.item.ground_truth, trajectory_info(t), sandbox=box,
                                                      cfg=reward).correct),
                 "prompt": t.item.prompt_id} for t in trajs]
    report = gate_figures(rows, cfg)
    report.update(model=str(model_dir), rollout_s=round(time.perf_counter() - t0, 1), rows=rows)
    return report


def combine_reports(reports: list[dict]) -> dict:
    """One report from gate parts run on disjoint prompts of one draw (``start`` = the previous part's
    ``n_prompts``): the figures of all their trajectories, as if measured in one run."""
    if not reports:
        raise ValueError("combine_reports: no reports given")
    bars = [r["bar"] for r in reports]
    same = {k: v for k, v in bars[0].items() if k not in ("start", "n_prompts")}
    for r, bar in zip(reports, bars):
        if "rows" not in r:
            raise ValueError(f"gate report of {r.get('model')} has no rows (made before rows were kept)")
        if {k: v for k, v in bar.items() if k not in ("start", "n_prompts")} != same:
            raise ValueError(f"gate parts differ in their bar or sampling: {same} vs {bar}")
    spans = sorted((b["start"], b["n_prompts"]) for b in bars)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start != end:
            raise ValueError(f"gate parts must cover adjacent prompt ranges; got {spans}")
    rows = [row for r in reports for row in r["rows"]]
    cfg = GateConfig(**{**same, "start": spans[0][0], "n_prompts": spans[-1][1]})
    out = gate_figures(rows, cfg)
    out.update(model=reports[0]["model"], rollout_s=round(sum(r["rollout_s"] for r in reports), 1), rows=rows,
               parts=len(reports))
    return out


def card_section(report: dict) -> str:
    """The model card's gate section (Markdown)."""
    o, c = report["overall"], report["checks"]

    def pct(x: dict) -> str:
        return "-" if x["rate"] is None else f"{100 * x['rate']:.1f} % ± {100 * x['se']:.1f} (n = {x['n']})"

    verdict = "**passes**" if report["passed"] else "**does not pass**"
    bar = report["bar"]
    lines = [CARD_START, "## Warm-up gate", "",
             f"{o['trajectories']} held-out trajectories ({bar['n_prompts'] - bar.get('start', 0)} `eval` prompts × "
             f"{bar['samples']}, seed "
             f"{bar['seed']}, T = 1, SAAR on, raw share 0); the model {verdict} the gate. Figures: `gate.json`.", "",
             "| measure | value ± s.e. | bar | ok |", "| --- | --- | --- | --- |",
             f"| tool-call rate | {pct(o['tool_call'])} | | |",
             f"| first-call failure | {pct(o['first_call_failure'])} | {bar['first_call_failure'][0]:.2f}–"
             f"{bar['first_call_failure'][1]:.2f} | {_ok(c['first_call_failure'])} |",
             f"| recovery | {pct(o['recovery'])} | ≥ {bar['min_recovery']:.2f} | {_ok(c['recovery'])} |",
             f"| P(correct \\| clean) | {pct(o['p_correct_clean'])} | {bar['p_correct_clean'][0]:.2f}–"
             f"{bar['p_correct_clean'][1]:.2f} | {_ok(c['p_correct_clean'])} |",
             f"| P(correct \\| recovered) | {pct(o['p_correct_recovered'])} | gap ≤ {bar['max_gap']:.2f} | "
             f"{_ok(c['gap'])} (gap {report['gap']:+.3f}) |" if report["gap"] is not None else
             f"| P(correct \\| recovered) | - | gap ≤ {bar['max_gap']:.2f} | {_ok(False)} |",
             f"| accuracy (all) | {pct(o['accuracy'])} | | |", "",
             "| kind | n | first-call failure | recovery | P(correct \\| clean) | P(correct \\| recovered) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for kind, r in report["by_kind"].items():
        lines.append(f"| {kind} | {r['trajectories']} | {_short(r['first_call_failure'])} | {_short(r['recovery'])} "
                     f"| {_short(r['p_correct_clean'])} | {_short(r['p_correct_recovered'])} |")
    lines += ["", "| failure kind | count | recovery | P(correct \\| recovered) |", "| --- | --- | --- | --- |"]
    for kind, r in report["by_failure"].items():
        lines.append(f"| {kind} | {r['count']} | {_short(r['recovery'])} | {_short(r['p_correct_recovered'])} |")
    return "\n".join(lines + [CARD_END])


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _short(x: dict) -> str:
    return "-" if x["rate"] is None else f"{x['rate']:.2f} ({x['n']})"


def update_card(card: Path, report: dict) -> None:
    """Replace (or append) the gate section of the model card at ``card``."""
    text = card.read_text() if card.exists() else ""
    section = card_section(report)
    if CARD_START in text and CARD_END in text:
        head, rest = text.split(CARD_START, 1)
        text = head + section + rest.split(CARD_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    card.write_text(text)


def flat_metrics(report: dict) -> dict[str, float]:
    """``gate/<measure>`` (overall) and ``gate/kind/<kind>/<measure>`` rates for MLflow."""
    out = {"gate/passed": float(report["passed"])}
    for name, x in report["overall"].items():
        if isinstance(x, dict) and x["rate"] is not None:
            out[f"gate/{name}"] = x["rate"]
    for kind, rates in report["by_kind"].items():
        for name, x in rates.items():
            if isinstance(x, dict) and x["rate"] is not None:
                out[f"gate/kind/{kind}/{name}"] = x["rate"]
    if report["gap"] is not None:
        out["gate/gap"] = report["gap"]
    return out


def write_gate(report: dict, model_dir: Path, card: bool = True) -> Path:
    """``gate.json`` beside the model and (``card``) the model card's gate section."""
    path = Path(model_dir) / "gate.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    if card:
        update_card(Path(model_dir) / "MODEL_CARD.md", report)
    return path


def log_gate(report: dict, tracking_cfg) -> str:
    """An MLflow run (experiment ``warmup-gate`` unless ``tracking.experiment`` is set) with the gate's rates."""
    from tasks.stores import tracking

    run_id = f"gate-{Path(report['model']).name}-{time.strftime('%Y%m%d-%H%M%S')}"
    mlrun = tracking.open_run(tracking_cfg, tracking_cfg.experiment or "warmup-gate", run_id,
                              {"gate": report["bar"], "model": report["model"]}, {"cleaner.kind": "warmup-gate"})
    tracking.log_step(tracking_cfg, mlrun, 0, flat_metrics(report), {"gate/gate.json": json.dumps(report, indent=1),
                                                                     "gate/card.md": card_section(report)})
    tracking.finish_run(tracking_cfg, mlrun)
    return mlrun


def gate_table(report: dict, committed: dict | None = None):
    """A rich table of the four rates (± s.e.), and the committed figures beside them when given."""
    from rich.table import Table

    table = Table(title=f"warm-up gate: {report['model']} ({report['overall']['trajectories']} trajectories)")
    for col in ("measure", "value ± s.e.", "ok", *(["committed"] if committed else [])):
        table.add_column(col)
    for name in ("tool_call", "first_call_failure", "recovery", "p_correct_clean", "p_correct_recovered", "accuracy"):
        x = report["overall"][name]
        ok = report["checks"].get(name if name != "p_correct_recovered" else "gap", "")
        row = [name, "-" if x["rate"] is None else f"{x['rate']:.3f} ± {x['se']:.3f}", str(ok)]
        if committed:
            c = committed["overall"].get(name, {"rate": None})
            row.append("-" if c["rate"] is None else f"{c['rate']:.3f} ± {c['se']:.3f}")
        table.add_row(*row)
    return table
