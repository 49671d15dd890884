"""``cleaner data to-verl``: every supported format written as verl's RL parquet, read back as the same tasks.

The inputs are the fixture files of every format (``tests.fixtures.formats`` and the HumanEval sample); the output
is checked column by column against verl's RL format and, through ``load_tasks``, against the inputs' own tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli_data import app
from tasks.data.formats import FINAL_PROMPT, DatasetError, load_tasks
from tasks.data.prompts import wrap_train_prompt
from tasks.data.verl_export import export_verl
from tests.fixtures.formats import FORMATS, write_all, write_parquet

HUMANEVAL = Path(__file__).parent / "fixtures" / "humaneval"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    found = write_all(tmp_path_factory.mktemp("formats"))
    found.update({p.stem: p for p in sorted(HUMANEVAL.glob("*.jsonl*"))[:1]})
    return found


def _same(a, b) -> bool:
    """Ground truths alike: equal, or an object and its JSON text (verl's convention for code rows)."""
    return a == b or (not isinstance(a, str) and isinstance(b, str) and json.loads(b) == a)


def test_every_format_round_trips_through_the_verl_parquet(files, tmp_path):
    out = tmp_path / "train.parquet"
    result = export_verl(list(files.values()), out)
    originals = [t for path in files.values() for t in load_tasks(path)]
    assert result["rows"] == len(originals) and set(result["formats"].values()) >= set(FORMATS)
    table = pq.read_table(out)
    assert set(table.column_names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert all(isinstance(gt, str) for gt in table.column("reward_model").combine_chunks().field("ground_truth").to_pylist())
    back = load_tasks(out)
    assert [t.id for t in back] == [t.id for t in originals]
    for a, b in zip(originals, back):
        assert (b.data_source, b.ability, b.prompt) == (a.data_source, a.ability, a.prompt), a.id
        assert _same(a.ground_truth, b.ground_truth), a.id
    written = table.to_pylist()
    dapo = next(r for r in written if r["data_source"] == "math_dapo")
    assert dapo["prompt"] == FORMATS["verl"][1]["prompt"], "a verl row keeps its prompt; the reader wraps it"
    assert back[1].prompt == wrap_train_prompt(dapo["prompt"], "math_dapo")
    aime = next(r for r in written if r["data_source"] == "AIME2024")
    assert aime["extra_info"][FINAL_PROMPT] is True and aime["extra_info"]["index"] == "2024-I-1"
    assert "\\boxed{" in aime["prompt"][0]["content"] and aime["reward_model"] == {"style": "rule", "ground_truth": "24"}


def test_ids_must_be_unique_across_inputs(files, tmp_path):
    copy = write_parquet(FORMATS["aime2024"], tmp_path / "again.parquet")
    with pytest.raises(DatasetError, match=r"again.parquet: row 0, column 'id': task id 'AIME2024/2024-I-1' is also in"):
        export_verl([files["aime2024"], copy], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_the_cli_writes_it_and_names_a_bad_row(files, tmp_path):
    runner = CliRunner()
    out = tmp_path / "val.parquet"
    res = runner.invoke(app, ["to-verl", str(files["gpqa"]), str(files["aime2025"]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote {out}: 4 rows from gpqa.parquet (gpqa), aime2025.parquet (aime2025)" in " ".join(res.output.split())
    bad = write_parquet([{**FORMATS["gpqa"][0], "solution": "7"}], tmp_path / "bad.parquet")
    res = runner.invoke(app, ["to-verl", str(bad), "--out", str(tmp_path / "x.parquet")])
    assert res.exit_code == 1 and "row 0, column 'solution'" in res.output
