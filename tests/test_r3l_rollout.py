"""The R3L rollout mode end to end on a rule-driven engine and the real local sandbox.

The engine answers from what it sees (real tokenizer, real end-of-turn id): a reflection
request gets the test's report, a context holding the guidance gets the right answer, and a
plain attempt makes the scripted mistakes — so every phase (base, reflect, replay, retry,
distill) runs through the real code paths and the token bookkeeping can be checked exactly.
"""

from __future__ import annotations

import json

import pytest

from models.chat import render_call
from models.engine import GenOutput
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.r3l.driver import R3LRollout, r3l_metrics
from tasks.r3l.prompts import GUIDANCE_HEADER, GUIDANCE_TEMPLATE_COMPACT, REFLECTION_USER_HEAD, guidance_text
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.r3l_config import R3LConfig
from tasks.rollout.types import PromptItem

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 6 * 7?"}], "synthetic/arith", "42")
FAILED = "Multiply. " + render_call("pritn(6 * 7)")
FIXED = "Fix the name. " + render_call("print(6 * 7)")
REPORT = {"trajectory_summary": "Computed 42 but answered 41.", "root_cause_analysis": "Why 41? Miscopied.",
          "trajectory_outcome": "failure", "improvement_suggestion": "Copy the tool output exactly.",
          "retry_from_step": 1}


class RuleEngine:
    """Answers every request from its decoded context (see the module docstring)."""

    def __init__(self, chat, reflection: str, retry_answer: str = "\\boxed{42}", base_answer: str = "\\boxed{41}"):
        self.chat, self.eos_id = chat, chat.eos_id
        self.reflection, self.retry_answer, self.base_answer = reflection, retry_answer, base_answer
        self.contexts: list[str] = []

    def load_weights(self, path) -> None:
        return None

    def reply(self, ctx: str) -> str:
        if REFLECTION_USER_HEAD.strip() in ctx:
            return self.reflection
        guided = GUIDANCE_HEADER in ctx
        last = ctx[ctx.rfind("<|im_start|>user"):]
        if "<tool_response>" not in last:
            return FIXED if guided else FAILED
        if "NameError" in last:
            return FIXED
        return self.retry_answer if guided else self.base_answer

    def generate(self, requests, seed):
        return [GenOutput(*self.answer(req.input_ids), "stop") for req in requests]

    def answer(self, input_ids):
        ctx = self.chat.decode(input_ids)
        self.contexts.append(ctx)
        ids = self.chat.encode(self.reply(ctx)) + [self.eos_id]
        return ids, [-0.5] * len(ids)


class StreamingRuleEngine(RuleEngine):
    """The same rules behind the continuous-batching contract (submit / step / release / busy)."""

    def stream(self, seed, keep_prefix=True):
        engine, queue = self, []

        class Stream:
            busy = property(lambda self: bool(queue))

            def submit(self, key, input_ids, max_new_tokens):
                queue.append((key, list(input_ids)))

            def release(self, key):
                return None

            def step(self):
                done = list(queue)
                queue.clear()
                return [(key, *engine.answer(ids), "stop") for key, ids in done]

        return Stream()


@pytest.fixture(scope="module")
def box():
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as b:
        yield b


def reward_fn(chat):
    return lambda t: 1.0 if "\\boxed{42}" in chat.decode(t.response_ids) else 0.0


def run_r3l(chat, box, engine, n=2, raw_share=0.0, **r3l):
    cfg = RolloutConfig(n_samples=n, max_turns=4, saar=SAARConfig(raw_share=raw_share))
    driver = R3LRollout(Rollout(cfg, engine, chat, box), R3LConfig(**r3l), reward_fn(chat))
    return driver.run([ITEM], seed=0, step=3, progress=False)


def by_kind(res):
    return {t.kind: t for t in res.rows}


