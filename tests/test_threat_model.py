"""``sandbox/THREAT_MODEL.md`` names the test behind every guarantee: those tests and hostile cases must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_sandbox_hostile import CASES

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "sandbox" / "THREAT_MODEL.md").read_text()
MODULES = {"test_sandbox_local", "test_sandbox_docker", "test_sandbox_setup", "test_reward_hacks", "test_code_harness",
           "test_reward_dodges", "test_compare", "test_assert_exactness", "test_humaneval_exactness",
           "test_sandbox_cputime", "test_assert_reference"}


def _test_functions() -> set[str]:
    names = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        names |= {node.name for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return names


def _cited_cases() -> set[str]:
    """Hostile case names: after "`hostile` case(s)" in the text, and in the last column of the attempts table."""
    cited = set()
    for match in re.finditer(r"`hostile`\s+(?:cases?\s+)?((?:`\w+`[,;\s]*(?:and\s+)?)+)", TEXT):
        cited |= set(re.findall(r"`(\w+)`", match.group(1)))
    for line in TEXT.splitlines():
        cells = line.split("|")
        if len(cells) == 5 and "Proof" not in line:
            cited |= set(re.findall(r"`(\w+)`", cells[3]))
    return cited - {"hostile", "isolation"}


def test_every_test_the_threat_model_names_exists():
    named = {n for n in re.findall(r"\btest_\w+", TEXT) if not n.endswith("_")}
    named -= MODULES | {"test_sandbox_isolation", "test_sandbox_hostile"}
    assert named, "the threat model names no test"
    assert sorted(named - _test_functions()) == []


def test_every_hostile_case_the_threat_model_names_exists():
    cited = _cited_cases()
    assert {"ptrace_executor", "socket_dir_fill", "inode_fill", "double_fork_writer"} <= cited
    assert sorted(cited - set(CASES)) == []
