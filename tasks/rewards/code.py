"""Code reward: the response's last fenced Python block run against the task's tests in the sandbox.

Registered for ``livecodebench*``, ``humaneval*`` and ``*code*`` data sources (see ``tasks.rewards.registry``).
Ground truth (a dict or its JSON string) is one of three test formats:

- **stdin/stdout** ``{"inputs": [str], "outputs": [str]}``: the program reads the input on
  stdin (``input()``, ``sys.stdin``, ``open(0)`` all work) and its stdout is compared with the
  expected output line by line, ignoring surrounding whitespace, finite numbers within 1e-6;
- **functional** ``{"inputs": [...], "outputs": [...], "fn_name": str}`` (LiveCodeBench):
  each input is newline-separated JSON arguments; ``Solution().fn_name(*args)`` (or a plain
  function ``fn_name``) must return the JSON-decoded expected output (ints of any length);
- **assert** ``{"import_prefix": str, "test_code": str, "entry_point": str}`` (the
  reference's training data, HumanEval): ``test_code`` defines ``check(candidate)``; each of its
  top-level statements holding an ``assert`` that uses the candidate is one test (one per line in
  the reference's data); names the test uses but does not define come from the trusted ``helpers``
  field (the prompt's definitions), never from the answer (``tasks.rewards.cases``).

**The assert rule.** ``check`` runs once, whole, in the answer's own interpreter and namespace, after
the helpers and the answer, as the reference harness runs it (``judge/inproc.py``), so a later assert
sees what earlier ones did and every value is the answer's own object. ``correct`` equals the
reference harness's verdict on every case of ``tests/test_assert_reference.py`` (aliasing, mutation,
exceptions, output capture, generators, argument and return types, binding forms), of
``tests/test_assert_exactness.py`` and of HumanEval's canonical solutions and mutants
(``tests/test_humaneval_exactness.py``), on both backends, except the tampering the reference lets
pass, which scores 0 as a suspected hack (``test_tampering_the_reference_passes_scores_zero_as_a_hack``:
an always-equal value, an exit before or during the asserts, patched builtins, helpers or modules the
test uses, reads of the test's frame, tracing, a forged verdict line), and a run that never called the
candidate, which passes nothing (no free credit). Partial credit never disagrees
with it: the tests count as passed only in order, up to the first failure or fault (the judge's
marks, reported on the verdict channel), a run that fails after its last test fails that test, a
tampered run earns nothing, and the reward is 1.0 only when ``check`` returned. ``cfg.code_timeout_s``
bounds the whole ``check`` (a timeout keeps the tests passed before it).

Each stdin / functional test and each assert ``check`` is one sandbox snippet (built by
``tasks.rewards.harness``), so a crash, an exit or a time-out fails only that snippet's tests, and a
test passes only when it ran to its end and its answer was right (``sandbox/THREAT_MODEL.md``,
"Grading"); the sandbox enforces its time limit from outside. The reward is 1.0 when all tests pass,
else partial credit from the tests no non-solution passes (``finish``); ``correct`` means all passed.
No answer crashes grading: whatever it holds or prints it gets a reward ("Rewards no answer can
dodge" in the threat model). Failures are counted by kind; ``suspected_hacks/<kind>`` counts the
kinds that suggest an attempt on the grader (``tasks.rewards.harness.SUSPECTED``). As in the
reference (``code_math.compute_score``) a response without a fenced Python block, or whose block
does not compile (``compile``, not only ``ast.parse``: ``return`` at module level is a format
error), scores ``cfg.code_format_error_reward`` (-1.0) without running. ``grade_code_batch`` grades
many responses with one ``run_many`` (what the score stage should use for throughput).
A ``SandboxInfraError`` is retried ``cfg.infra_retries`` times, then propagates (the caller
gets a ``GraderError`` with ``infra=True``) - it is never turned into a reward.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import replace

from sandbox.result import ExecutionResult, SandboxInfraError
from tasks.rewards.cases import assert_tests, check_helpers
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import SUSPECTED, CodeTest, Kind, Outcome, build_tests, judge_results, probe_free
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
        if not missing:
            check_helpers(spec, assert_tests(spec["test_code"], spec["entry_point"]).lookup)
    else:
        missing = {"inputs", "outputs"} - spec.keys()
        if not missing and len(spec["inputs"]) != len(spec["outputs"]):
            raise ValueError(f"code ground truth has {len(spec['inputs'])} inputs but {len(spec['outputs'])} outputs")
    if missing:
        raise ValueError(f"code ground truth lacks field(s) {sorted(missing)}")
    return spec


def run_with_retries(sandbox, snippets: list[str], retries: int,
                     timeout_s: float | None = None) -> tuple[list[ExecutionResult], int]:
    """``sandbox.run_many`` retried on ``SandboxInfraError``; returns the results and the retries used.
    ``timeout_s``: the per-snippet wall-clock limit the sandbox enforces from outside the snippet."""
    kwargs = {} if timeout_s is None else {"timeout_s": timeout_s}
    for attempt in range(retries + 1):
        try:
            return sandbox.run_many(snippets, **kwargs), attempt
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


_UNPARSABLE = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)
"""What ``compile`` raises on a block Python would not run (a syntax error, ``return`` or ``nonlocal`` at
module level, a name used before its ``global``, too deep, too big): a format error, never a crash."""

MAX_CODE_CHARS = 4_000_000
"""A longer block is a format error: no model writes one, and the sandbox's 64 MiB request frame must hold it."""

