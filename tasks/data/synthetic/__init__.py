"""The synthetic tool-use task: problems with bound inputs, and the tiny model's warm-up corpus.

Modules: ``problems`` (types, registry, splits, verl parquet), one module per family of kinds
(``arith``, ``numbers``, ``lists``, ``sequences``), ``chains`` (the multi-call family), ``mistakes`` (planted mistakes whose error
message names the fix) and ``corpus`` (sandbox-checked SFT transcripts and their statistics).
"""

from tasks.data.synthetic import arith, chains, lists, numbers, sequences  # noqa: F401  (the kinds, the chain family)
from tasks.data.synthetic.corpus import CorpusMix, read_sft_corpus, read_sft_types, write_sft_corpus
from tasks.data.synthetic.problems import (
    KINDS,
    SPLITS,
    Problem,
    Program,
    make_problems,
    split_of,
    task_rows,
    write_task_parquet,
)

__all__ = ["CorpusMix", "read_sft_corpus", "read_sft_types", "write_sft_corpus", "KINDS", "SPLITS", "Problem", "Program", "make_problems", "split_of", "task_rows", "write_task_parquet"]
