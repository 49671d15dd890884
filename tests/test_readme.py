"""The README is the front door: short, two commands on its first screen, links that resolve, and every result it
quotes equal to the committed study it comes from (``docs/regimes.json``, the follow-up's ``docs/generalisation/``).
The follow-up's own results (docs/generalisation.md) are held to the same rule: every figure they and the README
quote is recomputed here from the committed JSON, every commit they cite is in the history, and the registered text
is byte for byte what its registration commit holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tasks.reports.paired import mean_se_ci

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# README results table: the start of a row's first two cells -> (study section, arm) in docs/regimes.json.
ROWS = {
    ("4 turns: a failed call costs little", "CLEANER as published"): ("t4", "cleaner"),
    ("4 turns", "masked CLEANER"): ("t4", "mask_raw0"),
    ("4 turns, registered confirm on new seeds", "masked CLEANER"): ("t4_confirm", "mask_raw0"),
    ("2 turns: a failed call costs the answer", "CLEANER as published"): ("t2", "cleaner"),
    ("2 turns", "masked CLEANER"): ("t2", "mask_raw0"),
}

# README out-of-sample table: a row's first two cells -> (follow-up study, arm) in docs/generalisation/<study>.json.
FRESH_ROWS = {
    ("4 turns, 72 steps", "masked CLEANER"): ("t4_long", "mask_raw0"),
    ("4 turns, 72 steps", "DAPO, failed attempts out of the loss"): ("t4_long", "dapo_filter"),
    ("chains of 2–3 calls, 24 steps", "masked CLEANER"): ("multicall", "mask_raw0"),
    ("chains of 2–3 calls, 24 steps", "CLEANER as published"): ("multicall", "cleaner"),
}


def signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def test_short_with_the_two_commands_on_its_first_screen():
    lines = README.splitlines()
    assert len(lines) <= 150
    first_screen = "\n".join(lines[:12])
    assert re.findall(r"^make \w+", first_screen, re.M) == ["make demo", "make test"]
    assert "![held-out pass@1" in README  # the results figure
    assert (ROOT / "docs/img/results.png").exists()


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) + re.findall(r'src="([^"]+)"', README)
    local = [link for link in links if not link.startswith("http")]
    assert len(local) > 15
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing


def test_the_results_table_is_the_committed_study():
    study = json.loads((ROOT / "docs/regimes.json").read_text())
    table = README.split("| task | setting | final pass@1 − DAPO | pairs |")[1].split("\n\n")[0]
    rows = [[c.strip().strip("*") for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ") and "[" in line]
    assert len(rows) == len(ROWS)
    for task, setting, difference, pairs in rows:
        regime, arm = ROWS[next(key for key in ROWS if key == (task, setting.split(" (")[0]))]
        report = study[regime]["report"] if regime == "t4_confirm" else study[regime]["phase2"]["report_all_arms"]
        paired = report["paired_pass_at_1"][arm]
        lo, hi = paired["ci95"]
        assert difference == f"{signed(paired['mean'])} [{signed(lo)}, {signed(hi)}]", (task, setting)
        assert int(pairs) == paired["n"]
    assert "+0.051 [+0.028, +0.074]" in README  # the confirm, by hand from docs/regimes.md


def interval(row: dict) -> str:
    lo, hi = row["ci95"]
    return f"{signed(row['mean'])} [{signed(lo)}, {signed(hi)}]"


def test_the_out_of_sample_table_is_every_committed_follow_up():
    from tasks.reports.results_figure import follow_ups, fresh_rows

    expected = {(row["study"], row["arm"]): row for name, compare in follow_ups(ROOT).items()
                for row in fresh_rows(name, compare)}
    assert ("t4_long", "mask_raw0") in expected
    table = README.split("| study | setting | fresh split | usual split | pairs |")[1].split("\n\n")[0]
    rows = [[c.strip().strip("*") for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ") and "[" in line]
    assert sorted(FRESH_ROWS[study, setting] for study, setting, *_ in rows) == sorted(expected)
    for study, setting, fresh, usual, pairs in rows:
        row = expected[FRESH_ROWS[study, setting]]
        assert (fresh, usual) == (interval(row["fresh"]), interval(row["usual"])), (study, setting)
        assert int(pairs) == row["fresh"]["pairs"] == row["usual"]["pairs"]
    assert "+0.022 [+0.007, +0.037]" in README  # Part A's headline, by hand from docs/generalisation.md


def test_the_recipe_tables_evidence_is_quoted_from_the_results_tables():
    """Every interval the "which setting" table cites is one of the results tables' own cells."""
    results, recipe = README.split("### Which setting for which task")
    recipe = recipe.split("\n\n", 2)[1]
    pattern = r"[+−]\d\.\d{3} \[[+−]\d\.\d{3}, [+−]\d\.\d{3}\]"
    cited = re.findall(pattern, recipe)
    assert len(cited) >= 5 and set(cited) <= set(re.findall(pattern, results))


