"""Task loaders over fixture files in every format, malformed input, prompts and ``cleaner data inspect``.

The fixture files are written by ``tests.fixtures.formats`` into a temporary directory.
Run: ``pytest tests/test_datasets.py``.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli_data import app
from tasks.data.formats import DatasetError, TaskRow, load_many, load_tasks
from tasks.data.prompts import CHOICE_RULE, TOOLS, wrap_train_prompt
from tasks.rewards.registry import compute_reward
from tests.fixtures.formats import FORMATS, write_all, write_parquet


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("formats"))


def test_every_format_loads_into_task_rows(files):
    for fmt, path in files.items():
        tasks = load_tasks(path)
        assert len(tasks) == len(FORMATS[fmt]), fmt
        assert all(isinstance(t, TaskRow) and t.prompt[-1]["role"] == "user" for t in tasks)
        assert len({t.id for t in tasks}) == len(tasks)


def test_verl_rows(files):
    arith, dapo, code = load_tasks(files["verl"])
    assert (arith.id, arith.data_source, arith.ground_truth) == ("synthetic/arith/0", "synthetic/arith", "391")
    assert arith.prompt == FORMATS["verl"][0]["prompt"], "synthetic prompts are used as written"
    assert dapo.prompt[0]["content"].endswith("without any units.")
    assert "```python" in code.prompt[0]["content"] and code.extra_info["index"] == 2
    assert load_tasks(files["verl"], template=False)[1].prompt == FORMATS["verl"][1]["prompt"]


def test_aime_rows(files):
    a24 = load_tasks(files["aime2024"])
    a25 = load_tasks(files["aime2025"])
    assert [t.id for t in a24] == ["AIME2024/2024-I-1", "AIME2024/2024-I-2"]
    assert [t.ground_truth for t in a24] == ["24", "43"], "integer answers become strings"
    assert [t.data_source for t in a25] == ["AIME2025", "AIME2025"] and a25[1].ground_truth == "1001"
    content = a24[0].prompt[0]["content"]
    assert "Find the remainder when 2^{10}" in content and "\\boxed{" in content and a24[0].ability == "MATH"


def test_gpqa_rows(files):
    physics, chemistry = load_tasks(files["gpqa"])
    assert (physics.ground_truth, physics.ability, chemistry.ground_truth) == ("B", "Physics", "C")
    content = physics.prompt[0]["content"]
    assert content.startswith("Analyze and solve the following Physics problem") and content.endswith(CHOICE_RULE)


def test_gpqa_choices_column_is_formatted(tmp_path):
    row = {"problem": "Pick the prime.", "choices": ["4", "6", "7", "9"], "solution": "(C)", "domain": "Math"}
    task = load_tasks(write_parquet([row], tmp_path / "g.parquet"))[0]
    assert "(A) 4\n(B) 6\n(C) 7\n(D) 9" in task.prompt[0]["content"] and task.ground_truth == "C"


def test_livecodebench_rows(files):
    stdin_task, fn_task = load_tasks(files["livecodebench"])
    assert stdin_task.id == "livecodebench/abc001_a" and stdin_task.ground_truth["outputs"] == ["6\n", "20\n"]
    assert "Read the inputs from stdin" in stdin_task.prompt[0]["content"]
    assert fn_task.ground_truth["fn_name"] == "maxElement" and fn_task.extra_info["platform"] == "leetcode"
    assert "def maxElement(self, nums: List[int])" in fn_task.prompt[0]["content"]


def test_known_answers_grade_correct(files):
    tasks = load_many([files["aime2024"], files["aime2025"], files["gpqa"]])
    answers = {"AIME2024/2024-I-1": "24", "AIME2024/2024-I-2": "43", "AIME2025/0": "24", "AIME2025/1": "1001",
               "gpqa_diamond/0": "B", "gpqa_diamond/1": "C"}
    for task in tasks:
        good = compute_reward(task.data_source, f"so \\boxed{{{answers[task.id]}}}", task.ground_truth, task.extra_info)
        bad = compute_reward(task.data_source, "so \\boxed{A}" if "gpqa" in task.id else "\\boxed{7}",
                             task.ground_truth, task.extra_info)
        assert good.correct and not bad.correct, task.id


def test_jsonl_verl(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in FORMATS["verl"]) + "\n\n")
    assert [t.id for t in load_tasks(path)] == ["synthetic/arith/0", "math_dapo/1", "skywork_code/2"]


def _bad(tmp_path, rows, name="bad.parquet"):
    return write_parquet(rows, tmp_path / name)


@pytest.mark.parametrize(
    "rows,row,column,message",
    [
        ([FORMATS["aime2025"][0], {"id": 1, "problem": "x", "answer": None}], 1, "answer", "missing value"),
        ([{"id": 1, "problem": "  ", "answer": "3"}], 0, "problem", "empty string"),
        ([{"problem": "p", "solution": "photon", "domain": "Physics"}], 0, "solution", "option letter"),
        ([{"problem": "p", "solution": "E", "domain": "Physics", "choices": ["a", "b"]}], 0, "solution", "beyond"),
        ([{"problem": "p", "reward_model": "{not json", "extra_info": "{}"}], 0, "reward_model", "invalid JSON"),
        ([{"problem": "p", "reward_model": json.dumps({"ground_truth": {"inputs": ["1"], "outputs": []}})}],
         0, "reward_model.ground_truth", "1 inputs but 0 outputs"),
        ([{"data_source": "m", "prompt": "[]", "reward_model": {"ground_truth": "1"}}], 0, "prompt", "non-empty list"),
        ([{"data_source": "m", "prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule"}}],
         0, "reward_model", "ground_truth"),
        ([{"data_source": "m", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}],
         0, "prompt", "message 0"),
    ],
)
def test_malformed_rows_name_file_row_column(tmp_path, rows, row, column, message):
    path = _bad(tmp_path, rows)
    with pytest.raises(DatasetError, match=message) as info:
        load_tasks(path)
    err = info.value
    assert (err.path, err.row, err.column) == (str(path), row, column)
    assert str(path) in str(err) and f"row {row}" in str(err) and repr(column) in str(err)


def test_file_level_errors(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        load_tasks(tmp_path / "nope.parquet")
    with pytest.raises(DatasetError, match="unknown task format"):
        load_tasks(_bad(tmp_path, [{"question": "q"}]))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet"):
        load_tasks(garbage)
    lines = tmp_path / "broken.jsonl"
    lines.write_text(json.dumps(FORMATS["aime2025"][0]) + "\n{oops\n")
    with pytest.raises(DatasetError, match=r"row 1: line 2 is not JSON"):
        load_tasks(lines)
    dup = [FORMATS["aime2025"][0], FORMATS["aime2025"][0]]
    with pytest.raises(DatasetError, match="duplicate task id 'AIME2025/0'"):
        load_tasks(_bad(tmp_path, dup, "dup.parquet"))


def test_prompt_format_and_tool_schema():
    assert TOOLS[0]["function"]["name"] == "code_interpreter"
    assert list(TOOLS[0]["function"]["parameters"]["properties"]) == ["code"]
    wrapped = wrap_train_prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}], "orz_math")
    assert wrapped[0] == {"role": "system", "content": "s"}
    assert wrapped[1]["content"].startswith("Analyze and solve") and "2+2?" in wrapped[1]["content"]
    with pytest.raises(ValueError, match="no user message"):
        wrap_train_prompt([{"role": "system", "content": "s"}], "math")


def test_cli_inspect(files):
    result = CliRunner().invoke(app, ["inspect", str(files["livecodebench"]), "--rows", "1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "format livecodebench, 2 rows" in result.output
    assert "problem, data_source" in result.output or "data_source, problem" in result.output
    assert "livecodebench/abc001_a" in result.output and "livecodebench/lc-1" not in result.output


def test_cli_inspect_malformed_exits_1(tmp_path):
    path = _bad(tmp_path, [{"id": 1, "problem": "x", "answer": None}])
    result = CliRunner().invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "row 0" in result.output and "'answer'" in result.output
