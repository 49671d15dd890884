"""Code reward: the response's last fenced Python block run against the task's tests in the sandbox.

Registered for ``livecodebench*`` and ``*code*`` data sources (see ``tasks.rewards.registry``).
Ground truth (a dict or its JSON string) is one of three test formats:

- **stdin/stdout** ``{"inputs": [str], "outputs": [str]}``: the program reads the input on
  stdin (``input()``, ``sys.stdin``, ``open(0)`` all work) and its stdout is compared with the
  expected output line by line, ignoring surrounding whitespace, numbers within 1e-6;
- **functional** ``{"inputs": [...], "outputs": [...], "fn_name": str}`` (LiveCodeBench):
  each input is newline-separated JSON arguments; ``Solution().fn_name(*args)`` (or a plain
  function ``fn_name``) must return the JSON-decoded expected output;
- **assert** ``{"import_prefix": str, "test_code": str, "entry_point": str}`` (the
  reference's training data, HumanEval): ``test_code`` defines ``check(candidate)``; each of its
  top-level statements holding an ``assert`` is one test (one per line in the reference's data).

Each test is one sandbox snippet (built by ``tasks.rewards.harness``), so a crash, an exit or a
time-out fails only that test, and a test passes only when it ran to its end and its answer was
right (``sandbox/THREAT_MODEL.md``, "Grading"). The reward is the fraction of tests passed;
``correct`` means all passed. Failures are counted by kind; ``suspected_hacks/<kind>`` counts the
kinds that suggest an attempt on the grader (``tasks.rewards.harness.SUSPECTED``). As in the reference (``code_math.compute_score``)
a response without a fenced Python block or whose block does not parse scores
``cfg.code_format_error_reward`` (-1.0) without running. ``grade_code_batch`` grades many
responses with one ``run_many`` (what the score stage should use for throughput).
A ``SandboxInfraError`` is retried ``cfg.infra_retries`` times, then propagates (the caller
gets a ``GraderError`` with ``infra=True``) - it is never turned into a reward.
"""

from __future__ import annotations

import ast
import json
import re

from sandbox.result import ExecutionResult, SandboxInfraError
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import SUSPECTED, CodeTest, Kind, Outcome, assert_cases, build_tests, judge_result
from tasks.rewards.registry import GraderError, RewardResult, register_reward

