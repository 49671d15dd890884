"""The committed R3L policy (assets/tiny-r3l) writes valid reports in the format its warm-up taught.

Greedy decoding of reflection calls on held-out (``eval``) attempts built like the corpus's: a right
program answered right (expect ``success``, a perfect report) and the confusable wrong program answered
wrong (expect ``failure`` with pivot 0). It breaks when the compact prompt, log or report format drifts
from what ``tiny-r3l`` learnt (issue 18: the RL prompt must be the warm-up's), or the asset is replaced
by a policy that cannot reflect. The sampled (T = 1) valid rate is in docs/methods.md.
"""

from __future__ import annotations

import pytest

R3L_MODEL = "assets/tiny-r3l"


@pytest.fixture(scope="module")
def policy():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.chat import ChatFormat

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(R3L_MODEL)
    return AutoModelForCausalLM.from_pretrained(R3L_MODEL, dtype=torch.float32).eval(), ChatFormat(tok, None)


def _reflect(policy, attempt: list[dict], reward: float):
    import torch

    from tasks.r3l import REFLECTION_PROMPT_COMPACT, outcome_feedback, read_reflection, reflection_request

    model, chat = policy
    ids = chat.prompt_ids(reflection_request(attempt, REFLECTION_PROMPT_COMPACT, outcome_feedback(reward), "compact"))
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=256, do_sample=False,
                             eos_token_id=chat.eos_id, pad_token_id=chat.eos_id)
    return read_reflection(chat.decode(out[0, len(ids):].tolist()).replace(chat.eos_token, ""), 2)


def test_tiny_r3l_reflects_on_held_out_attempts(policy):
    from models.chat import render_call
    from tasks.data.synthetic import make_problems
    from tasks.data.synthetic.problems import run_program

    for p in make_problems(2, 3, "eval"):
        for program, right in ((p.right[0], True), (p.wrong[0], False)):
            out = run_program(program.code, p.setup)
            attempt = [{"role": "user", "content": p.question},
                       {"role": "assistant", "content": f"{program.plan}\n{render_call(program.code)}"},
                       {"role": "tool", "content": out},
                       {"role": "assistant", "content": f"The answer is \\boxed{{{out}}}."}]
            report, check = _reflect(policy, attempt, 1.0 if right else 0.0)
            assert check.valid, (p.kind, right, check.reason)
            assert report["trajectory_outcome"] == ("success" if right else "failure") and check.perfect == right
            assert check.pivot == (None if right else 0)
