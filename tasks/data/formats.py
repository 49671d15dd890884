"""Task loaders: verl RL parquet, AIME 2024/2025, GPQA and LiveCodeBench into one ``TaskRow`` type.

``load_tasks(path)`` detects the format from the columns and returns ``list[TaskRow]``
(prompt messages, data_source, ability, ground_truth, extra_info, id). Formats:

- **verl**: ``prompt`` (chat messages), ``data_source``, ``ability``,
  ``reward_model.ground_truth``, ``extra_info`` (struct or JSON string);
- **aime2024**: ``Problem`` / ``Answer``; **aime2025**: ``problem`` / ``answer``;
- **gpqa**: ``problem``, ``solution`` (the option letter), ``domain``; options either inside
  ``problem`` already or given as ``choices`` (list) and appended as ``(A) ...``;
- **livecodebench**: ``problem``, ``reward_model`` and ``extra_info`` as JSON strings
  (``ground_truth`` holds ``inputs``/``outputs`` and, for functional tests, ``fn_name``);
- **humaneval**: ``task_id``, ``prompt`` (code: imports, helper definitions, the entry point's
  signature and docstring), ``entry_point``, ``test`` (``check(candidate)``). The ground truth is
  the assert format: ``test_code``, ``entry_point``, the prompt's imports as ``import_prefix`` and
  its other definitions as ``helpers``.

Code ground truths in the assert format (``test_code``, ``entry_point``, optional ``import_prefix``)
take the definitions the test uses but does not make (HumanEval's ``poly``, ``encode_cyclic``) from
the trusted field ``helpers`` (source code, run before the test), never from the answer: the
humaneval loader fills it from the prompt; a verl row must carry it (the code reward names what is
missing).

Prompts come from ``tasks.data.prompts`` (the paper's format). Files are Parquet (read with
pyarrow) or JSON lines (``.jsonl``, or gzipped ``.jsonl.gz``). Malformed input raises ``DatasetError`` naming the file, row and
column. Run ``cleaner data inspect FILE`` for a summary of any of these files.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.data import prompts


class DatasetError(ValueError):
    """A task file is malformed; names the file, the 0-based row and the column."""

    def __init__(self, path: str | Path, row: int | None, column: str | None, message: str):
        where = str(path)
        if row is not None:
            where += f": row {row}"
        if column is not None:
            where += f", column {column!r}" if row is not None else f": column {column!r}"
        super().__init__(f"{where}: {message}")
        self.path, self.row, self.column = str(path), row, column


@dataclass(frozen=True)
class TaskRow:
    """One task, whatever file it came from."""

    id: str
    data_source: str
    ability: str
    prompt: list[dict]
    ground_truth: Any
    extra_info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "data_source": self.data_source,
            "ability": self.ability,
            "prompt": self.prompt,
            "ground_truth": self.ground_truth,
            "extra_info": self.extra_info,
        }


def read_records(path: str | Path) -> tuple[list[str], list[dict]]:
    """Column names and rows (as dicts) of a Parquet or JSON-lines file."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(path, None, None, "file not found")
    if path.suffix in (".jsonl", ".ndjson", ".json") or "".join(path.suffixes[-2:]) == ".jsonl.gz":
        return _read_jsonl(path)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:
        raise DatasetError(path, None, None, f"not a readable Parquet file ({type(err).__name__}: {err})") from None
    return list(table.column_names), table.to_pylist()


def _read_jsonl(path: Path) -> tuple[list[str], list[dict]]:
    rows: list[dict] = []
    columns: dict[str, None] = {}
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(path, len(rows), None, f"line {i + 1} is not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(path, len(rows), None, f"line {i + 1} is not a JSON object")
            columns.update(dict.fromkeys(row))
            rows.append(row)
    return list(columns), rows


def detect_format(columns: list[str]) -> str:
    """``verl`` | ``aime2024`` | ``aime2025`` | ``gpqa`` | ``livecodebench`` | ``humaneval`` from the column names."""
    cols = set(columns)
    if {"task_id", "prompt", "entry_point", "test"} <= cols:
        return "humaneval"
    if {"prompt", "reward_model"} <= cols:
        return "verl"
    if {"Problem", "Answer"} <= cols:
        return "aime2024"
    if {"problem", "reward_model"} <= cols:
        return "livecodebench"
    if {"problem", "solution", "domain"} <= cols:
        return "gpqa"
    if {"problem", "answer"} <= cols:
        return "aime2025"
    raise ValueError(f"unknown task format: columns {sorted(cols)}")


class _Row:
    """Field access for one raw row that raises ``DatasetError`` naming file, row and column."""

    def __init__(self, path: Path, index: int, raw: dict):
        self.path, self.index, self.raw = path, index, raw

    def error(self, column: str, message: str) -> DatasetError:
        return DatasetError(self.path, self.index, column, message)

    def get(self, column: str, kind: type | tuple = str, *, default: Any = ..., allow_empty: bool = False) -> Any:
        value = self.raw.get(column)
        if value is None:
            if default is not ...:
                return default
            raise self.error(column, "missing value")
        if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, kind):
            raise self.error(column, f"expected {_kind_name(kind)}, got {type(value).__name__}")
        if not allow_empty and isinstance(value, str) and not value.strip():
            raise self.error(column, "empty string")
        return value

    def json(self, column: str, *, default: Any = ...) -> Any:
        value = self.raw.get(column)
        if value is None and default is not ...:
            return default
        if isinstance(value, (dict, list)):
            return value
        if not isinstance(value, str):
            raise self.error(column, f"expected a JSON string or an object, got {type(value).__name__}")
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise self.error(column, f"invalid JSON ({err.msg} at char {err.pos})") from None

    def row_id(self, data_source: str, extra: dict) -> str:
        return task_id(data_source, extra, self.raw.get("id"), self.index)


