"""The chain grader (``synthetic-chain/*``, the multi-call regime): a right answer must come out of the chain's calls.

A chain prompt (``tasks.data.synthetic.chains``) asks for the result of its last step. The grader reads the
trajectory's record (``tasks.rewards.record``: its structured turns and the executions that really ran), never
the decoded text: a turn ends where the rollout ended it, on the end-of-turn id, so an end of turn or a tool
response the policy spells inside a turn (``<|im_end|>`` is 4 ordinary tokens of the tiny tokenizer) is text of
that turn. The answer is the last ``\\boxed{}`` of the response's **last assistant turn**, and it is correct only
when all three hold:

1. it equals the ground truth (an integer, compared as text once stripped);
2. **grounded**: it is what the call of the turn just before it printed (the last line of that execution's stdout,
   a clean run; the last execution at that turn, SAAR's earlier attempts being cut out). A boxed guess with no
   call before it, after a call that failed or printed something else, or in a turn whose own call ran after it
   was written, earns nothing even when it is right;
3. **followed**: the calls computed it from the chain's inputs, each carrying the previous call's printed value —
   the policy's own clean calls are replayed in the sandbox on changed inputs and must print what the chain gives
   on them (``tasks.rewards.chain_replay``). A call printing a constant however it is written, ignoring what it
   binds, or computing the last step on an intermediate no call printed earns nothing.

Merging steps into fewer calls is allowed (one call computing steps 1 to 3 from the bound inputs follows the
chain): fewer calls is a legitimate way to fail less. ``suspected_hacks/…`` counts a right answer that was not
grounded (``answer_not_from_a_call``), or not followed by a call whose output does not change when its inputs do
or that writes a guessed intermediate (``answer_not_from_the_chain``: a constant, a guess;
``chain_replay.responds``). A right answer from a call that does compute on its inputs, wrongly somewhere (the
confusable program of a step, a mis-copied intermediate, from which the later steps happened to land on the
answer), is no attempt on the grader: it earns nothing and counts as ``right_by_chance``. Every response reports the
three counts (0 or 1, at most one of them 1), so a training step logs them even when none was 1. ``calls`` is the number
of calls that ran in the final trajectory (a call the turn budget cut never ran, whatever the text after it says).
"""

from __future__ import annotations

import ast

from tasks.rewards.chain_replay import chain_of, follows, is_literal, printed
from tasks.rewards.config import RewardConfig
from tasks.rewards.record import Ran, read_record
from tasks.rewards.registry import RewardResult, last_boxed, register_reward, unbox


def bound_values(code: str) -> set[int]:
    """The integers ``code`` binds to a name by a literal assignment on a line of its own (``r = 4334``): how a
    later call carries the previous call's result (the sandbox keeps no state between calls). Read line by line,
    so a call whose binding is right but whose code has a mistake elsewhere (a syntax error) still binds."""
    out = set()
    for line in code.splitlines():
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and is_literal(stmt.value):
                value = ast.literal_eval(stmt.value)
                if isinstance(value, int) and not isinstance(value, bool):
                    out.add(value)
    return out


def final_calls(runs: list[Ran]) -> list[Ran]:
    """The executions that stand in the final trajectory: the last one at each position (SAAR's earlier attempts
    at a position were cut out), in turn order."""
    last: dict[int, Ran] = {}
    for r in runs:
        last[r.position] = r
    return [last[p] for p in sorted(last)]


def _chain_fields(extra_info: dict) -> tuple[str, str]:
    kind, setup = extra_info.get("kind"), extra_info.get("setup")
    if not isinstance(kind, str) or not isinstance(setup, str):
        raise ValueError("chain grader: extra_info needs the chain's 'kind' and 'setup' (the prompt row's extra_info; "
                         f"got kind={kind!r}, setup={setup!r})")
    return kind, setup


@register_reward("synthetic-chain/*")
def chain_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox=None, cfg: RewardConfig) -> RewardResult:
    """Chain: the last turn's boxed answer equals the ground truth, the call before it printed it, and the calls
    computed it along the chain (replayed on changed inputs). ``solution_str`` is not read."""
    gold = str(ground_truth).strip()
    if not gold.lstrip("-").isdigit():
        raise ValueError(f"chain ground truth {ground_truth!r} is not an integer")
    kind, setup = _chain_fields(extra_info)
    turns, runs = read_record(extra_info, "chain grader")
    assistant = [t for t in turns if t.get("role") == "assistant"]
    answer = unbox(last_boxed(assistant[-1]["content"])) if assistant else None
    answer = answer.strip() if answer is not None else None
    ran = final_calls(runs)
    src = ran[-1] if ran and ran[-1].position == len(assistant) - 2 else None
    grounded = src is not None and src.ok and answer is not None and printed(src.stdout) == answer
    right = answer == gold
    followed, by_chance = False, False
    if right and grounded:
        chain = chain_of(kind, setup)
        if chain.values[-1] != int(gold):
            raise ValueError(f"chain grader: ground truth {gold} is not the answer {chain.values[-1]} of the chain "
                             f"its kind {kind!r} and setup describe")
        verdict = follows([r for r in ran if r.ok and r.code is not None], chain, sandbox)
        followed, by_chance = verdict.followed, not verdict.followed and verdict.responds
    metrics = {"acc": float(followed), "has_answer": float(answer is not None),
               "calls": float(sum(r.code is not None for r in ran)), "grounded": float(grounded),
               "followed": float(followed), "suspected_hacks/answer_not_from_a_call": float(right and not grounded),
               "right_by_chance": float(by_chance),
               "suspected_hacks/answer_not_from_the_chain": float(right and grounded and not by_chance and not followed)}
    return RewardResult(cfg.correct_reward if followed else cfg.incorrect_reward, followed, metrics, answer)