def test_the_figure_reads_the_same_study():
    from tasks.reports.results_figure import results_rows

    rows = {(r["regime"], r["arm"]): r for r in results_rows(json.loads((ROOT / "docs/regimes.json").read_text()))}
    assert set(rows) == set(ROWS.values())
    assert round(rows["t4_confirm", "mask_raw0"]["mean"], 3) == 0.051 and rows["t4_confirm", "mask_raw0"]["pairs"] == 6


def test_the_figure_command_refuses_arguments_with_its_usage():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tasks.reports.results_figure", "out.png"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "writes docs/img/results.png" in done.stderr


# --- the follow-up's quoted figures (README and docs/generalisation.md), each recomputed from the committed JSON ---

GENERALISATION = (ROOT / "docs/generalisation.md").read_text()


def flat(text: str) -> str:
    """Text with every run of whitespace one space, so a phrase is found across the docs' line wraps."""
    return " ".join(text.split())


def follow_up(name: str) -> dict:
    return json.loads((ROOT / f"docs/generalisation/{name}.json").read_text())


def finals(compare: dict, split: str, arm: str, mode: str = "saar_off") -> dict[int, float]:
    """Per seed: an arm's final pass@1 on ``split`` ("fresh" or "usual") in ``mode``, from the report's per-seed rows."""
    if split == "fresh":
        return {r["seed"]: r[mode] for r in compare["fresh"]["per_seed"][arm]}
    key = {"saar_off": "final_pass_at_1", "saar_on": "final_pass_at_1_saar_on"}[mode]
    return {r["seed"]: r[key] for r in compare["per_seed"][arm]}


def paired(compare: dict, split: str, arm: str, base: str, mode: str = "saar_off", base_mode: str | None = None) -> dict:
    """``arm`` in ``mode`` − ``base`` in ``base_mode`` (default the same mode), paired by seed, as the report pairs."""
    a, b = finals(compare, split, arm, mode), finals(compare, split, base, base_mode or mode)
    assert sorted(a) == sorted(b) and len(a) == 6
    return mean_se_ci([a[s] - b[s] for s in sorted(a)])


def above(d: dict) -> int:
    return sum(v > 0 for v in d["values"])


def test_the_paired_helper_is_the_reports_own_pairing():
    """The helper below the doc checks gives the report's own intervals where the report has them."""
    for name in ("t4_long", "multicall"):
        compare = follow_up(name)
        for arm, report in compare["fresh"]["paired"].items():
            for mine, theirs in [(paired(compare, "fresh", arm, "dapo"), report["internalisation"]),
                                 (paired(compare, "fresh", arm, "dapo", "saar_on", "saar_off"), report["headline"]),
                                 (paired(compare, "usual", arm, "dapo"), compare["paired_pass_at_1"][arm])]:
                assert interval(mine) == interval(theirs), (name, arm)


def test_the_generalisation_tables_are_the_committed_json():
    """Every "| `a` − `b` | fresh | usual |" row of the two results tables is the seed-paired difference."""
    for part, name in [("## Part A — results", "t4_long"), ("## Part B — results", "multicall")]:
        section = GENERALISATION.split(part)[1].split("\n## ")[0]
        rows = re.findall(r"^\| `(\w+)` − `(\w+)` \| \**([^|*]+?)\**: [\w ]+ \| ([^|]+?): [\w ]+ \|$", section, re.M)
        assert len(rows) == 3, part
        for arm, base, fresh, usual in rows:
            compare = follow_up(name)
            assert fresh == interval(paired(compare, "fresh", arm, base)), (part, arm, base)
            assert usual == interval(paired(compare, "usual", arm, base)), (part, arm, base)


