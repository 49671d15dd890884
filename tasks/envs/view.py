"""The environment layout of the step viewer: episodes turn by turn (observation, thought, actions, reward).

An environment step has no SAAR pairs to show; instead, for up to ``n`` episodes — grouped by start state
(the prompt group: same map, same seed), successful and failed ones interleaved so a group's contrast is
visible — it draws one card per episode: its score, success, format penalties and actions used, then a table
with one row per turn:

* **observation**: the state the model saw before acting (the grid in RAGEN's symbols, kept monospaced);
* **thought**: the text inside ``<think>…</think>``;
* **actions**: what the answer asked for → what ran (invalid names struck through, a cut by the action budget
  shown as "not run"), or "unparsable" when the turn broke the format (a penalised no-op);
* **reward** of the turn, its format penalty, and whether the episode ended there.

The final observation (after the last turn) is the last user message of the conversation. Model text is
untrusted: everything is escaped. ``render_env_section`` returns an HTML fragment, ``ENV_CSS`` its styles;
``tasks.reports.viewer`` embeds both when the step has ``env_steps`` rows.
"""

from __future__ import annotations

import json
from html import escape

import polars as pl

ENV_CSS = """
.envgrid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px;padding:6px 18px 14px}
.episode h2{font-size:13px;margin:0 0 4px}.won{background:#dff3e4}.lost{background:#fde8d8}
table.turns{border-collapse:collapse;width:100%;margin-top:4px}table.turns td,table.turns th{border:1px solid #e2e5ea;
padding:2px 4px;vertical-align:top;text-align:left;font-size:12px}table.turns th{background:#f0f2f5}
pre.state{font:13px/1.15 ui-monospace,monospace;letter-spacing:2px;margin:0}.inv{color:#c22;text-decoration:line-through}
.unparsed{color:#c22;font-weight:600}.pen{color:#c22}.done{font-weight:600}
"""


def _loads(text) -> list:
    try:
        return json.loads(text) if text else []
    except (TypeError, ValueError):
        return []


def pick_episodes(trajs: pl.DataFrame, n: int) -> list[dict]:
    """Up to ``n`` episodes: whole groups in order, each group's successes and failures interleaved."""
    groups: dict[str, list[dict]] = {}
    for r in sorted(trajs.to_dicts(), key=lambda r: (r["prompt_id"], r["traj_id"])):
        groups.setdefault(r["prompt_id"], []).append(r)
    # groups with both outcomes first: they are the ones a group baseline learns from
    order = sorted(groups.values(), key=lambda g: (len({bool(r.get("env_success")) for r in g}) < 2, g[0]["prompt_id"]))
    out: list[dict] = []
    for g in order:
        won = [r for r in g if r.get("env_success")]
        lost = [r for r in g if not r.get("env_success")]
        mixed = [r for pair in zip(won, lost) for r in pair] + won[len(lost):] + lost[len(won):]
        out += mixed[: n - len(out)]
        if len(out) >= n:
            break
    return out


def _actions_cell(step: dict) -> str:
    if not step.get("parsed"):
        return "<span class='unparsed'>unparsable: no-op</span>"
    asked, ran, invalid = _loads(step.get("actions")), _loads(step.get("executed")), set(_loads(step.get("invalid")))
    cells, pending = [], list(ran)
    for a in asked:
        if a in invalid:
            cells.append(f"<span class='inv'>{escape(str(a))}</span>")
        elif a in pending:
            pending.remove(a)
            cells.append(escape(str(a)))
        else:
            cells.append(f"<span class='pen'>{escape(str(a))} (not run)</span>")
    return " ‖ ".join(cells) or "–"


def _final_state(messages: list[dict]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    return str(users[-1].get("content", "")) if len(users) > 1 else ""


def _episode_card(row: dict, steps: list[dict]) -> str:
    won = bool(row.get("env_success"))
    facts = (f"score {row.get('env_score', row.get('reward'))}, {'success' if won else 'no success'}, "
             f"{row.get('num_turns')} turn(s), {row.get('env_actions')} action(s), format penalty "
             f"{row.get('env_penalty')}, seed {escape(str(row.get('ground_truth')))}")
    if "advantage" in row and row["advantage"] is not None:
        facts += f", advantage {row['advantage']:.3g}"
    body = []
    for s in steps:
        pen = f"<span class='pen'>{s['penalty']}</span>" if s.get("penalty") else "0"
        body.append(f"<tr><td>{s['turn_idx'] + 1}</td><td><pre class='state'>{escape(str(s.get('state') or ''))}</pre></td>"
                    f"<td>{escape(str(s.get('think') or ''))}</td><td>{_actions_cell(s)}</td>"
                    f"<td>{s.get('reward')}</td><td>{pen}</td><td class='done'>{'done' if s.get('done') else ''}</td></tr>")
    final = _final_state(_loads(row.get("messages")))
    tail = (f"<details><summary>last observation</summary><pre class='state'>{escape(final)}</pre></details>"
            if final else "")
    return (f"<div class='traj episode {'won' if won else 'lost'}' data-traj='{escape(row['traj_id'])}'>"
            f"<h2>{escape(row['traj_id'])} <span class='tag'>{escape(str(row.get('prompt_id')))}</span></h2>"
            f"<div>{facts}</div><table class='turns'><tr><th>turn</th><th>observation</th><th>thought</th>"
            f"<th>actions (asked → ran)</th><th>reward</th><th>penalty</th><th></th></tr>{''.join(body)}</table>"
            f"{tail}</div>")


def render_env_section(trajs: pl.DataFrame, env_steps: pl.DataFrame, n: int) -> str:
    """HTML fragment: up to ``n`` episodes of the step, turn by turn (empty without episodes)."""
    if trajs.height == 0 or n <= 0:
        return ""
    by_traj: dict[str, list[dict]] = {}
    for s in env_steps.sort(["traj_id", "turn_idx"]).to_dicts() if env_steps.height else []:
        by_traj.setdefault(s["traj_id"], []).append(s)
    cards = "".join(_episode_card(r, by_traj.get(r["traj_id"], [])) for r in pick_episodes(trajs, n))
    return f"<div class='envgrid'>{cards}</div>"


def env_summary(trajs: pl.DataFrame) -> dict[str, float]:
    """Header figures of an environment step from its episode rows."""
    out: dict[str, float] = {"episodes": trajs.height, "groups": trajs["prompt_id"].n_unique() if trajs.height else 0}
    if trajs.height and "env_success" in trajs.columns:
        out["success"] = float(trajs["env_success"].cast(pl.Float64).mean() or 0.0)
        out["score_mean"] = float(trajs["env_score"].mean() or 0.0)
    return out
