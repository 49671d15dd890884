"""The one result type every sandbox backend returns, and what the model sees of it.

A backend never raises for a failure of the user's code: a SyntaxError, a timeout or a
memory blow-up is an ``ExecutionResult`` with ``ok=False`` and an ``error_kind``. Only an
*infrastructure* failure (the executor died, a container vanished, the answer was garbage)
is different: backends retry it and, when the retries are used up, raise
``SandboxInfraError``. It never becomes a result, a reward or a SAAR trigger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TRUNCATE = {
    "right": lambda text, n: text[:n] + "...(truncated)",
    "left": lambda text, n: "(truncated)..." + text[-n:],
    "middle": lambda text, n: text[: n // 2] + "...(truncated)..." + text[-(n // 2):],
}
"""How a tool response longer than ``n`` characters is cut, by the side that goes (verl's
``multi_turn.tool_response_truncate_side``, with verl's markers)."""


class SandboxInfraError(RuntimeError):
    """The sandbox itself failed (not the user's code) and retries did not help."""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of running one snippet.

    ``ok`` is true only when the snippet ran to exit status 0 within its time limits.
    ``error_kind`` names the failure: the exception type parsed from the traceback
    (``NameError``, ``SyntaxError``, ...), ``timeout`` (its CPU time, ``sandbox.timeout_s``),
    ``wall_timeout`` (the wall-clock backstop ``sandbox.wall_timeout_s``: it blocked; ``timed_out``
    is set for both), ``memory`` , ``output_limit``,
    ``signal:<NAME>`` for a child killed by a signal, ``exit:<code>`` for a bare non-zero exit,
    ``setup_error`` when the caller's setup code failed and the snippet never ran (a caller bug),
    ``worker_killed`` when the snippet brought down the worker it ran on (the detail in stderr).
    """

    ok: bool
    exit_code: int | None
    stdout: str
    stderr: str
    error_kind: str | None
    timed_out: bool
    memory_exceeded: bool
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    def model_text(self, max_chars: int = 1024, side: str = "right") -> str:
        """The tool response the model sees: stdout, then the error's last line on failure.

        Longer than ``max_chars``, it is cut on ``side`` (``TRUNCATE``, verl's ``tool_response_truncate_side``
        names and marks): ``right`` keeps the head (the reference's way, the default), ``left`` the tail,
        ``middle`` half of each. The full stderr stays in the record for people.
        """
        if side not in TRUNCATE:
            raise ValueError(f"unknown truncation side {side!r}; known: {', '.join(TRUNCATE)}")
        out = self.stdout.rstrip("\n")
        if not self.ok:
            out = f"{out}\n{self.error_line()}" if out else self.error_line()
        return TRUNCATE[side](out, max_chars) if len(out) > max_chars else out

    def error_line(self) -> str:
        """One line naming the failure, as the last traceback line or a limit message."""
        if self.timed_out:
            if self.error_kind == "wall_timeout":
                return "TimeoutError: execution timed out (wall-clock limit: blocked or waiting)"
            return "TimeoutError: execution timed out"
        if self.memory_exceeded:
            return "MemoryError: memory limit exceeded"
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        if lines:
            return lines[-1].strip()
        return f"Error: {self.error_kind or 'execution failed'}"

    def to_dict(self) -> dict:
        return asdict(self)
