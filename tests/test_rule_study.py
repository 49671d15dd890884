"""Part C (docs/rule_study.md) is held to the README's rule: every figure the README and the doc quote recomputes
from the committed report (``docs/generalisation/multicall_c.json``), the README's "which setting" table follows
the rule the registration fixed before the runs (read from that JSON, not from the table), the registered text is
byte for byte what its commit holds, and every run record was committed after it, by code descending from it."""

from __future__ import annotations

import json
import re

import pytest

from tests.test_readme import README, ROOT, flat, follow_up, full_history, git, interval, paired

C = follow_up("multicall_c")
RULE = (ROOT / "docs/rule_study.md").read_text()
CONTRASTS = C["contrasts"]["by_name"]
RECORDS = sorted((ROOT / "docs/generalisation/multicall_c_runs").glob("regime-multicall-c-*.json"))

# README's Part C table: row label -> ("contrast", registered contrast) or ("vs_dapo", arm − dapo_c1 paired by seed)
README_ROWS = {
    "interaction (primary): masked CLEANER − DAPO at calls + 3, minus the same at calls + 1":
        ("contrast", "interaction"),
    "masked CLEANER − DAPO, calls + 1": ("contrast", "masked_c1"),
    "masked CLEANER − DAPO, calls + 3": ("contrast", "masked_c3"),
    "purify but keep the cost − masked CLEANER, calls + 1": ("contrast", "keepcost_vs_masked"),
    "purify but keep the cost − DAPO, calls + 1": ("vs_dapo", "keepcost_c1"),
    "the authors' adaptive splice (it kept the error turn in 98.7 % of rollbacks) − masked CLEANER, calls + 1":
        ("contrast", "adaptive_vs_masked"),
    "the authors' adaptive splice − DAPO, calls + 1": ("vs_dapo", "adaptive_c1"),
}


def figure(kind: str, name: str, split: str) -> dict:
    if kind == "contrast":
        return CONTRASTS[name]["outcome"][split]
    return paired(C, split, name, "dapo_c1")


def reading(d: dict) -> str:
    lo, hi = d["ci95"]
    return "higher" if lo > 0 else "lower" if hi < 0 else "not different"


def table(text: str, header: str) -> list[list[str]]:
    block = text.split(header)[1].split("\n\n")[0]
    return [[c.strip().strip("*") for c in line.strip("|").split("|")]
            for line in block.splitlines() if line.startswith("| ") and "[" in line]


def test_the_contrast_helper_is_the_reports_own_pairing():
    """A registered contrast is the seed-paired sum of its arms' finals (by hand for two of them)."""
    from tests.test_readme import finals

    for split in ("fresh", "usual"):
        f = {arm: finals(C, split, arm) for arm in ("dapo_c1", "mask_raw0_c1", "dapo_c3", "mask_raw0_c3")}
        by_hand = [f["mask_raw0_c3"][s] - f["dapo_c3"][s] - f["mask_raw0_c1"][s] + f["dapo_c1"][s]
                   for s in range(71, 77)]
        assert CONTRASTS["interaction"]["outcome"][split]["values"] == pytest.approx(by_hand, abs=1e-12)
        masked = CONTRASTS["masked_c1"]["outcome"][split]
        assert interval(paired(C, split, "mask_raw0_c1", "dapo_c1")) == interval(masked)
    for arm in ("keepcost_c1", "adaptive_c1"):
        assert interval(paired(C, "fresh", arm, "dapo_c1")) == interval(C["fresh"]["paired"][arm]["internalisation"])
        assert interval(paired(C, "usual", arm, "dapo_c1")) == interval(C["paired_pass_at_1"][arm])


def test_the_readmes_part_c_table_is_the_committed_report():
    rows = table(README, "| Part C: final pass@1 difference | fresh split | usual split | seeds |")
    assert [r[0] for r in rows] == list(README_ROWS)
    for label, fresh, usual, seeds in rows:
        kind, name = README_ROWS[label]
        assert (fresh, usual) == (interval(figure(kind, name, "fresh")), interval(figure(kind, name, "usual"))), label
        assert int(seeds) == figure(kind, name, "fresh")["n"] == 6


