"""The R3L part of the step viewer: base attempt → reflection → guided retry, masked prefix marked.

For up to ``n`` reflections of the step (successful retries first, then other retries, then
invalid or perfect reports) it draws three cards side by side:

* **base**: the attempt as it trains; assistant turns before the pivot carry a "masked" badge
  (pivotal credit: they are out of the loss);
* **reflection**: validity, reason, pivot, the report (pretty JSON, or the raw text when it
  did not parse), and how many replayed tool calls changed outcome (with their errors);
* **retry**: the guided retry's conversation; turns copied from the base (before the pivot)
  are marked "copied, masked", the guidance is highlighted; rewards r1 → r2 and whether the
  reflection and retry train.

Model text is untrusted: everything is escaped. ``render_r3l_section`` returns an HTML
fragment and ``R3L_CSS`` the styles it needs; ``tasks.reports.viewer`` embeds both.
"""

from __future__ import annotations

import json
from html import escape

import polars as pl

from tasks.r3l.prompts import GUIDANCE_HEADER

R3L_CSS = """
.r3l{display:grid;grid-template-columns:1fr 1fr 1fr;gap:12px;padding:6px 18px 14px}
.r3l h3{font-size:13px;margin:0 0 6px}.badge{border-radius:3px;padding:0 5px;font-size:11px;margin-left:4px}
.masked{background:#e4e4e4;color:#555}.copied{background:#e8eefc;color:#345}.guidance{border-color:#9b59b6!important;
background:#f7f0fb}.valid{background:#dff3e4}.invalid{background:#fde2e2}.msg.masked-turn{opacity:.6}
"""


def _msg(m: dict, cls: str = "", badge: str = "") -> str:
    role = escape(str(m.get("role", "?")))
    tag = f"<span class='badge {cls}'>{escape(badge)}</span>" if badge else ""
    turn = f" {cls}-turn" if cls else ""
    return (f"<div class='msg {role}{turn}'><div class='role'>{role}{tag}</div>"
            f"<pre>{escape(str(m.get('content', '')))}</pre></div>")


def _conversation(messages: list[dict], pivot: int, copied: bool) -> str:
    out, turn = [], 0
    for m in messages:
        if m.get("role") == "assistant":
            if turn < pivot:
                out.append(_msg(m, "copied" if copied else "masked",
                                "copied from base, masked" if copied else "masked (before pivot)"))
            else:
                out.append(_msg(m))
            turn += 1
        elif m.get("role") == "system" and str(m.get("content", "")).count(GUIDANCE_HEADER.strip()):
            out.append(_msg(m, "guidance", "guidance"))
        else:
            out.append(_msg(m))
    return "".join(out)


def _report_block(r: dict) -> str:
    ok = "valid" if r["valid"] else "invalid"
    head = (f"<span class='badge {ok}'>{ok}</span> reason <b>{escape(str(r['reason']))}</b>, pivot "
            f"<b>{escape(str(r['retry_from_step']))}</b>, {r.get('reflection_tokens') or 0} tokens")
    body = json.dumps(json.loads(r["report"]), indent=2, ensure_ascii=False) if r.get("report") else r["reflection_text"]
    replays = json.loads(r.get("replays") or "[]")
    changed = [p for p in replays if p.get("changed")]
    extra = "".join(f"<div class='bad'>replayed call at turn {p['position']} now {escape(str(p['error_kind']))} "
                    f"(was {escape(str(p['original_error_kind'] or 'ok'))})</div><pre class='error'>"
                    f"{escape(p.get('error_text') or '')}</pre>" for p in changed)
    return f"<div>{head}</div><pre>{escape(body or '')}</pre><div>{len(replays)} call(s) replayed</div>{extra}"


def pick_reflections(reflections: pl.DataFrame, n: int) -> list[dict]:
    rows = reflections.to_dicts()
    rank = sorted(rows, key=lambda r: (not r["retry_succeeded"], r["retry_traj_id"] is None, r["traj_id"]))
    return rank[:n]


def render_r3l_section(trajs: pl.DataFrame, reflections: pl.DataFrame, n: int) -> str:
    """HTML fragment: up to ``n`` base → reflection → retry rows (empty when the step has no reflections)."""
    if reflections.height == 0 or n <= 0:
        return ""
    by_id = {r["traj_id"]: r for r in trajs.to_dicts()}
    parts = ["<h2 style='padding:0 18px'>R3L: base attempt → reflection → guided retry</h2>"]
    for r in pick_reflections(reflections, n):
        base = by_id.get(r["traj_id"], {})
        pivot = r["retry_from_step"] if r["retry_traj_id"] else 0
        base_html = _conversation(json.loads(base.get("messages") or "[]"), pivot, copied=False)
        if r["retry_messages"]:
            trains = "reflection + retry train (reward 1.0)" if r["retry_succeeded"] else "only the guidance-free copy trains"
            retry_html = (f"<div>r1 {r['base_reward']} → r2 {r['retry_reward']}; {trains}</div>"
                          + _conversation(json.loads(r["retry_messages"]), pivot, copied=True))
        else:
            retry_html = f"<p class='none'>no retry ({escape(r['note'] or r['reason'])})</p>"
        parts.append(
            f"<div class='r3l' data-traj='{escape(r['traj_id'])}'>"
            f"<div class='traj'><h3>base {escape(r['traj_id'])} (reward {r['base_reward']})</h3>{base_html}</div>"
            f"<div class='traj'><h3>reflection</h3>{_report_block(r)}</div>"
            f"<div class='traj'><h3>guided retry</h3>{retry_html}</div></div>")
    return "".join(parts)
