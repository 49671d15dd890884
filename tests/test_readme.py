"""The README is the front door: short, two commands on its first screen, links that resolve, and every result it
quotes equal to the committed study it comes from (``docs/regimes.json``, the follow-up's ``docs/generalisation/``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
