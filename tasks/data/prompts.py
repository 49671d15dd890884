"""The paper's prompt format: instructions in the user message, one Python tool, ``\\boxed{}`` answers.

The texts below are the reference's (Open-CLEANER ``recipe/cleaner/reward.py``) word for
word, typos included, so a checkpoint trained or evaluated with the reference sees the same
prompts here. The tool itself is not described in the prompt: the chat template lists it
from ``TOOLS`` (``code_interpreter`` with one ``code`` argument, ``models.chat.PYTHON_TOOL``).

- ``math_prompt(problem)``: AIME and the math half of the training mix;
- ``choice_prompt(problem, domain)``: GPQA (the option letter goes in ``\\boxed{}``);
- ``code_prompt(problem, inputs, outputs, starter_code)``: LiveCodeBench (a fenced Python block);
- ``function_prompt(code)``: HumanEval-style "complete this code" (not in the reference);
- ``wrap_train_prompt(messages, data_source)``: what the reference appends to verl-format
  training rows (``math_dapo`` / ``mega-science`` / the Skywork-style math and code mix).

Each builder returns chat messages (``[{"role": "user", "content": ...}]``).
"""

from __future__ import annotations

from models.chat import PYTHON_TOOL, TOOL_NAME

TOOLS = [PYTHON_TOOL]
"""Tools every task offers the model (rendered by the tokenizer's chat template)."""

ANSWER_FORMAT = (
    "\nRemember once you make sure the current answer is your final answer, do not call the tools again and "
    "directly output the final answer in the following text format, the answer format must be: "
    "\\boxed{'The final answer goes here.'}."
)
MATH_INTRO = "Analyze and solve the following math problem step by step. \n\n"
TOOL_HINT = (
    "\n\nThe tool could be used for more precise and efficient calculation and could help you to verify your "
    "result before you reach the final answer."
)
AGENT_NOTE = (
    "\n\n**Note: You should first analyze the problem and form a high-level solution strategy, then utilize "
    "the tools to help you solve the problem.**"
)
NO_UNITS = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the numerical "
    "value of the final answer only, without any units."
)
NO_UNITS_FINAL = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the final "
    "numerical value of the final answer only, without any units."
)
CHOICE_RULE = "\n Here you need to put the final uppercase letter option of this problem into \\boxed{}"
CODE_INTRO = (
    "You will be given a question (problem specification) and will generate a correct Python program that "
    "matches the specification and passes all tests.\n\n"
)
CODE_STDIN_RULE = (
    "\n\nRead the inputs from stdin solve the problem and write the answer to stdout (do not directly test on "
    "the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program "
    "runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n\""
)
CODE_STARTER_RULE = (
    "\n\nYou will use the following starter code to write the solution to the problem and enclose your code "
    "within delimiters.\n```python\n{starter_code}\n```"
)
CODE_SUBMIT = (
    "\nBefore sumbit your code, you can utilize tools to check the correctness of your code, once you make sure "
    "the current code is correct, do not call the tools again and submit your code within "
    "```python\n# YOUR CODE HERE\n```."
)


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def math_prompt(problem: str, *, tool: bool = True) -> list[dict]:
    """A math problem (AIME): step by step, the tool hint, the ``\\boxed{}`` rule."""
    hints = TOOL_HINT + AGENT_NOTE if tool else ""
    return _user(MATH_INTRO + problem + hints + ANSWER_FORMAT)


def choice_prompt(problem: str, domain: str, *, tool: bool = True) -> list[dict]:
    """A multiple-choice science problem (GPQA): the option letter goes in ``\\boxed{}``."""
    hints = TOOL_HINT + AGENT_NOTE if tool else ""
    intro = f"Analyze and solve the following {domain} problem step by step. \n\n"
    return _user(intro + problem + hints + ANSWER_FORMAT + CHOICE_RULE)


def format_choices(question: str, choices: list[str]) -> str:
    """A question followed by its options labelled ``(A)``, ``(B)``, ..."""
    lines = [f"({chr(ord('A') + i)}) {choice}" for i, choice in enumerate(choices)]
    return question.rstrip() + "\n\n" + "\n".join(lines)


def code_prompt(
    problem: str,
    inputs: list[str],
    outputs: list[str],
    *,
    starter_code: str | None = None,
    tool: bool = True,
) -> list[dict]:
    """A programming problem (LiveCodeBench) with its examples; the code goes in a fenced Python block.

    Stdin/stdout problems get the reference's stdin rule; functional problems (with
    ``starter_code``) get LiveCodeBench's starter-code rule instead.
    """
    examples = "\nHere are some input and output examples of the expected code:\nInput:" + str(inputs)
    examples += "\nOutput:\n" + str(outputs)
    rule = CODE_STARTER_RULE.format(starter_code=starter_code) if starter_code else CODE_STDIN_RULE
    hints = AGENT_NOTE if tool else ""
    submit = CODE_SUBMIT if tool else ""
    return _user(CODE_INTRO + problem + examples + hints + rule + submit)


FUNCTION_RULE = (
    "Complete the following Python code; submit the whole program, the definitions given here included.\n"
    "```python\n{code}\n```"
)


def function_prompt(code: str, *, tool: bool = True) -> list[dict]:
    """A function to complete (HumanEval: imports, helpers, the signature and docstring), in a fenced block."""
    hints = AGENT_NOTE if tool else ""
    submit = CODE_SUBMIT if tool else ""
    return _user(CODE_INTRO + FUNCTION_RULE.format(code=code.rstrip()) + hints + submit)


def wrap_train_prompt(messages: list[dict], data_source: str, *, tool: bool = True) -> list[dict]:
    """The reference's additions to a verl-format training prompt (last user message), by data source.

    ``math_dapo`` / ``mega-science``: the no-units rule. Other sources whose name contains
    ``code``: the agent note and the submit rule. Everything else is treated as math: the
    intro, tool hint, agent note, ``\\boxed{}`` rule and no-units rule around the problem.
    """
    out = [dict(m) for m in messages]
    idx = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if idx is None:
        raise ValueError("prompt has no user message")
    content = out[idx]["content"]
    source = data_source.lower()
    if source in ("math_dapo", "mega-science"):
        content = content + NO_UNITS
    elif "code" in source:
        content = content + (AGENT_NOTE + CODE_SUBMIT if tool else
                             "\nOnce you make sure the current code is correct, submit your code within "
                             "```python\n# YOUR CODE HERE\n```.")
    else:
        hints = TOOL_HINT + AGENT_NOTE if tool else ""
        content = MATH_INTRO + content + hints + ANSWER_FORMAT + NO_UNITS_FINAL
    out[idx]["content"] = content
    return out


__all__ = [
    "TOOLS",
    "TOOL_NAME",
    "math_prompt",
    "choice_prompt",
    "format_choices",
    "code_prompt",
    "wrap_train_prompt",
]