def seed_mean_gaps(compare: dict, arm: str) -> list[str]:
    curves = {a: {p["policy_version"]: p["mean"] for p in c["accuracy"]} for a, c in compare["curves"].items()}
    return [signed(curves[arm][step] - curves["dapo"][step]) for step in (24, 48, 72)]


def part_a_claims() -> list[str]:
    t4 = follow_up("t4_long")
    primary = paired(t4, "fresh", "mask_raw0", "dapo")
    loo = [mean_se_ci(primary["values"][:i] + primary["values"][i + 1:])["ci95"][0] for i in range(6)]
    prompt_sets = mean_se_ci([f - u for f, u in zip(primary["values"], paired(t4, "usual", "mask_raw0", "dapo")["values"])])
    usual72 = paired(t4, "usual", "mask_raw0", "dapo")
    assert usual72["ci95"][0] <= 0 < primary["ci95"][0]  # the registered lasting rule says "not lasting"
    filt, alone = paired(t4, "fresh", "mask_raw0", "dapo_filter"), paired(t4, "fresh", "dapo_filter", "dapo")
    assert filt["ci95"][0] > 0  # the registered reading: "purification adds to the filter"
    ends = {round(t4["final"][arm]["pass_at_1"], 2) for arm in ("dapo", "mask_raw0")}
    assert len(ends) == 1
    g24, g48, g72 = seed_mean_gaps(t4, "mask_raw0")
    assert g72 == signed(usual72["mean"])
    gaps = f"went {g24} (step 24), {g48} (48), {g72} (72), both arms ending at ≈ {ends.pop():.2f}"
    start = {split: initial["saar_on"] - initial["saar_off"]
             for split, initial in [("fresh", t4["fresh"]["initial"]), ("usual", t4["initial_settings"])]}
    assert signed(start["fresh"]) == signed(start["usual"])
    steps = [r["steps_to_baseline_final"] for r in t4["per_seed"]["mask_raw0"]]
    assert (t4["steps_to_baseline_final"]["mask_raw0"], steps.count(72), steps.count(None), steps.count(24)) == (72, 5, 1, 0)
    ratio = {arm: t4["compute"][arm] for arm in ("mask_raw0", "dapo_filter")}
    assert abs(ratio["mask_raw0"]["sampled_tokens_ratio"] - 1) < 0.01  # "within 1 % of DAPO's compute"
    return [
        f"leaving out any one seed puts the lower bound at {signed(min(loo))} to {signed(max(loo))}",
        f"the seed-mean gap there {gaps}",
        f"The seed-mean gap {gaps}",
        f"purification adds to the filter: masked CLEANER − the filter arm is {interval(filt)} on the fresh split, "
        f"{above(filt)} of 6 seeds",
        f"Filter: purification adds to the filter** (the registered reading: `mask_raw0` − `dapo_filter` excludes 0 "
        f"above), {interval(filt)} on the fresh split, {above(filt)} of 6 seeds. The filter alone is lower than DAPO, "
        f"{interval(alone)} ({6 - above(alone)} of 6 seeds below)",
        f"the fresh-split gap exceeds the usual-split one by {interval(prompt_sets)}",
        f"At step 72 {interval(usual72)} does not exclude 0, so by the registered rule the gain does not last",
        f"usual prompts: {interval(usual72)} (not lasting by the registered rule)",
        f"**Primary (registered): `mask_raw0` ends higher than DAPO on the fresh split at 72 steps**, "
        f"{interval(primary)}, {above(primary)} of 6 seeds",
        f"(`mask_raw0` SAAR on − `dapo` SAAR off): {interval(paired(t4, 'fresh', 'mask_raw0', 'dapo', 'saar_on', 'saar_off'))}"
        f" on the fresh split, {interval(paired(t4, 'usual', 'mask_raw0', 'dapo', 'saar_on', 'saar_off'))} on the usual "
        f"one, beside the starting policy's SAAR-on − SAAR-off gap of {signed(start['fresh'])} on each",
        f"Like for like (both arms SAAR on): {interval(paired(t4, 'fresh', 'mask_raw0', 'dapo', 'saar_on'))} fresh, "
        f"{interval(paired(t4, 'usual', 'mask_raw0', 'dapo', 'saar_on'))} usual",
        f"masked CLEANER sampled ×{ratio['mask_raw0']['sampled_tokens_ratio']:.3f} DAPO's policy tokens, the filter arm "
        f"×{ratio['dapo_filter']['sampled_tokens_ratio']:.3f}",
        f"`mask_raw0` sampled ×{ratio['mask_raw0']['sampled_tokens_ratio']:.3f} DAPO's policy tokens and made "
        f"×{ratio['mask_raw0']['sandbox_calls_ratio']:.3f} its sandbox calls, `dapo_filter` "
        f"×{ratio['dapo_filter']['sampled_tokens_ratio']:.3f} and ×{ratio['dapo_filter']['sandbox_calls_ratio']:.3f}, "
        "so `mask_raw0` − `dapo` compares within 1 % of DAPO's compute",
        "5 of 6 seeds at 72 and one never; no seed at step 24",
        "masked CLEANER reaches DAPO's final only at step 72",
    ]