ID_KEYS = ("id", "index", "question_id", "task_id")
"""``extra_info`` keys that name a row, in the order ``task_id`` looks for them."""


def task_id(data_source: str, extra: dict, row_id: Any = None, position: int | None = None) -> str | None:
    """A row's task id, ``{data_source}/{key}``: the first of ``extra_info``'s ``ID_KEYS``, else the row's own
    ``id`` column, else its position in the file (``None`` when that is unknown too). The raw-share draw is keyed on
    it, so the verl agent loop (``tasks.training.verl_loop.prompt_item``) names its rows with this same function."""
    for key in ID_KEYS:
        if extra.get(key) is not None:
            return f"{data_source}/{extra[key]}"
    if row_id is not None:
        return f"{data_source}/{row_id}"
    return None if position is None else f"{data_source}/{position}"


def _kind_name(kind) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def _messages(row: _Row, column: str) -> list[dict]:
    value = row.raw.get(column)
    if isinstance(value, str):
        value = row.json(column)
    if not isinstance(value, list) or not value:
        raise row.error(column, "expected a non-empty list of chat messages")
    out = []
    for j, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise row.error(column, f"message {j} must have string 'role' and 'content'")
        out.append({"role": msg["role"], "content": msg["content"]})
    return out


UNWRAPPED = ("synthetic/", "synthetic-chain/")
"""Data sources whose prompts are used as written (the tiny model's synthetic tasks, single-call and chain): no
reference instruction wrapper."""


FINAL_PROMPT = "cleaner_final_prompt"
"""An ``extra_info`` key: when true, the row's prompt is already what the policy sees (``tasks.data.verl_export``
wrote it from another format, whose loader made the prompt) and no wrapper is added."""


def train_messages(messages: list[dict], data_source: str, extra_info: dict) -> list[dict]:
    """A verl-format row's prompt as the policy sees it: the paper's wrapper (``prompts.wrap_train_prompt``) unless
    the data source carries its own prompt (``UNWRAPPED``) or the row says its prompt is final (``FINAL_PROMPT``)."""
    if data_source.startswith(UNWRAPPED) or extra_info.get(FINAL_PROMPT):
        return [dict(m) for m in messages]
    return prompts.wrap_train_prompt(messages, data_source)