OUTER_SLACK_S = 0.5
"""Seconds the sandbox grants a test snippet beyond ``cfg.code_timeout_s`` (its start-up and report)
before it kills it from outside: the per-test limit does not rest on the answer's own process."""


def prepare(solution_str: str, ground_truth, cfg: RewardConfig) -> RewardResult | tuple[str, list[CodeTest]]:
    """Either the final result of a response that cannot run (format error) or (code, tests) to run."""
    spec = parse_tests(ground_truth)
    code = extract_code(solution_str)
    declared = len(spec["inputs"]) if "inputs" in spec else assert_tests(spec["test_code"], spec["entry_point"]).count
    if code is None:
        return _format_error(cfg, None, no_block=True, n_tests=declared)
    if len(code) > MAX_CODE_CHARS:
        return _format_error(cfg, code[:200], no_block=False, n_tests=declared)
    try:
        compile(code, "<solution>", "exec", dont_inherit=True)
    except _UNPARSABLE:
        return _format_error(cfg, code, no_block=False, n_tests=declared)
    tests = build_tests(code, spec, cfg.code_timeout_s)[: cfg.code_max_tests]
    if not tests:
        raise ValueError("code ground truth has no tests")
    return code, tests


def finish(code: str, tests: list[CodeTest], results: list[ExecutionResult], retries: int) -> RewardResult:
    """The reward of one response from its snippets' sandbox results (``HarnessError``, an infrastructure
    failure, when the judge could not run one): 1.0 when every test passed (in the assert format: the
    whole ``check`` passed), else the tests passed that no non-solution passes (past ``CodeTest.free``)
    over all tests but the free ones passed: a free test never earns, failing it still costs, so a
    non-solution earns nothing."""
    outcomes = [o for t, r in zip(tests, results, strict=True) for o in judge_results(t, r)]
    free = [i < t.free for t in tests for i in range(t.count)]
    n, n_pass = len(outcomes), sum(o.passed for o in outcomes)
    free_passed = sum(o.passed and f for f, o in zip(free, outcomes))
    reward = 1.0 if n_pass == n else (n_pass - free_passed) / (n - free_passed)
    metrics = {"acc": float(n_pass == n), "pass_rate": n_pass / n, **outcome_metrics(outcomes),
               "tests_free": float(sum(free)), "no_code_block": 0.0, "syntax_error": 0.0,
               "infra_retries": float(retries)}
    return RewardResult(reward, n_pass == n, metrics, code)