def test_the_recipe_table_follows_the_registered_rule_from_the_json():
    """docs/rule_study.md "The rule as a result": the turns-to-spare row from `mask_raw0_c3` − `dapo_c3`; the
    failed-call row DAPO unless keeping the cost or the adaptive splice is above DAPO; the rule sentence with the
    interaction's interval, worded by its reading."""
    rows = {r[0]: r for r in table(README, "| your task | setting | evidence")}
    spare = rows["chains of dependent calls with turns to spare (calls + 3)"]
    c3 = CONTRASTS["masked_c3"]["outcome"]["fresh"]
    expected = {"higher": "masked CLEANER", "lower": "DAPO", "not different": "no gain shown on chains"}[reading(c3)]
    assert spare[1].startswith(expected) and interval(c3) in spare[2]
    costly = rows["a failed call costs the answer (2 turns, or chains with calls + 1)"]
    above = [arm for arm in ("keepcost_c1", "adaptive_c1") if reading(paired(C, "fresh", arm, "dapo_c1")) == "higher"]
    assert not above and costly[1] == "DAPO"
    for arm in ("keepcost_c1", "adaptive_c1"):
        assert interval(paired(C, "fresh", arm, "dapo_c1")) in costly[2]
    assert interval(CONTRASTS["masked_c1"]["outcome"]["fresh"]) in costly[2]
    interaction = CONTRASTS["interaction"]["outcome"]["fresh"]
    sentence = {("higher", "lower"): f"turns to spare shrink what masked CLEANER loses to DAPO (interaction "
                                     f"{interval(interaction)}) but make no gain on chains (calls + 3: {interval(c3)})",
                }[reading(interaction), reading(c3)]
    assert f"The rule (Part C's primary): {sentence}" in flat(README)
    assert rows["one call per answer, turns to spare (the 4-turn task)"][1].startswith("masked CLEANER")
    assert "shown on this one task only" in rows["one call per answer, turns to spare (the 4-turn task)"][2]


def rule_study_claims() -> list[str]:
    medi = {name: CONTRASTS[name]["mediators"]["fresh"] for name in CONTRASTS}
    train = C["mediators"]["training"]
    counts = train["adaptive_c1"]["counts"]
    appended, replaced = (counts[f"rollback/planb_{kind}_count"]["total"] for kind in ("append", "replace"))
    assert train["adaptive_c1"]["planb_append_share"] == pytest.approx(appended / (appended + replaced))
    quantiles = ", ".join(f"{q} {train['adaptive_c1'][f'rollback/is_log_ratio_{q}']:.1f}".replace("-", "−")
                          for q in ("p10", "p50", "p90"))
    compute = {arm: f"×{C['compute'][arm]['sampled_tokens_ratio']:.3f}" for arm in C["compute"] if arm != "dapo_c1"}
    hacks = [train[arm]["counts"]["score/suspected_hacks/total"]["total"] for arm in C["compute"]]
    claims = [
        f"the importance ratio of the fix without/with the error context was below 0.5 in {appended:.0f} of "
        f"{appended + replaced:.0f} rollbacks (append share {appended / (appended + replaced):.3f}; "
        "log-ratio quantiles, "
        f"mean over steps: {quantiles})",
        f"interaction +{medi['interaction']['first_call_success']['mean']:.3f}",
        f"`keepcost_c1` is above `mask_raw0_c1` on first-call success "
        f"({interval(medi['keepcost_vs_masked']['first_call_success'])})",
        f"({interval(medi['masked_c1']['first_call_success'])} at calls + 1, "
        f"{interval(medi['masked_c3']['first_call_success'])} at calls + 3",
        f"interaction {interval(medi['interaction']['p_correct_all_clean'])})",
        f"`mask_raw0_c1` − `dapo_c1` {interval(paired(C, 'fresh', 'mask_raw0_c1', 'dapo_c1', 'saar_on'))} fresh, "
        f"{interval(paired(C, 'usual', 'mask_raw0_c1', 'dapo_c1', 'saar_on'))} usual; `mask_raw0_c3` − `dapo_c3` "
        f"{interval(paired(C, 'fresh', 'mask_raw0_c3', 'dapo_c3', 'saar_on'))} fresh, "
        f"{interval(paired(C, 'usual', 'mask_raw0_c3', 'dapo_c3', 'saar_on'))} usual",
        f"`mask_raw0_c1` {compute['mask_raw0_c1']}, `dapo_c3` {compute['dapo_c3']}, `mask_raw0_c3` "
        f"{compute['mask_raw0_c3']}, `keepcost_c1` {compute['keepcost_c1']}, `adaptive_c1` {compute['adaptive_c1']}",
        f"summed over training: {min(hacks):.0f}–{max(hacks):.0f} per arm",
        f"(`dapo_c3` − `dapo_c1`: {interval(paired(C, 'fresh', 'dapo_c3', 'dapo_c1'))} fresh, "
        f"{interval(paired(C, 'usual', 'dapo_c3', 'dapo_c1'))} usual)",
    ]
    lo, hi = medi["interaction"]["p_correct_all_clean"]["ci95"]
    assert lo < 0 < hi  # "not different in any contrast"
    assert all(r["saar_on"] == r["saar_off"] for arm in ("keepcost_c1", "adaptive_c1")
               for r in C["fresh"]["per_seed"][arm])  # "equal their SAAR-off ones in every seed"
    return claims


