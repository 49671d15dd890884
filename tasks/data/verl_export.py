"""Task files of any supported format as verl's RL parquet (``cleaner data to-verl``): what verl's ``main_ppo``
reads (``data.train_files`` / ``data.val_files``, infra/verl/run_cleaner_grpo.sh).

``export_verl(inputs, out)`` loads every input with ``tasks.data.formats.load_tasks`` (format detected per file, or
``fmt``) and writes one row per task: ``prompt`` (chat messages), ``data_source``, ``ability``, ``reward_model``
``{"style": "rule", "ground_truth"}`` and ``extra_info`` (the task's, its id keys as text, plus ``index``: the id's key, so verl and
the pipeline name the row alike). A ground truth that is not text (a code task's tests) is written as its JSON text,
verl's convention for code rows, which the code reward reads. The prompt is written as the pipeline would train on it, and the file read back by
``load_tasks`` gives the same tasks (ids, sources, abilities, prompts, ground truths, the JSON ones as text) as the inputs:

- a verl-format input keeps its prompt as written; the reader adds the paper's wrapper, as for the input itself;
- any other format's prompt is the one its loader made (AIME's, GPQA's …), marked final
  (``formats.FINAL_PROMPT`` in ``extra_info``) so that no wrapper is added on top.

Ids must be unique across all inputs (an error names both files). Written to a temporary name and renamed; rows
whose ``extra_info`` values clash in type across files (an id that is a number in one, text in another) cannot share
one Parquet table: the error names the column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tasks.data.formats import FINAL_PROMPT, DatasetError, detect_format, load_tasks, read_records

ID_KEYS = ("id", "ID", "index", "question_id", "task_id")
"""``extra_info`` keys that name a row: written as text (a number in one format, text in another, would not share
one Parquet column; an id reads the same either way)."""


def verl_rows(path: str | Path, fmt: str | None = None) -> list[dict]:
    """The rows of one task file in verl's RL format (see module docstring)."""
    fmt = fmt or detect_format(read_records(path)[0])
    rows = []
    for task in load_tasks(path, fmt=fmt, template=fmt != "verl"):
        key = task.id[len(task.data_source) + 1:] if task.id.startswith(task.data_source + "/") else task.id
        extra = {k: str(v) if k in ID_KEYS and v is not None else v for k, v in task.extra_info.items()}
        extra["index"] = extra.get("index", key)
        if fmt != "verl":
            extra[FINAL_PROMPT] = True
        rows.append({"data_source": task.data_source, "prompt": task.prompt, "ability": task.ability,
                     "reward_model": {"style": "rule", "ground_truth": truth if isinstance(truth := task.ground_truth, str)
                                      else json.dumps(truth)}, "extra_info": extra})
    return rows


def export_verl(inputs: list[str | Path], out: str | Path, fmt: str | None = None) -> dict:
    """Write every task of ``inputs`` to ``out`` (verl parquet); returns {"rows", "formats" (per input)}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, formats, first = [], {}, {}
    for path in inputs:
        formats[str(path)] = fmt or detect_format(read_records(path)[0])
        for i, row in enumerate(verl_rows(path, formats[str(path)])):
            key = f"{row['data_source']}/{row['extra_info']['index']}"
            if key in first:
                raise DatasetError(path, i, "id", f"task id {key!r} is also in {first[key]}")
            first[key] = str(path)
            rows.append(row)
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise DatasetError(out, None, "extra_info", f"the rows do not fit one Parquet table ({err}); export the "
                           "files whose extra_info differ in type separately") from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return {"rows": len(rows), "formats": formats}
