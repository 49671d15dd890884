"""A self-contained HTML trajectory viewer for one logged step (an MLflow artifact).

What it shows: a header with the step's metrics, then rows of sampled trajectories, the SAAR
(purified) conversation on the left and a raw conversation of the same prompt on the right.
At each position where SAAR rolled back, the cut attempts are drawn where they were cut: the
failed call, its error, the similarity and the shallow/deep decision, and how the position
ended (recovered, exhausted, no call). Raw trajectories mark their error-and-retry turns.

Environment steps (``env_steps`` rows given) use their own layout instead of the SAAR pairs: episodes grouped by
start state, each turn's observation, thought, actions asked → run, reward and penalty (``tasks.envs.view``).

In R3L steps a section below the pairs draws base attempt → reflection → guided retry, with the
masked prefix and the guidance marked (``tasks.r3l.view``).

What it simplifies: reading SAAR's effect without SQL; the page needs no network (inline
CSS and JS) and escapes all model text, which is untrusted.

Run: ``render_step_viewer(trajs, events, step, n)`` with the step's ``trajectories`` rows
(joined with scores) and its ``saar_events`` rows; ``log_stage`` logs the result as
``viewer/step_000003.html``.
"""

from __future__ import annotations

import json
import re
from html import escape

import polars as pl

from tasks.envs.view import ENV_CSS, env_summary, render_env_section
from tasks.r3l.view import R3L_CSS, render_r3l_section

CUTS = ("shallow", "deep", "replace", "append")
"""Decisions drawn per attempt: the similarity splices, and the importance decisions (``tasks.rollout.decisions``:
``append`` keeps the failed call and its error, the attempt drawn is not cut)."""
ENDS = {"recovered": "ok", "exhausted": "bad", "no_call": "bad", "length": "bad", "turn_cap": "bad",
        "append_failed": "bad"}
_ERROR_LINE = re.compile(r"(?m)^\s*[A-Za-z_.]*(Error|Exception|Exit|Interrupt)\b|tool_call_format_error|malformed_call")

CSS = """
body{font:13px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:12px 18px}header h1{margin:0 0 6px;font-size:18px}
.metrics{display:flex;flex-wrap:wrap;gap:6px 16px}.metrics span b{color:#9fd3ff}
.bar{padding:8px 18px}.bar button{margin-right:6px}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px;padding:6px 18px 14px}
.traj{background:#fff;border:1px solid #d5d9e0;border-radius:6px;padding:8px;min-width:0}
.traj h2{font-size:13px;margin:0 0 6px}.tag{border-radius:3px;padding:0 5px;margin-left:4px;font-size:11px}
.saar{background:#dff3e4}.raw{background:#fde8d8}.none{color:#888;font-style:italic}
.msg{border-left:3px solid #ccc;margin:4px 0;padding:2px 6px}.msg .role{font-weight:600;font-size:11px}
.msg.assistant{border-color:#4a7bd0}.msg.tool{border-color:#888}.msg.user,.msg.system{border-color:#b9a2e0}
.msg.error{border-color:#d33;background:#fff3f3}.msg.retry{border-color:#e69a28;background:#fff9ee}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;font:12px/1.35 ui-monospace,monospace}
details.cut{border:1px dashed #d33;border-radius:5px;margin:6px 0;padding:4px 6px;background:#fffafa}
details.cut summary{cursor:pointer;font-weight:600;color:#a22}
.attempt{border-top:1px solid #eee;padding:3px 0}.sim{font-weight:600}
.ok{color:#17823b;font-weight:600}.bad{color:#c22;font-weight:600}
"""

JS = """
function setAll(open){document.querySelectorAll('details').forEach(d=>d.open=open)}
function onlyCuts(on){document.querySelectorAll('.pair').forEach(p=>{
  p.style.display=(on&&!p.querySelector('details.cut'))?'none':''})}
"""

HEADER_KEYS = ["rollout/accuracy", "rollout/reward_mean", "tools/success_rate", "tools/first_attempt_success_rate",
               "saar/rollbacks_triggered", "saar/rollbacks_recovered", "saar/global_recovery_rate",
               "saar/shallow", "saar/deep", "r3l/valid_rate", "r3l/pivot_mean", "r3l/retry_succeeded",
               "r3l/second_success"]


def _num(x) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def step_summary(trajs: pl.DataFrame) -> dict[str, float]:
    """Header figures computed from the trajectory rows themselves."""
    if trajs.height == 0:
        return {"trajectories": 0}
    s = {k: int(trajs[k].sum()) for k in ("tool_calls", "tool_success", "rollbacks_triggered",
                                             "rollbacks_recovered", "shallow", "deep") if k in trajs.columns}
    out: dict[str, float] = {"trajectories": trajs.height, "raw": int(trajs["raw"].sum())}
    if "correct" in trajs.columns:
        out["accuracy"] = float(trajs["correct"].cast(pl.Float64).mean() or 0.0)
    if "reward" in trajs.columns:
        out["reward mean"] = float(trajs["reward"].mean() or 0.0)
    out["tool calls"] = s.get("tool_calls", 0)
    out["tool success"] = s.get("tool_success", 0) / s["tool_calls"] if s.get("tool_calls") else 0.0
    out["rollbacks triggered"] = s.get("rollbacks_triggered", 0)
    out["recovered"] = s.get("rollbacks_recovered", 0)
    out["shallow"], out["deep"] = s.get("shallow", 0), s.get("deep", 0)
    return out