_FENCE = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The last fenced ```python block of the response (after any ``</think>``), or None."""
    if "</think>" in text:
        text = text.split("</think>", 1)[1]
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None


def parse_tests(ground_truth) -> dict:
    """The test spec as a dict; a JSON string (or a Python literal, as ``str(dict)`` gives) is decoded."""
    spec = ground_truth
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            try:
                spec = ast.literal_eval(spec if isinstance(spec, str) else spec.decode())
            except (ValueError, SyntaxError):
                raise ValueError(f"code ground truth is neither JSON nor a Python literal: {err}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"code ground truth must be an object, got {type(spec).__name__}")
    if "test_code" in spec:
        missing = {"test_code", "entry_point"} - spec.keys()
    else:
        missing = {"inputs", "outputs"} - spec.keys()
        if not missing and len(spec["inputs"]) != len(spec["outputs"]):
            raise ValueError(f"code ground truth has {len(spec['inputs'])} inputs but {len(spec['outputs'])} outputs")
    if missing:
        raise ValueError(f"code ground truth lacks field(s) {sorted(missing)}")
    return spec


def run_with_retries(sandbox, snippets: list[str], retries: int) -> tuple[list[ExecutionResult], int]:
    """``sandbox.run_many`` retried on ``SandboxInfraError``; returns the results and the retries used."""
    for attempt in range(retries + 1):
        try:
            return sandbox.run_many(snippets), attempt
        except SandboxInfraError:
            if attempt == retries:
                raise
    raise AssertionError("unreachable")


_RUNTIME = (Kind.RUNTIME_ERROR, Kind.MEMORY, Kind.CRASH, Kind.HARNESS_LIMIT)


def outcome_metrics(outcomes: list[Outcome]) -> dict[str, float]:
    """Test counts by kind: passed, timeouts, runtime errors, wrong answers and each suspected hack."""
    kinds = [o.kind for o in outcomes]
    metrics = {"tests_total": float(len(kinds)), "tests_passed": float(kinds.count(Kind.PASS)),
               "timeouts": float(kinds.count(Kind.TIMEOUT)),
               "runtime_errors": float(sum(kinds.count(k) for k in _RUNTIME)),
               "wrong_answers": float(kinds.count(Kind.WRONG_ANSWER)),
               "suspected_hacks": float(sum(k in SUSPECTED for k in kinds))}
    metrics.update({f"suspected_hacks/{k.value}": float(kinds.count(k)) for k in sorted(SUSPECTED)})
    return metrics


def _format_error(cfg: RewardConfig, code: str | None, *, no_block: bool, n_tests: int) -> RewardResult:
    metrics = {"acc": 0.0, "pass_rate": 0.0, **outcome_metrics([]), "tests_total": float(n_tests),
               "no_code_block": float(no_block), "syntax_error": float(not no_block), "infra_retries": 0.0}
    return RewardResult(cfg.code_format_error_reward, False, metrics, code)


def prepare(solution_str: str, ground_truth, cfg: RewardConfig) -> RewardResult | tuple[str, list[CodeTest]]:
    """Either the final result of a response that cannot run (format error) or (code, tests) to run."""
    spec = parse_tests(ground_truth)
    code = extract_code(solution_str)
    declared = len(spec["inputs"]) if "inputs" in spec else len(assert_cases(spec["test_code"])[0])
    if code is None:
        return _format_error(cfg, None, no_block=True, n_tests=declared)
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return _format_error(cfg, code, no_block=False, n_tests=declared)
    tests = build_tests(code, spec, cfg.code_timeout_s)[: cfg.code_max_tests]
    if not tests:
        raise ValueError("code ground truth has no tests")
    return code, tests


def finish(code: str, tests: list[CodeTest], results: list[ExecutionResult], retries: int) -> RewardResult:
    """The reward of one response from its tests' sandbox results: fraction passed (``HarnessError``,
    an infrastructure failure, when the judge could not run a test)."""
    outcomes = [judge_result(t, r) for t, r in zip(tests, results, strict=True)]
    n_pass = sum(o.passed for o in outcomes)
    metrics = {"acc": float(n_pass == len(tests)), "pass_rate": n_pass / len(tests), **outcome_metrics(outcomes),
               "no_code_block": 0.0, "syntax_error": 0.0, "infra_retries": float(retries)}
    return RewardResult(n_pass / len(tests), n_pass == len(tests), metrics, code)


@register_reward("livecodebench*", "lcb*", "*code*")
def code_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox, cfg: RewardConfig) -> RewardResult:
    """Code: fraction of tests passed in the sandbox; format errors score ``cfg.code_format_error_reward``."""
    prepared = prepare(solution_str, ground_truth, cfg)
    if isinstance(prepared, RewardResult):
        return prepared
    if sandbox is None:
        raise ValueError("code grading needs a sandbox (pass sandbox=make_sandbox(SandboxConfig(...)))")
    code, tests = prepared
    results, retries = run_with_retries(sandbox, [t.snippet for t in tests], cfg.infra_retries)
    return finish(code, tests, results, retries)


def grade_code_batch(
    items: list[tuple[str, str, object, dict | None]], *, sandbox, cfg: RewardConfig | None = None
) -> list[RewardResult | GraderError]:
    """Grade many ``(data_source, solution_str, ground_truth, extra_info)`` code responses at once.

    All their tests go through one ``run_many``, so the sandbox pool stays busy across
    responses. Each item gets a ``RewardResult`` or, when its grading crashed, a
    ``GraderError`` (returned, not raised, so one bad row does not sink the batch; a
    sandbox that stays broken gives every item that needed it a ``GraderError`` with ``infra=True``).
    """
    cfg = cfg or RewardConfig()
    prepared: list[RewardResult | GraderError | tuple[str, list[CodeTest]]] = []
    for source, solution, truth, extra in items:
        try:
            prepared.append(prepare(solution, truth, cfg))
        except Exception as err:  # noqa: BLE001 - surfaced per item as GraderError
            prepared.append(_grader_error(source, extra, err))
    runnable = [p for p in prepared if isinstance(p, tuple)]
    snippets = [t.snippet for _, tests in runnable for t in tests]
    results: list[ExecutionResult] = []
    retries = 0
    if snippets:
        if sandbox is None:
            raise ValueError("code grading needs a sandbox (pass sandbox=make_sandbox(SandboxConfig(...)))")
        try:
            results, retries = run_with_retries(sandbox, snippets, cfg.infra_retries)
        except SandboxInfraError as err:
            return [_grader_error(it[0], it[3], err) if isinstance(p, tuple) else p for it, p in zip(items, prepared)]
    out: list[RewardResult | GraderError] = []
    pos = 0
    for it, p in zip(items, prepared):
        if isinstance(p, tuple):
            code, tests = p
            try:
                p = finish(code, tests, results[pos : pos + len(tests)], retries)
            except SandboxInfraError as err:  # the judge could not run (HarnessError)
                p = _grader_error(it[0], it[3], err)
            pos += len(tests)
        out.append(p)
    return out


def _grader_error(data_source: str, extra_info: dict | None, err: Exception) -> GraderError:
    extra = extra_info or {}
    row_id = extra.get("id", extra.get("index"))
    error = GraderError(data_source, None if row_id is None else str(row_id), f"{type(err).__name__}: {err}",
                        infra=isinstance(err, SandboxInfraError))
    error.__cause__ = err
    return error
