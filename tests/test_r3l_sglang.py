"""R3L with the SGLang HTTP engine, against the CPU test server that honours SGLang's ``/generate`` contract.

Two passes over the same prompts: the tiny model's own reflections (whatever it writes is
parsed, validated and counted, never a crash), then reflections answered with a fixed valid
report so that guided retries run through HTTP too.
"""

from __future__ import annotations

import json

import pytest

from models.engine import EngineConfig, GenOutput, make_engine
from models.sglang_test_server import start_test_server, stop_server
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.r3l.driver import R3LRollout, r3l_metrics
from tasks.r3l.prompts import REFLECTION_USER_HEAD
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.r3l_config import R3LConfig
from tasks.rollout.types import PromptItem

ITEMS = [PromptItem(f"p{i}", [{"role": "user", "content": q}], "synthetic/arith", a)
         for i, (q, a) in enumerate([("What is 123 * 45?", "5535"), ("What is 9876 + 5432?", "15308")])]
REPORT = {"trajectory_summary": "s", "root_cause_analysis": "Why? Because.", "trajectory_outcome": "failure",
          "improvement_suggestion": "Print the result and copy it.", "retry_from_step": 0}


@pytest.fixture(scope="module")
def engine(warm_model_dir, chat, tmp_path_factory):
    proc, url = start_test_server(warm_model_dir, log_path=tmp_path_factory.mktemp("sglang") / "server.log")
    eng = make_engine(EngineConfig(kind="sglang", server_urls=[url], max_retries=1), warm_model_dir, chat.eos_id, 0)
    yield eng
    eng.close()
    stop_server(proc)


class FixedReports:
    """The HTTP engine, with reflection requests answered by ``REPORT``."""

    def __init__(self, inner, chat):
        self.inner, self.chat, self.eos_id = inner, chat, inner.eos_id

    def generate(self, requests, seed):
        out = self.inner.generate(requests, seed)
        for i, req in enumerate(requests):
            if REFLECTION_USER_HEAD.strip() in self.chat.decode(req.input_ids):
                ids = self.chat.encode(json.dumps(REPORT)) + [self.eos_id]
                out[i] = GenOutput(ids, [-0.1] * len(ids), "stop")
        return out


def _run(engine, chat, box):
    cfg = RolloutConfig(n_samples=4, max_turns=3, max_new_tokens=96, max_response_tokens=256,
                        saar=SAARConfig(raw_share=0.5))
    r3l = R3LConfig(reflection_prompt="compact", guidance_template="compact", guidance_indent=None,
                    max_reflect_tokens=48)
    grade = lambda t: 1.0 if "\\boxed{" + t.item.ground_truth + "}" in chat.decode(t.response_ids) else 0.0
    return R3LRollout(Rollout(cfg, engine, chat, box), r3l, grade).run(ITEMS, seed=0, step=0, progress=False)


def test_r3l_rollout_through_the_http_engine(engine, chat):
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as box:
        own = _run(engine, chat, box)
        fixed = _run(FixedReports(engine, chat), chat, box)
    # the model's own reports: every attempt reflected, each counted valid or invalid by reason
    m = r3l_metrics(own.reflections, own.rows)
    assert m["r3l/reflections"] == 4 and len(own.reflections) == 4
    invalid = sum(v for k, v in m.items() if k.startswith("r3l/invalid/"))
    assert invalid + round(m["r3l/valid_rate"] * 4) == 4
    assert all(r.response_ids and len(r.response_ids) <= 48 for r in own.reflections)
    # fixed valid reports: every attempt retried through HTTP, distill = retry ids under the base prompt
    assert [r.check.reason for r in fixed.reflections] == ["ok"] * 4
    for r in fixed.reflections:
        assert r.distill.response_ids == r.retry.response_ids and r.distill.prompt_ids == r.base.prompt_ids
        assert r.retry.prompt_ids != r.base.prompt_ids and len(r.retry.response_ids) > 0
    assert r3l_metrics(fixed.reflections, fixed.rows)["r3l/retries"] == 4