def pick_pairs(trajs: pl.DataFrame, n: int) -> list[tuple[dict | None, dict | None]]:
    """Up to ``n`` SAAR trajectories (rolled back first), each beside a raw one of the same prompt."""
    rows = trajs.to_dicts()
    saar = sorted((r for r in rows if not r["raw"]),
                  key=lambda r: (-r.get("rollbacks_recovered", 0), -r.get("rollbacks_triggered", 0), r["traj_id"]))[:n]
    raws = sorted((r for r in rows if r["raw"]),
                  key=lambda r: (r.get("tool_success", 0) >= r.get("tool_calls", 0), r["traj_id"]))
    used: set[str] = set()
    pairs: list[tuple[dict | None, dict | None]] = []
    for s in saar:
        mate = next((r for r in raws if r["prompt_id"] == s["prompt_id"] and r["traj_id"] not in used), None)
        if mate:
            used.add(mate["traj_id"])
        pairs.append((s, mate))
    for r in raws:
        if len(used) >= n:
            break
        if r["traj_id"] not in used:
            used.add(r["traj_id"])
            pairs.append((None, r))
    return pairs


def _cut_block(position: int, evs: list[dict]) -> str:
    """The attempts cut at one position, in the order they happened, and how it ended."""
    cuts = [e for e in evs if e["kind"] in CUTS]
    end = next((e for e in evs if e["kind"] in ENDS), None)
    first = next((e for e in evs if e["kind"] == "triggered"), None)
    outcome = (f"<span class='{ENDS[end['kind']]}'>{escape(end['kind'])} at attempt {end['attempt']}</span>"
               if end else "<span class='bad'>unfinished</span>")
    parts = [f"<details class='cut' open data-position='{position}'><summary>✂ rollback at turn {position}: "
             f"{len(cuts)} attempt(s) cut, {outcome}</summary>"]
    if first:
        parts.append(f"<div>first failure: <b>{escape(str(first['error_kind']))}</b></div>")
    for e in cuts:
        ratio = e.get("is_log_ratio")
        basis = (f"similarity <span class='sim'>{_num(e['similarity'])}</span>" if ratio is None
                 else f"log importance ratio <span class='sim'>{_num(ratio)}</span>")
        fate = "was kept, its error too" if e["kind"] == "append" else "was cut"
        parts.append(
            f"<div class='attempt' data-kind='{escape(e['kind'])}'>attempt {e['attempt']}: the failed call "
            f"(<b>{escape(str(e['error_kind']))}</b>) {fate}, {basis} → <b>{escape(e['kind'])}</b>"
            f"<pre class='failed'>{escape(e['failed_turn'] or '')}</pre>"
            f"<div>error:</div><pre class='error'>{escape(e['error_text'] or '')}</pre></div>")
    if end and end["kind"] in ("exhausted", "no_call", "length") and end.get("error_text"):
        parts.append(f"<div>error left in the trajectory:</div><pre class='error'>{escape(end['error_text'])}</pre>")
    parts.append("</details>")
    return "".join(parts)


def _message(m: dict, cls: str = "") -> str:
    role = escape(str(m.get("role", "?")))
    return (f"<div class='msg {role} {cls}'><div class='role'>{role}</div>"
            f"<pre>{escape(str(m.get('content', '')))}</pre></div>")


def _conversation(row: dict, evs: list[dict]) -> str:
    """Messages in order; cut attempts drawn before the assistant turn that replaced them."""
    by_pos: dict[int, list[dict]] = {}
    for e in evs:
        by_pos.setdefault(e["position"], []).append(e)
    msgs = json.loads(row["messages"])
    out, position = [], 0
    for i, m in enumerate(msgs):
        cls = ""
        if m.get("role") == "assistant":
            if position in by_pos:
                out.append(_cut_block(position, by_pos[position]))
            position += 1
        elif m.get("role") == "tool" and _ERROR_LINE.search(str(m.get("content", ""))):
            follows = any(x.get("role") == "assistant" for x in msgs[i + 1:])
            cls = "error retry" if follows else "error"
        out.append(_message(m, cls))
    return "".join(out)