@register_reward("livecodebench*", "lcb*", "*code*", "humaneval*")
def code_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox, cfg: RewardConfig) -> RewardResult:
    """Code: see ``finish``; format errors score ``cfg.code_format_error_reward``."""
    (result,) = grade_code_batch([("code", solution_str, ground_truth, extra_info)], sandbox=sandbox, cfg=cfg)
    if isinstance(result, GraderError):
        raise result.__cause__ or result
    return result


def grade_code_batch(
    items: list[tuple[str, str, object, dict | None]], *, sandbox, cfg: RewardConfig | None = None
) -> list[RewardResult | GraderError]:
    """Grade many ``(data_source, solution_str, ground_truth, extra_info)`` code responses at once.

    All their tests (and the probes of assert tests not yet known, ``_free_flags``) go through one
    ``run_many``, so the sandbox pool stays busy across responses. Every item gets a result: a
    ``RewardResult`` whatever the answer did, or a ``GraderError`` when its ground truth is malformed
    or (``infra=True``) the sandbox stayed broken. Returned, never raised: no row sinks the batch.
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
    probes = sorted({t.probe for _, tests in runnable for t in tests if t.probe and _key(t.probe) not in _FREE})
    results: list[ExecutionResult] = []
    retries = 0
    if snippets:
        if sandbox is None:
            raise ValueError("code grading needs a sandbox (pass sandbox=make_sandbox(SandboxConfig(...)))")
        try:
            results, retries = run_with_retries(sandbox, snippets + probes, cfg.infra_retries,
                                                cfg.code_timeout_s + OUTER_SLACK_S)
        except SandboxInfraError as err:
            return [_grader_error(it[0], it[3], err) if isinstance(p, tuple) else p for it, p in zip(items, prepared)]
    free = _free_flags(probes, results[len(snippets):])
    out: list[RewardResult | GraderError] = []
    pos = 0
    for it, p in zip(items, prepared):
        if isinstance(p, tuple):
            code, tests = p
            tests = [replace(t, free=_is_free(t, free)) for t in tests]
            try:
                p = finish(code, tests, results[pos : pos + len(tests)], retries)
            except SandboxInfraError as err:  # the judge could not run (HarnessError)
                p = _grader_error(it[0], it[3], err)
            pos += len(tests)
        out.append(p)
    return out


_FREE: dict[str, int] = {}
"""Probe verdicts by the sha256 of the probe snippet: a property of the test, asked once per process."""
_FREE_MAX = 100_000


def _key(probe: str) -> str:
    return hashlib.sha256(probe.encode("utf-8", "surrogatepass")).hexdigest()


def _free_flags(probes: list[str], results: list[ExecutionResult]) -> dict[str, int | None]:
    """How many tests, from the first, a non-solution passes in each assert ``check``, from the new
    probes' results; the clean verdicts are cached, a probe without one (None) counts as all free (no
    partial credit) and is asked again next time."""
    if len(_FREE) > _FREE_MAX:
        _FREE.clear()
    flags = {}
    for probe, result in zip(probes, results, strict=True):
        free = probe_free(result)
        if free is not None:
            _FREE[_key(probe)] = free
        flags[probe] = free
    return flags


def _is_free(test: CodeTest, fresh: dict[str, int | None]) -> int:
    if test.probe is None:
        return test.free
    free = fresh[test.probe] if test.probe in fresh else _FREE.get(_key(test.probe))
    return test.count if free is None else min(free, test.count)


def _grader_error(data_source: str, extra_info: dict | None, err: Exception) -> GraderError:
    extra = extra_info or {}
    row_id = extra.get("id", extra.get("index"))
    error = GraderError(data_source, None if row_id is None else str(row_id), f"{type(err).__name__}: {err}",
                        infra=isinstance(err, SandboxInfraError))
    error.__cause__ = err
    return error