@pytest.mark.parametrize("engine_cls", [RuleEngine, StreamingRuleEngine], ids=["rounds", "continuous"])
def test_successful_retry_from_pivot_one(chat, box, engine_cls):
    res = run_r3l(chat, box, engine_cls(chat, "Here is my analysis: " + json.dumps(REPORT)))
    rows = by_kind(res)
    assert [t.kind for t in res.rows] == ["base", "distill", "reflect", "retry"]
    base, distill, reflect, retry = rows["base"], rows["distill"], rows["reflect"], rows["retry"]
    assert (base.group_id, distill.group_id, reflect.group_id, retry.group_id) == ("p0", "p0", "p0/reflect/0",
                                                                                   "p0/retry/0")
    assert (base.fixed_reward, distill.fixed_reward, reflect.fixed_reward, retry.fixed_reward) == (None, None, 1.0, 1.0)
    assert res.rewards == {"3:p0:0": 0.0, "3:p0:0:distill": 1.0}
    # the base was purified by SAAR: the reflection read the spliced turn, the replay re-ran the working call
    refl = res.reflections[0]
    assert "pritn" not in refl.messages[1]["content"] and "print(6 * 7)" in refl.messages[1]["content"]
    assert refl.messages[1]["content"].rstrip().endswith("Please output in the specified JSON format.")
    assert "Feedback: the final answer is wrong (reward 0/1)." in refl.messages[1]["content"]
    assert chat.eos_token not in refl.messages[1]["content"]
    assert [(p.position, p.ok, p.changed) for p in refl.replays] == [(0, True, False)]
    # token bookkeeping: turn 0 copied id for id, the guidance only in the retry, the new turn shared
    new_turn = chat.encode("\\boxed{42}") + [chat.eos_id]
    plain = chat.tool_response_ids("42")
    turn0 = distill.response_ids[: len(distill.response_ids) - len(new_turn) - len(plain)]
    assert distill.response_ids == turn0 + plain + new_turn
    assert base.response_ids[: len(turn0)] == turn0 and base.response_ids[len(turn0):][: len(plain)] == plain
    guidance = GUIDANCE_HEADER + guidance_text(REPORT)
    assert retry.response_ids == turn0 + chat.tool_system_ids("42", guidance) + new_turn
    assert retry.logprobs[: len(turn0)] == base.logprobs[: len(turn0)]
    assert distill.prompt_ids == retry.prompt_ids == base.prompt_ids
    assert GUIDANCE_HEADER not in chat.decode(distill.response_ids)
    assert retry.budget_extra == len(chat.tool_system_ids("42", guidance)) - len(chat.tool_response_ids("42"))
    assert [m["role"] for m in retry.messages] == ["user", "assistant", "tool", "system", "assistant"]
    assert [m["role"] for m in distill.messages] == ["user", "assistant", "tool", "assistant"]
    # pivotal credit: turn 0 masked in base, distill and retry; the reflection trains whole
    for t in (base, distill, retry):
        assert t.pivot == 1
        assert sum(t.response_mask[: len(turn0)]) == 0
    assert sum(base.response_mask) == len(chat.encode("\\boxed{41}")) + 1
    assert sum(distill.response_mask) == sum(retry.response_mask) == len(new_turn)
    assert reflect.response_mask == [1] * len(reflect.response_ids) and reflect.prompt_ids == refl.prompt_ids
    assert json.loads(reflect.messages[-1]["content"][len("Here is my analysis: "):]) == REPORT
    m = r3l_metrics(res.reflections, res.rows)
    assert m["r3l/valid_rate"] == 1.0 and m["r3l/perfect_rate"] == 0.0 and m["r3l/pivot_mean"] == 1.0
    assert m["r3l/pivot/1"] == 1 and m["r3l/retries"] == 1 and m["r3l/retry_succeeded"] == 1
    assert (m["r3l/second_success"], m["r3l/second_improve"], m["r3l/second_reward_diff"]) == (1.0, 1.0, 1.0)
    assert m["r3l/rows/base"] == m["r3l/rows/distill"] == m["r3l/rows/reflect"] == m["r3l/rows/retry"] == 1



def report(**kw) -> str:
    return json.dumps({**REPORT, **kw})


def test_a_kept_retry_and_its_distill_copy_record_their_tool_executions_once(chat, box):
    """The retry from step 0 runs its fixed call; the distill copy holds the same turns: the execution (and the
    retry's SAAR events) are written once, under the distill row, which is kept whether or not the retry is."""
    from tasks.stores.records import trajectory_frames

    res = run_r3l(chat, box, RuleEngine(chat, report(retry_from_step=0)))
    assert [t.kind for t in res.rows] == ["base", "distill", "reflect", "retry"]
    execs = trajectory_frames(res.rows, "run", 3, chat.decode)["executions"]
    per_row = dict(execs.group_by("traj_id").len().iter_rows())
    assert per_row.get("3:p0:0:retry", 0) == 0 and per_row["3:p0:0:distill"] == 1
    assert execs.filter(execs["traj_id"] == "3:p0:0:distill")["code"].to_list() == ["print(6 * 7)"]


