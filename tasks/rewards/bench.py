"""Code-grading throughput: how many snippet x test pairs per second the sandbox grades.

``bench_code(pairs=100, backend="local")`` builds ``pairs`` stdin/stdout tests over a few
typical solutions (correct, wrong, crashing), starts the sandbox (not timed), warms it up
with one snippet, then grades everything twice: batched (one ``run_many`` over all
responses, ``grade_code_batch``) and per response (one ``compute_reward`` each, what a
simple caller does). It checks the rewards against the known answers, so a fast but wrong
grader does not pass as a benchmark. Run: ``cleaner data bench-code [--backend docker]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.rewards.code import grade_code_batch
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import PREFIX_MODULES
from tasks.rewards.registry import GraderError, compute_reward

TESTS_PER_RESPONSE = 5
_SPEC = {
    "inputs": [f"{a} {b}\n" for a, b in ((1, 2), (3, 4), (10, -5), (0, 0), (7, 7))],
    "outputs": ["3\n", "7\n", "5\n", "0\n", "14\n"],
}
# (solution code, expected reward on _SPEC)
_SOLUTIONS = [
    ("a, b = map(int, input().split())\nprint(a + b)", 1.0),
    ("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a - b)", 0.0),  # passes only "0 0", which printing 0 passes too
    ("a, b = map(int, input().split())\nprint(a + b if a < 5 else 1 / 0)", 0.5),  # 2 of the 4 tests a non-solution fails
    ("def main():\n    a, b = map(int, input().split())\n    print(sum([a, b]))\nmain()", 1.0),
]


@dataclass(frozen=True)
class BenchResult:
    """Measured code-grading throughput."""

    backend: str
    isolation: str
    pairs: int
    startup_s: float
    batch_s: float
    single_s: float

    @property
    def batch_tests_per_s(self) -> float:
        return self.pairs / self.batch_s

    @property
    def single_tests_per_s(self) -> float:
        return self.pairs / self.single_s

    def summary(self) -> str:
        return (
            f"code grading, {self.pairs} snippet x test pairs on {self.backend} ({self.isolation}): "
            f"batched {self.batch_tests_per_s:.1f} tests/s ({self.batch_s:.2f} s), "
            f"per response {self.single_tests_per_s:.1f} tests/s ({self.single_s:.2f} s); "
            f"sandbox start {self.startup_s:.2f} s"
        )


def bench_items(pairs: int) -> tuple[list[tuple[str, dict]], list[float]]:
    """Responses (fenced solution, test spec) covering ``pairs`` tests, and their expected rewards."""
    n = max(1, -(-pairs // TESTS_PER_RESPONSE))
    items, expected = [], []
    for i in range(n):
        code, reward = _SOLUTIONS[i % len(_SOLUTIONS)]
        items.append((f"Here is my solution.\n```python\n{code}\n```", _SPEC))
        expected.append(reward)
    return items, expected


def _check(rewards: list[float], expected: list[float], mode: str) -> None:
    bad = [(i, r, e) for i, (r, e) in enumerate(zip(rewards, expected)) if abs(r - e) > 1e-9]
    if bad:
        raise AssertionError(f"bench {mode}: rewards differ from the known answers (index, got, want): {bad[:5]}")


def bench_code(
    pairs: int = 100, backend: str = "local", workers: int = 4, timeout_s: float = 5.0, preimport: bool = True
) -> BenchResult:
    """Grade ``pairs`` snippet x test pairs through the ``backend`` sandbox and time it.

    ``preimport`` lets the executors import the harness's modules once (``PREFIX_MODULES``).
    """
    items, expected = bench_items(pairs)
    cfg = RewardConfig(code_timeout_s=min(4.0, timeout_s))
    modules = PREFIX_MODULES if preimport else ["math"]
    t0 = time.perf_counter()
    with make_sandbox(SandboxConfig(backend=backend, workers=workers, timeout_s=timeout_s, preimport=modules)) as sb:
        sb.run("print(1)")
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        batch = grade_code_batch([("livecodebench", sol, spec, None) for sol, spec in items], sandbox=sb, cfg=cfg)
        batch_s = time.perf_counter() - t1
        errors = [r for r in batch if isinstance(r, GraderError)]
        if errors:
            raise errors[0]
        _check([r.reward for r in batch], expected, "batched")
        t2 = time.perf_counter()
        single = [compute_reward("livecodebench", sol, spec, sandbox=sb, cfg=cfg) for sol, spec in items]
        single_s = time.perf_counter() - t2
        _check([r.reward for r in single], expected, "per response")
        isolation = getattr(sb, "isolation", "unknown")
    return BenchResult(backend, isolation, len(items) * TESTS_PER_RESPONSE, startup, batch_s, single_s)