def part_b_claims() -> list[str]:
    chain = follow_up("multicall")
    gate = json.loads((ROOT / "docs/regimes_gate_chain.json").read_text())["measures"]
    compute = chain["compute"]
    tokens = [compute[arm]["sampled_tokens_ratio"] for arm in ("mask_raw0", "cleaner")]
    calls = [compute[arm]["sandbox_calls_ratio"] for arm in ("mask_raw0", "cleaner")]
    first = chain["paired_first_attempt_success"]
    # SAAR off every call is a first attempt, so one minus first-call success is the failure rate per call
    assert chain["initial"]["eval/saar_off/tools/calls"] == chain["initial"]["eval/saar_off/tools/first_attempt_total"]
    failure = ", ".join(f"`{arm}` {1 - chain['final'][arm]['first_attempt_success']:.3f}"
                        for arm in ("dapo", "mask_raw0", "cleaner"))
    start = chain["fresh"]["initial"]["saar_on"] - chain["fresh"]["initial"]["saar_off"]
    headline = {arm: interval(paired(chain, "fresh", arm, "dapo", "saar_on", "saar_off")) for arm in ("mask_raw0", "cleaner")}
    alike = {arm: paired(chain, "fresh", arm, "dapo", "saar_on") for arm in ("mask_raw0", "cleaner")}
    assert all(d["ci95"][1] < 0 for d in alike.values())  # "both are lower"
    cap = f"{round(100 * gate['turn_cap'])} %"
    return [
        f"`mask_raw0` {headline['mask_raw0']}, `cleaner` {headline['cleaner']}, beside the starting policy's own "
        f"SAAR-on − SAAR-off gap of {signed(start)}",
        f"both are lower than DAPO: `mask_raw0` {interval(alike['mask_raw0'])}, `cleaner` {interval(alike['cleaner'])}",
        f"against DAPO: {interval(first['mask_raw0'])} (`mask_raw0`), {interval(first['cleaner'])} (`cleaner`)",
        f"one minus it: {failure} (seed means)",
        f"×{tokens[0]:.2f} (`mask_raw0`) and ×{tokens[1]:.2f} (`cleaner`) DAPO's sampled tokens, ×{calls[0]:.2f} and "
        f"×{calls[1]:.2f} its sandbox calls",
        f"`mask_raw0` ×{tokens[0]:.3f}, `cleaner` ×{tokens[1]:.3f}; sandbox calls `mask_raw0` ×{calls[0]:.3f}, "
        f"`cleaner` ×{calls[1]:.3f}",
        f"the budget cut {cap} of the starting policy's gate trajectories",
        f"it cut {cap} of the starting policy's gate trajectories",
        f"both CLEANER settings end lower than DAPO, at ×{min(tokens):.2f}–{max(tokens):.2f} its sampled tokens",
    ]