def test_retry_from_step_zero_puts_the_guidance_in_the_system_prompt(chat, box):
    res = run_r3l(chat, box, RuleEngine(chat, report(retry_from_step=0)), guidance_template="compact",
                  guidance_indent=None)
    rows = by_kind(res)
    base, distill, retry = rows["base"], rows["distill"], rows["retry"]
    guidance = GUIDANCE_HEADER + guidance_text({**REPORT, "retry_from_step": 0}, GUIDANCE_TEMPLATE_COMPACT, None)
    assert retry.messages[0] == {"role": "system", "content": guidance}
    assert retry.prompt_ids == chat.prompt_ids(retry.messages[:2]) != base.prompt_ids
    assert distill.prompt_ids == base.prompt_ids and distill.messages[0] == ITEM.messages[0]
    assert distill.response_ids == retry.response_ids and distill.response_mask == retry.response_mask
    assert chat.decode(retry.response_ids).startswith("Fix the name. <tool_call>")
    assert retry.budget_extra == 0 and not res.reflections[0].replays
    assert all(t.pivot == 0 for t in (base, distill, retry)) and sum(base.response_mask) > 0
    assert [t.kind for t in res.rows] == ["base", "distill", "reflect", "retry"]


@pytest.mark.parametrize("text, reason", [
    ("I think the attempt went fine.", "not_json"),
    (json.dumps({"trajectory_summary": "s", "trajectory_outcome": "failure"}), "missing_keys"),
    (report(retry_from_step=2), "pivot_out_of_range"),
    (report(retry_from_step="soon"), "pivot_not_int"),
    (report(trajectory_outcome="meh"), "bad_outcome"),
    (report(improvement_suggestion=None), "missing_guidance"),
])
def test_invalid_reports_are_counted_and_only_the_base_trains(chat, box, text, reason):
    res = run_r3l(chat, box, RuleEngine(chat, text))
    assert [(t.kind, t.pivot, t.group_id) for t in res.rows] == [("base", 0, "p0")]
    assert res.reflections[0].check.reason == reason and res.reflections[0].retry is None
    m = r3l_metrics(res.reflections, res.rows)
    assert m["r3l/valid_rate"] == 0.0 and m[f"r3l/invalid/{reason}"] == 1 and m["r3l/retries"] == 0
    assert "r3l/second_success" not in m and "r3l/pivot_mean" not in m


def test_a_perfect_report_on_a_success_trains_the_reflection(chat, box):
    perfect = report(trajectory_outcome="success", improvement_suggestion=None, retry_from_step=None)
    res = run_r3l(chat, box, RuleEngine(chat, perfect, base_answer="\\boxed{42}"))
    assert [(t.kind, t.group_id, t.fixed_reward) for t in res.rows] == [("base", "p0", None),
                                                                       ("reflect", "p0/reflect/0", 1.0)]
    assert "Feedback: the final answer is correct (reward 1/1)." in res.reflections[0].messages[1]["content"]
    m = r3l_metrics(res.reflections, res.rows)
    assert m["r3l/valid_rate"] == 1.0 and m["r3l/perfect_rate"] == 1.0
    off = run_r3l(chat, box, RuleEngine(chat, perfect, base_answer="\\boxed{42}"), keep_perfect_reflections=False)
    assert [t.kind for t in off.rows] == ["base"]


def test_a_failed_retry_trains_base_and_distill_only(chat, box):
    res = run_r3l(chat, box, RuleEngine(chat, report(), retry_answer="\\boxed{40}"), n=4)
    assert [t.kind for t in res.rows] == ["base", "distill", "base", "distill"]
    assert [t.traj_id for t in res.rows] == ["3:p0:0", "3:p0:0:distill", "3:p0:1", "3:p0:1:distill"]
    m = r3l_metrics(res.reflections, res.rows)
    assert m["r3l/retries"] == 2 and m["r3l/retry_succeeded"] == 0
    assert (m["r3l/second_success"], m["r3l/second_improve"], m["r3l/second_reward_diff"]) == (0.0, 0.0, 0.0)


def test_too_long_and_ungraded_attempts_are_not_reflected(chat, box):
    engine = RuleEngine(chat, report())
    res = run_r3l(chat, box, engine, max_reflect_prompt_tokens=10)
    assert res.reflections[0].check.reason == "too_long" and [t.kind for t in res.rows] == ["base"]
    assert not any(REFLECTION_USER_HEAD.strip() in c for c in engine.contexts)
    cfg = RolloutConfig(n_samples=2, max_turns=4, saar=SAARConfig(raw_share=0.0))
    driver = R3LRollout(Rollout(cfg, RuleEngine(chat, report()), chat, box), R3LConfig(), lambda t: None)
    res = driver.run([ITEM], seed=0, step=3, progress=False)
    assert res.reflections[0].check.reason == "ungraded" and res.rewards == {}
    assert r3l_metrics(res.reflections, res.rows)["r3l/reflections"] == 0


