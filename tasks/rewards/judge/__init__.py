"""The sandbox side of the code harness: the program every test snippet runs (stdlib only, shipped whole).

``tasks.rewards.harness`` compiles ``wire``, ``run``, ``compare``, ``watch``, ``inproc`` and ``probe`` (in that order, as one program,
``program_source``) once, ships the code object marshalled into each snippet (the source goes along for a
sandbox whose Python differs) and calls one entry point; every run ends in verdict lines ``VERDICT_MARK
{json}`` written on a copy of fd 1 taken before any solution code ran.

- ``run.run_program`` (stdin/stdout and functional formats) runs the solution in this process and
  reports what it *did* - the stdout it produced or the value it returned (``wire`` encoding) -
  never whether that was right: the expected answers never enter the sandbox, the host compares.
  Whatever the solution does to this process (exit, patch builtins, print a verdict of its own,
  read all of memory) it can only lose: to pass, the bytes the host reads must encode the right
  answer. How the run ended and what was tampered with are reported as *hints* that count failures
  by kind (the solution could forge those, never a pass).
- ``inproc.judge_assert`` (assert / HumanEval ``check(candidate)``): the test code holds the expected
  values and the reference harness runs it in the answer's interpreter, so it runs here, in the
  answer's process and namespace, with an audit hook, a nonce-bearing close-on-exec verdict channel,
  comparison hooks (``compare``) and snapshots and reporting wrappers (``watch``) that make the tampering a plain interpreter lets through
  a failure of its own kind (see its docstring).
- ``probe.probe_assert``: runs a test with trivial candidates only (no solution): does a non-solution
  pass it (then it earns no partial credit).

Inside the sandbox the modules share one namespace (``__name__ == "cleaner_judge"``), so their
imports of each other are skipped there.
"""


from __future__ import annotations

from pathlib import Path

PROGRAM_MODULES = ("wire", "run", "compare", "watch", "inproc", "probe")
"""The modules of the shipped program, in the order they are concatenated."""


def program_source(modules: tuple[str, ...] = PROGRAM_MODULES) -> str:
    """The judge program: the sources of ``modules`` (a prefix of ``PROGRAM_MODULES``) in order."""
    here = Path(__file__).parent
    return "\n\n".join((here / f"{name}.py").read_text() for name in modules)