def _verl_row(row: _Row, *, template: bool) -> TaskRow:
    source = row.get("data_source")
    reward_model = row.json("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise row.error("reward_model", "expected an object with a 'ground_truth' field")
    truth = reward_model["ground_truth"]
    if truth is None or (isinstance(truth, str) and not truth.strip()):
        raise row.error("reward_model.ground_truth", "missing value")
    extra = row.json("extra_info", default={}) or {}
    if not isinstance(extra, dict):
        raise row.error("extra_info", "expected an object")
    messages = _messages(row, "prompt")
    if template:
        messages = train_messages(messages, source, extra)
    ability = row.get("ability", default="math")
    return TaskRow(row.row_id(source, extra), source, ability, messages, truth, extra)


def _aime_row(row: _Row, problem_col: str, answer_col: str, default_source: str) -> TaskRow:
    source = row.get("data_source", default=default_source)
    problem = row.get(problem_col)
    answer = str(row.get(answer_col)).strip()
    extra = {k: v for k, v in row.raw.items() if k in ("ID", "id", "Year", "url", "Solution") and v is not None}
    key = row.raw.get("ID", row.raw.get("id"))
    if key is not None:
        extra["id"] = key
    return TaskRow(row.row_id(source, extra), source, "MATH", prompts.math_prompt(problem), answer, extra)


def _gpqa_row(row: _Row) -> TaskRow:
    source = row.get("data_source", default="gpqa_diamond")
    problem, domain = row.get("problem"), row.get("domain")
    choices = row.get("choices", (list, tuple), default=None)
    if choices is not None:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise row.error("choices", "expected a non-empty list of strings")
        problem = prompts.format_choices(problem, list(choices))
    solution = row.get("solution").strip().strip("()").strip()
    if len(solution) != 1 or not solution.isalpha():
        raise row.error("solution", f"expected an option letter, got {row.raw['solution']!r}")
    if choices is not None and ord(solution.upper()) - ord("A") >= len(choices):
        raise row.error("solution", f"letter {solution!r} is beyond the {len(choices)} choices")
    extra = {"domain": domain}
    if row.raw.get("id") is not None:
        extra["id"] = row.raw["id"]
    return TaskRow(row.row_id(source, extra), source, domain, prompts.choice_prompt(problem, domain), solution.upper(), extra)


def _lcb_row(row: _Row) -> TaskRow:
    source = row.get("data_source", default="livecodebench")
    problem = row.get("problem")
    reward_model = row.json("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except json.JSONDecodeError as err:
            raise row.error("reward_model.ground_truth", f"invalid JSON ({err.msg})") from None
    if not isinstance(truth, dict):
        raise row.error("reward_model.ground_truth", "expected an object with 'inputs' and 'outputs'")
    inputs, outputs = truth.get("inputs"), truth.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        raise row.error("reward_model.ground_truth", "'inputs' and 'outputs' must be non-empty lists")
    if len(inputs) != len(outputs):
        raise row.error("reward_model.ground_truth", f"{len(inputs)} inputs but {len(outputs)} outputs")
    extra = row.json("extra_info", default={}) or {}
    if not isinstance(extra, dict):
        raise row.error("extra_info", "expected a JSON object")
    starter = extra.get("starter_code") or None
    messages = prompts.code_prompt(problem, inputs, outputs, starter_code=starter if truth.get("fn_name") else None)
    ability = row.get("ability", default="code")
    return TaskRow(row.row_id(source, extra), source, ability, messages, truth, extra)


def prompt_definitions(prompt: str, entry_point: str) -> tuple[str, str]:
    """The imports and the other definitions of a HumanEval-style code prompt (the entry point left out):
    ``import_prefix`` and ``helpers`` of its ground truth. ``ValueError`` when it does not parse."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError as err:
        raise ValueError(f"prompt is not Python ({err.msg}, line {err.lineno})") from None
    body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == entry_point)]
    if len(body) == len(tree.body):
        raise ValueError(f"prompt does not define the entry point {entry_point!r}")
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    rest = [n for n in body if n not in imports]
    return "".join(ast.unparse(n) + "\n" for n in imports), "\n\n".join(ast.unparse(n) for n in rest)


def _humaneval_row(row: _Row) -> TaskRow:
    source = row.get("data_source", default="humaneval")
    prompt, entry, test = row.get("prompt"), row.get("entry_point"), row.get("test")
    try:
        prefix, helpers = prompt_definitions(prompt, entry)
    except ValueError as err:
        raise row.error("prompt", str(err)) from None
    truth = {"test_code": test, "entry_point": entry, "import_prefix": prefix, "helpers": helpers}
    extra = {"id": row.get("task_id"), "entry_point": entry}
    return TaskRow(row.row_id(source, {"id": extra["id"]}), source, "code", prompts.function_prompt(prompt), truth,
                   extra)


def _builders(template: bool) -> dict[str, Callable[[_Row], TaskRow]]:
    return {
        "verl": lambda r: _verl_row(r, template=template),
        "aime2024": lambda r: _aime_row(r, "Problem", "Answer", "AIME2024"),
        "aime2025": lambda r: _aime_row(r, "problem", "answer", "AIME2025"),
        "gpqa": _gpqa_row,
        "livecodebench": _lcb_row,
        "humaneval": _humaneval_row,
    }


def load_tasks(path: str | Path, *, fmt: str | None = None, template: bool = True, limit: int | None = None) -> list[TaskRow]:
    """Load every row of ``path`` as ``TaskRow``; ``fmt`` overrides format detection.

    ``template`` applies the paper's additions to verl-format training prompts (never to
    ``synthetic/*`` rows, which carry their own prompt).
    """
    path = Path(path)
    columns, rows = read_records(path)
    if not rows:
        raise DatasetError(path, None, None, "file has no rows")
    try:
        fmt = fmt or detect_format(columns)
        build = _builders(template)[fmt]
    except (ValueError, KeyError) as err:
        raise DatasetError(path, None, None, str(err)) from None
    out = [build(_Row(path, i, raw)) for i, raw in enumerate(rows[:limit] if limit else rows)]
    seen: dict[str, int] = {}
    for i, task in enumerate(out):
        if task.id in seen:
            raise DatasetError(path, i, "id", f"duplicate task id {task.id!r} (first at row {seen[task.id]})")
        seen[task.id] = i
    return out


def load_many(paths: list[str | Path], **kwargs) -> list[TaskRow]:
    """``load_tasks`` over several files, concatenated in order."""
    return [task for p in paths for task in load_tasks(p, **kwargs)]