def test_every_quoted_follow_up_figure_recomputes_from_the_committed_json():
    docs = flat(README) + "\n" + flat(GENERALISATION)
    missing = [claim for claim in part_a_claims() + part_b_claims() if flat(claim) not in docs]
    assert not missing


def test_the_seed_advice_quotes_the_observed_half_widths():
    """The "your own data" row gives the 95 % half-widths 6 pairs had in the README's own tables (Part C's two-arm
    differences too; its interaction is a sum over four arms)."""
    from tasks.reports.results_figure import follow_ups, fresh_rows, results_rows

    study = json.loads((ROOT / "docs/regimes.json").read_text())
    widths = [r["ci95"][1] - r["mean"] for r in results_rows(study) if r["pairs"] == 6]
    widths += [row[split]["ci95"][1] - row[split]["mean"] for name, compare in follow_ups(ROOT).items()
               for row in fresh_rows(name, compare) for split in ("fresh", "usual") if row[split]["pairs"] == 6]
    part_c = follow_up("multicall_c")
    two_arm = [row["outcome"][split] for row in part_c["contrasts"]["by_name"].values() if len(row["weights"]) == 2
               for split in ("fresh", "usual")]
    two_arm += [d for arm in ("keepcost_c1", "adaptive_c1")
                for d in (part_c["fresh"]["paired"][arm]["internalisation"], part_c["paired_pass_at_1"][arm])]
    widths += [d["ci95"][1] - d["mean"] for d in two_arm if d["n"] == 6]
    assert len(widths) == 11 + 12
    assert (f"≥ 6 seeds: with 6, the 95 % intervals of two-arm differences above had half-widths of "
            f"{min(widths):.3f}–{max(widths):.3f} |") in README
    assert "±0.02" not in README


def test_what_the_docs_say_cannot_be_computed_is_not_in_the_committed_json():
    """Part A's paired intervals at steps 24 and 48 and Part B's suspected-hack counts are reported as not computable
    from committed data; once the JSON carries them, this fails and the docs must report them."""
    t4, chain = follow_up("t4_long"), follow_up("multicall")
    assert all(set(point) == {"policy_version", "mean", "std", "n"}
               for curve in t4["curves"].values() for point in curve["accuracy"])
    assert not any(re.search(r"_(24|48)\b|by_step", key) for row in t4["per_seed"]["mask_raw0"] for key in row)
    assert "suspected_hacks" not in json.dumps(chain)
    assert "cannot be computed from committed data" in flat(GENERALISATION.split("## Part A — results")[1])
    assert "Suspected hacks:** not reported" in flat(GENERALISATION)
    assert "the committed JSON keeps no per-seed values at 24 and 48, so no paired interval there" in flat(README)


def git(*args: str) -> str | None:
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    return done.stdout if done.returncode == 0 else None


def full_history() -> None:
    import pytest

    if (git("rev-parse", "--is-shallow-repository") or "").strip() != "false":
        pytest.skip("needs a git checkout with its full history")


def test_every_commit_the_study_cites_is_in_the_history():
    full_history()
    cited = set(re.findall(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7}\b", GENERALISATION + README))
    assert len(cited) >= 8
    assert not [h for h in sorted(cited) if git("cat-file", "-e", f"{h}^{{commit}}") is None]


# each registration: the results section that names its commit, the registered text's first and next headings
REGISTRATIONS = [("## Part A — results", "# Masked CLEANER", "## Part B — the multi-call regime"),
                 ("## Part B — results", "## Part B — registration", "## The recipe")]


def test_the_registered_text_is_unchanged_since_the_commit_the_results_name():
    """The results name their registration's commit; that commit holds only this file, and the registered text is
    byte for byte what it committed."""
    full_history()
    for results, first, after in REGISTRATIONS:
        commit = re.search(r"registered in ([0-9a-f]{7})", GENERALISATION.split(results)[1]).group(1)
        assert (git("show", "--name-only", "--format=", commit) or "").split() == ["docs/generalisation.md"]
        then = git("show", f"{commit}:docs/generalisation.md")
        section = [text[text.index(first):text.index(after)] for text in (then, GENERALISATION)]
        assert section[0] == section[1], (commit, first)