def test_the_rule_studys_results_table_and_figures_are_the_committed_report():
    results = RULE.split("## Results (read once")[1]
    rows = table(results, "| contrast | fresh split | usual split | reading (fresh) |")
    assert len(rows) == 7
    for label, fresh, usual, words in rows:
        names = re.findall(r"`(\w+)`", label)
        kind, name = (("contrast", "interaction") if label.startswith("interaction") else
                      ("vs_dapo", names[0]) if names[1] == "dapo_c1" and names[0] in ("keepcost_c1", "adaptive_c1")
                      else ("contrast", next(n for n, r in CONTRASTS.items()
                                             if set(r["weights"]) == set(names) and len(names) == 2)))
        f, u = figure(kind, name, "fresh"), figure(kind, name, "usual")
        assert (fresh, usual) == (interval(f), interval(u)), label
        assert words.startswith(reading(f)), label
        if reading(f) == "not different":
            assert words == f"not different (± {(f['ci95'][1] - f['ci95'][0]) / 2:.3f})", label
        else:
            n = sum(v > 0 if reading(f) == "higher" else v < 0 for v in f["values"])
            assert words == f"{reading(f)}, {n} of 6 seeds", label
    missing = [claim for claim in rule_study_claims() if flat(claim) not in flat(results)]
    assert not missing


def test_the_registration_is_unchanged_and_precedes_every_run():
    full_history()
    for commit, first, after in (("904830f", "# Part C", "## Amendments"), ("8a9a4e0", "## Amendments", "## Progress")):
        assert (git("show", "--name-only", "--format=", commit) or "").split() == ["docs/rule_study.md"]
        then = git("show", f"{commit}:docs/rule_study.md")
        assert then[then.index(first):then.index(after)] == RULE[RULE.index(first):RULE.index(after)], commit
    amended = int(git("log", "-1", "--format=%ct", "8a9a4e0"))  # the amendment's last edit, before its runs
    assert len(RECORDS) == 36
    for record in RECORDS:
        made_by = json.loads(record.read_text())["commit"]
        assert git("merge-base", "--is-ancestor", "904830f", made_by) is not None, record.name
        added = git("log", "--diff-filter=A", "--format=%ct", "--", str(record.relative_to(ROOT))).split()
        assert added and int(added[-1]) > amended, record.name