class ChangingSandbox:
    """The real sandbox, except that ``print(6 * 7)`` raises from its second run on (the world changed)."""

    def __init__(self, box):
        self.box, self.seen = box, 0

    def _swap(self, code):
        if code == "print(6 * 7)":
            self.seen += 1
            if self.seen > 1:
                return "raise RuntimeError('the file is gone')"
        return code

    def run(self, code, setup=None):
        return self.box.run(self._swap(code), setup)

    def run_many(self, codes, setups=None):
        return self.box.run_many([self._swap(c) for c in codes], setups=setups)


def test_a_replayed_call_that_now_fails_is_recorded_with_its_error(chat, box):
    res = run_r3l(chat, ChangingSandbox(box), RuleEngine(chat, report()))
    refl = res.reflections[0]
    (replay,) = refl.replays
    assert (replay.ok, replay.error_kind, replay.original_ok, replay.original_error_kind) == (
        False, "RuntimeError", True, None)
    assert replay.changed and "the file is gone" in replay.error_text
    assert "RuntimeError: the file is gone" in refl.retry.messages[2]["content"]
    assert r3l_metrics(res.reflections, res.rows)["r3l/replay_changed"] == 1


def test_rows_reflection_table_and_viewer(chat, box):
    from tasks.r3l.records import reflection_frame
    from tasks.r3l.view import render_r3l_section
    from tasks.stores.records import trajectory_frames

    res = run_r3l(chat, box, RuleEngine(chat, report(trajectory_summary="<script>x</script>")), n=4)
    trajs = trajectory_frames(res.rows, "run", 3, chat.decode)["trajectories"]
    assert trajs.select("traj_id", "kind", "group_id", "fixed_reward", "masked_turns", "parent").rows() == [
        ("3:p0:0", "base", "p0", None, 1, None), ("3:p0:0:distill", "distill", "p0", None, 1, "3:p0:0"),
        ("3:p0:0:reflect", "reflect", "p0/reflect/0", 1.0, 0, "3:p0:0"),
        ("3:p0:0:retry", "retry", "p0/retry/0", 1.0, 1, "3:p0:0"),
        ("3:p0:1", "base", "p0", None, 1, None), ("3:p0:1:distill", "distill", "p0", None, 1, "3:p0:1"),
        ("3:p0:1:reflect", "reflect", "p0/reflect/1", 1.0, 0, "3:p0:1"),
        ("3:p0:1:retry", "retry", "p0/retry/1", 1.0, 1, "3:p0:1"),
    ]
    refl = reflection_frame(res.reflections, "run", 3)
    assert refl.height == 2 and refl["retry_from_step"].to_list() == [1, 1] and refl["valid"].all()
    assert json.loads(refl["report"][0])["trajectory_summary"] == "<script>x</script>"
    assert refl["retry_succeeded"].all()
    assert json.loads(refl["replays"][0]) == [{"position": 0, "code": "print(6 * 7)", "ok": True, "error_kind": None,
                                               "error_text": "", "original_ok": True, "original_error_kind": None,
                                               "changed": False}]
    html = render_r3l_section(trajs, refl, 1)
    assert html.count("class='r3l'") == 1 and "&lt;script&gt;x" in html and "<script>x" not in html
    assert html.count("masked (before pivot)") == 1 and html.count("copied from base, masked") == 1
    assert html.count("badge guidance") == 1 and "reflection + retry train" in html
    assert render_r3l_section(trajs, refl.clear(), 3) == ""


def test_corpus_transcripts_build_the_same_ids_as_the_rollout(chat, box):
    """What the warm-up corpus writes with tasks.r3l (reflection, guided retry) is token for token what RL sees."""
    from models.chat import build_sft_example
    from tasks.r3l import guided_retry_messages, outcome_feedback, reflection_messages
    from tasks.r3l.driver import attempt_messages

    engine = RuleEngine(chat, report())
    engine.reply = lambda ctx, base=engine.reply: FIXED if base(ctx) == FAILED else base(ctx)
    res = run_r3l(chat, box, engine, n=2)
    rows, refl = by_kind(res), res.reflections[0]
    attempt = attempt_messages(refl.base, chat)
    retry_sft = guided_retry_messages(attempt, REPORT, 1, [{"role": "assistant", "content": "\\boxed{42}"}])
    ids, mask = build_sft_example(chat, retry_sft)
    retry = rows["retry"]
    assert ids == retry.prompt_ids + retry.response_ids
    assert mask[-len(retry.response_ids):][-4:] == retry.response_mask[-4:]
    reflect_sft = reflection_messages(attempt, refl.messages[0]["content"], REPORT, outcome_feedback(0.0))
    ids, mask = build_sft_example(chat, reflect_sft)
    reflect = rows["reflect"]
    assert ids == reflect.prompt_ids + reflect.response_ids and sum(mask) == len(reflect.response_ids)
