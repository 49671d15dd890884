"""What a ``cleaner`` command prints: the project's own lines, not the libraries' bookkeeping.

A training run printed ≈ 130 lines for 10 steps: two "Loading weights" bars and a "Writing model shards" bar a
step (transformers), six "Task run 'score-279' - Finished in state Completed()" lines a step and the temporary
server's start and stop (Prefect), "Creating initial MLflow database tables" (MLflow). A command of
``QUIET_COMMANDS`` now sets, before any of those libraries is imported (``quiet_libraries``), each library's own
switch, unless the shell set it:

- ``PREFECT_LOGGING_SETTINGS_PATH`` = ``flows/prefect_logging.yml``: Prefect's own logging config with the
  terminal handler filtered by ``ProjectLines`` (what the project's code prints or logs inside a flow or task run,
  and every warning or error of any logger, pass; the INFO lines Prefect's engine and server log about themselves
  do not) and formatted by ``TerminalFormatter`` (a project line as it was printed, a warning with its level and
  source). Every line still goes to the Prefect API: the flow run's logs in the Prefect UI hold the task states too;
- ``HF_HUB_DISABLE_PROGRESS_BARS=1``: no transformers bars for loading or writing weights;
- ``MLFLOW_LOGGING_LEVEL=WARNING``: MLflow's INFO lines (database creation and migration) are gone.

``cleaner -v COMMAND`` (``--verbose``) sets none of them: the libraries print what they print by default. An
exported ``PREFECT_LOGGING_SETTINGS_PATH`` (any Prefect logging config), ``HF_HUB_DISABLE_PROGRESS_BARS=0`` or
``MLFLOW_LOGGING_LEVEL=INFO`` wins over the quiet default one by one. The rollout's progress bar is drawn only on a
terminal (``tasks.rollout.machine``: tqdm's ``disable=None``); a log or a pipe gets the step lines alone.

This module is imported by Python's logging config while ``prefect`` itself is being imported: it imports nothing
heavy at module level.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

LOGGING_CONFIG = Path(__file__).with_name("prefect_logging.yml")
"""The Prefect logging config of a quiet command (Prefect's default, with ``ProjectLines`` on the terminal)."""

QUIET_COMMANDS = frozenset({"demo", "train", "resume", "eval", "compare", "warmup", "warmup-gate", "bench-engines",
                            "bench-partial", "bench-step", "bench-rollout"})
"""Commands whose terminal output is the project's lines only (those that run flows or load models); ``serve``
starts long-lived Prefect processes whose own logs stay Prefect's."""

QUIET_ENV = {"PREFECT_LOGGING_SETTINGS_PATH": str(LOGGING_CONFIG), "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "MLFLOW_LOGGING_LEVEL": "WARNING"}
"""Each library's own switch that a quiet command sets unless the environment already has it."""

VERBOSE_FLAGS = ("-v", "--verbose")


def command_of(argv: list[str]) -> tuple[str | None, bool]:
    """The sub-command of a ``cleaner`` argument list and whether ``-v`` / ``--verbose`` came before it."""
    verbose = False
    for arg in argv:
        if arg in VERBOSE_FLAGS:
            verbose = True
        elif not arg.startswith("-"):
            return arg, verbose
    return None, verbose


def quiet_libraries(argv: list[str], environ: dict | None = None) -> dict[str, str]:
    """Set ``QUIET_ENV`` in ``environ`` (default ``os.environ``) where it is unset, for a quiet command without
    ``--verbose``; returns what it set. Must run before Prefect, transformers or MLflow is imported."""
    environ = os.environ if environ is None else environ
    command, verbose = command_of(argv)
    if verbose or command not in QUIET_COMMANDS:
        return {}
    added = {k: v for k, v in QUIET_ENV.items() if not environ.get(k)}
    environ.update(added)
    return added


PREFECT_PACKAGE = os.sep + "prefect" + os.sep
"""A path fragment of Prefect's installed package: INFO records logged from there are Prefect's bookkeeping."""


class ProjectLines(logging.Filter):
    """Passes warnings and errors of every logger and the INFO lines of the project's code (a ``print`` inside a
    flow or task run with ``log_prints``, a run logger the project calls); drops the INFO records Prefect logs from
    its own package (task and flow states, "Beginning flow run", "View at …", the temporary server's start and
    stop). A record Prefect's print capture makes is attributed to the code that printed (it logs with
    ``stacklevel=2``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return PREFECT_PACKAGE not in record.pathname


class TerminalFormatter(logging.Formatter):
    """A project line as it was printed; a warning or an error with its time, level and source (the flow or task
    run's name where there is one), as Prefect's own console format writes it."""

    def __init__(self, warning_format: str, datefmt: str | None = None, **kwargs):
        super().__init__("%(message)s")
        from prefect.logging.formatters import PrefectFormatter

        self.loud = PrefectFormatter(warning_format, datefmt, **kwargs)

    def format(self, record: logging.LogRecord) -> str:
        return self.loud.format(record) if record.levelno >= logging.WARNING else super().format(record)
