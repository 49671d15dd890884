"""The chain grader (``synthetic-chain/*``, the multi-call regime): a right answer must come out of a call.

A chain prompt (``tasks.data.synthetic.chains``) asks for the result of its last step. The answer is the last
``\\boxed{}`` of the response's **last assistant turn**, and it is correct only when all three hold:

1. it equals the ground truth (an integer, compared as text once stripped);
2. **grounded**: it is the last line of the tool response just before that turn — what the last call
   printed. A boxed guess with no call before it, or with a call that printed something else (a wrong bound
   value, an error), earns nothing even when the guess is right: on this task small answers (a digit count)
   are guessable, and a policy must not learn to skip the calls;
3. **computed**: the call that printed it does more than print literals — its code is not only imports,
   assignments of literals (``r = 4334``) and ``print`` of names or literals. ``print(6)`` or ``r = 4334;
   print(r)`` computes nothing; a call that binds the previous result and computes on it does.

Merging the steps into fewer calls is allowed (the grader asks for the answer to come out of a computing call,
not for one call per step): fewer calls is a legitimate way to fail less. The grader cannot tell arithmetic a
policy did in its head and wrote as ``print(5 + 1)`` from computing; it refuses the two shortcuts a policy can
learn cheaply (no call, a printed literal) and counts them as ``suspected_hacks/…`` when the boxed answer was
right.

Turns are read from the text the rollout decodes: an assistant turn ends with the end-of-turn token
``<|im_end|>``, which the policy cannot write inside a turn (it ends the turn), so every segment after one is
text the rollout injected — a tool response (``<|im_start|>user\\n<tool_response>…``) or the next assistant
turn's header. A tool response the policy writes into its own turn stays inside that assistant turn and is
never read as one (the ChatML frames of the tiny and SmolLM2 templates).
"""

from __future__ import annotations

import ast

from tasks.rewards.config import RewardConfig
from tasks.rewards.registry import RewardResult, last_boxed, register_reward, unbox

END = "<|im_end|>"
TOOL_HEAD = "\n<|im_start|>user\n<tool_response>\n"
TOOL_TAIL = "\n</tool_response>"
ASSISTANT_HEAD = "\n<|im_start|>assistant\n"


def response_turns(text: str) -> list[tuple[str, str]]:
    """``(role, content)`` of each turn of a decoded response: ``assistant`` or ``tool`` (``other`` for a segment
    the rollout did not inject in a known frame); see the module docstring."""
    turns: list[tuple[str, str]] = []
    for i, seg in enumerate(text.split(END)):
        if i == 0:
            turns.append(("assistant", seg))
        elif seg.startswith(TOOL_HEAD):
            body = seg[len(TOOL_HEAD):]
            turns.append(("tool", body[: -len(TOOL_TAIL)] if body.endswith(TOOL_TAIL) else body))
        elif seg.startswith(ASSISTANT_HEAD):
            turns.append(("assistant", seg[len(ASSISTANT_HEAD):]))
        elif seg.strip():
            turns.append(("other", seg))
    return turns


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) for e in node.elts)
    return False


def _trivial(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Assign):
        return _literal(stmt.value)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        return (isinstance(call.func, ast.Name) and call.func.id == "print"
                and all(isinstance(a, ast.Name) or _literal(a) for a in call.args))
    return False


def computes(code: str) -> bool:
    """Whether ``code`` computes anything: False when it only imports, binds literals and prints names or literals
    (code that does not parse computes nothing)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return not all(_trivial(s) for s in tree.body)


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
            if isinstance(stmt, ast.Assign) and _literal(stmt.value):
                value = ast.literal_eval(stmt.value)
                if isinstance(value, int) and not isinstance(value, bool):
                    out.add(value)
    return out


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@register_reward("synthetic-chain/*")
def chain_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox=None, cfg: RewardConfig) -> RewardResult:
    """Chain: the boxed answer of the last turn equals the ground truth, and the last call printed it by computing."""
    from models.chat import parse_tool_call

    gold = str(ground_truth).strip()
    if not gold.lstrip("-").isdigit():
        raise ValueError(f"chain ground truth {ground_truth!r} is not an integer")
    turns = response_turns(solution_str)
    last = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
    answer = unbox(last_boxed(turns[last][1]))
    answer = answer.strip() if answer is not None else None
    tool = turns[last - 1] if last >= 2 and turns[last - 1][0] == "tool" else None
    grounded = tool is not None and answer is not None and _last_line(tool[1]) == answer
    call = parse_tool_call(turns[last - 2][1]) if tool is not None and turns[last - 2][0] == "assistant" else None
    computed = grounded and call is not None and call.code is not None and computes(call.code)
    right = answer == gold
    correct = right and grounded and computed
    metrics = {"acc": float(correct), "has_answer": float(answer is not None),
               "calls": float(sum(role == "tool" for role, _ in turns)), "grounded": float(grounded),
               "computed": float(computed)}
    if right and not grounded:
        metrics["suspected_hacks/answer_not_from_a_call"] = 1.0
    elif right and not computed:
        metrics["suspected_hacks/printed_literal"] = 1.0
    return RewardResult(cfg.correct_reward if correct else cfg.incorrect_reward, correct, metrics, answer)