def _card(row: dict | None, evs: list[dict], side: str) -> str:
    if row is None:
        return f"<div class='traj {side}'><p class='none'>no {side} trajectory of this prompt</p></div>"
    kind = "raw" if row["raw"] else "saar"
    label = "raw" if row["raw"] else "SAAR (purified)"
    facts = (f"reward {_num(row.get('reward'))}, correct {row.get('correct')}, tool calls {row.get('tool_calls')}"
             f" ({row.get('tool_success')} ok), rollbacks {row.get('rollbacks_triggered')} / recovered "
             f"{row.get('rollbacks_recovered')}, shallow {row.get('shallow')}, deep {row.get('deep')}, "
             f"finish {escape(str(row.get('finish_reason')))}")
    return (f"<div class='traj {side}' data-traj='{escape(row['traj_id'])}'><h2>{escape(row['traj_id'])}"
            f"<span class='tag {kind}'>{label}</span></h2><div>{facts}</div>{_conversation(row, evs)}</div>")


ENV_HEADER = ("rollout/in_group_std", "rollout/in_group_std_max", "rollout/chosen_in_group_std", "train/entropy",
              "train/grad_norm", "train/approx_kl", "response_length")


def _page(step: int, title: str, head: str, bar: str, body: str) -> str:
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'\">"
        f"<title>CLEANER step {step}: trajectories</title><style>{CSS}{R3L_CSS}{ENV_CSS}</style><script>{JS}</script>"
        "</head><body>"
        f"<header><h1>Step {step}: {title}</h1><div class='metrics'>{head}</div></header>{bar}{body}</body></html>"
    )


def render_env_viewer(trajs: pl.DataFrame, env_steps: pl.DataFrame, step: int, n: int,
                      metrics: dict[str, float] | None = None) -> str:
    """The viewer page of an environment step: ``n`` episodes turn by turn (``tasks.envs.view``)."""
    env = str(trajs["data_source"][0]) if trajs.height and "data_source" in trajs.columns else "environment"
    figures: dict[str, float] = env_summary(trajs)
    if metrics:
        figures.update({k: v for k, v in metrics.items() if k.startswith(f"{env}/") or k in ENV_HEADER})
    head = "".join(f"<span>{escape(k)} <b>{escape(_num(v))}</b></span>" for k, v in figures.items())
    bar = ("<div class='bar'><button onclick='setAll(true)'>expand all</button>"
           "<button onclick='setAll(false)'>collapse all</button></div>")
    body = render_env_section(trajs, env_steps, n) or "<p class=none>no episodes in this step</p>"
    return _page(step, f"{escape(env)} episodes turn by turn", head, bar, body)


def render_step_viewer(trajs: pl.DataFrame, events: pl.DataFrame, step: int, n: int,
                       metrics: dict[str, float] | None = None, reflections: pl.DataFrame | None = None,
                       env_steps: pl.DataFrame | None = None) -> str:
    """The viewer page of one step: ``n`` SAAR trajectories beside raw ones, with their SAAR events.

    ``trajs``: the step's trajectory rows (``messages``, ``raw``, ``prompt_id``, SAAR counters;
    ``reward``/``correct`` when scored); ``events``: its ``saar_events`` rows; ``metrics``:
    the logged step metrics shown in the header (else figures computed from ``trajs``);
    ``reflections``: the step's ``r3l_reflections`` rows, drawn as base → reflection → retry
    (``tasks.r3l.view``) below the pairs, which show first attempts only; ``env_steps``: the step's
    ``env_steps`` rows — an environment step gets the episode layout (``render_env_viewer``) instead.
    """
    if env_steps is not None:
        return render_env_viewer(trajs, env_steps, step, n, metrics)
    r3l = render_r3l_section(trajs, reflections, n) if reflections is not None else ""
    if "kind" in trajs.columns:
        trajs = trajs.filter(pl.col("kind").is_in(["rollout", "base"]))
    ev_rows = events.sort(["traj_id", "event_idx"]).to_dicts() if events.height else []
    by_traj: dict[str, list[dict]] = {}
    for e in ev_rows:
        by_traj.setdefault(e["traj_id"], []).append(e)
    figures = step_summary(trajs)
    if metrics:
        figures = {"trajectories": figures["trajectories"], "raw": figures.get("raw", 0),
                   **{k: metrics[k] for k in HEADER_KEYS if k in metrics}}
    head = "".join(f"<span>{escape(k)} <b>{escape(_num(v))}</b></span>" for k, v in figures.items())
    rows = "".join(
        f"<div class='pair'>{_card(s, by_traj.get(s['traj_id'], []) if s else [], 'saar')}"
        f"{_card(r, by_traj.get(r['traj_id'], []) if r else [], 'raw')}</div>"
        for s, r in pick_pairs(trajs, n))
    bar = ("<div class='bar'><button onclick='setAll(true)'>expand all</button>"
           "<button onclick='setAll(false)'>collapse all</button><label><input type='checkbox' "
           "onchange='onlyCuts(this.checked)'> only trajectories with rollbacks</label></div>")
    return _page(step, "SAAR (purified) beside raw trajectories", head, bar,
                 f"{rows or '<p class=none>no trajectories in this step</p>'}{r3l}")
