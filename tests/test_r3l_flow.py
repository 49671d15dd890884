"""R3L through the Prefect ``train`` flow on the tiny model: rows, reflections, metrics, viewer, update.

The engine is the real in-process model, except that reflection requests are answered with a
fixed valid report (pivot 0): the committed tiny model may not write reports yet, and this test
is about the plumbing (every later stage, both stores, the KL-regularised OPMD update).
"""

from __future__ import annotations

import json

import duckdb
import pytest
from mlflow.tracking import MlflowClient

from flows.config import ARM_PRESETS
from flows.train import train
from models.engine import GenOutput, make_engine, register_engine
from tasks.r3l.prompts import REFLECTION_PROMPT_COMPACT
from tests.flowrun import tiny_overrides

REPORT = {"trajectory_summary": "s", "root_cause_analysis": "Why? Because.", "trajectory_outcome": "failure",
          "improvement_suggestion": "Check the printed number before answering.", "retry_from_step": 0}


@register_engine("test_reflect")
class ReflectingEngine:
    """The transformers engine; reflection requests get ``REPORT`` (as the model's ids)."""

    def __init__(self, cfg, model_path, eos_id, pad_id):
        from transformers import AutoTokenizer

        self.inner = make_engine(cfg.model_copy(update={"kind": "transformers"}), model_path, eos_id, pad_id)
        self.tok, self.eos_id = AutoTokenizer.from_pretrained(str(model_path)), eos_id
        self.reflections = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, requests, seed):
        out = self.inner.generate(requests, seed)
        for i, req in enumerate(requests):
            if REFLECTION_PROMPT_COMPACT in self.tok.decode(req.input_ids):
                self.reflections += 1
                ids = self.tok.encode(json.dumps(REPORT), add_special_tokens=False) + [self.eos_id]
                out[i] = GenOutput(ids, [-0.1] * len(ids), "stop")
        return out


@pytest.fixture(scope="module")
def r3l_run(prefect_harness, warm_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("r3lflow")
    overrides = [*tiny_overrides(work, warm_model_dir), "data.prompts_per_step=2", *ARM_PRESETS["r3l"],
                 "engine.kind=test_reflect", "rollout.max_new_tokens=96", "rollout.max_response_tokens=256",
                 "rollout.r3l.guidance_template=compact", "rollout.r3l.guidance_indent=null",
                 "rollout.r3l.reflection_prompt=compact", "rollout.r3l.max_reflect_tokens=64"]
    result = train("configs/tiny.yaml", overrides, "r3lflow")
    return work, result


def test_every_base_attempt_is_reflected_and_retried(r3l_run):
    work, _ = r3l_run
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    try:
        refl = con.execute("SELECT step, count(*), bool_and(valid), bool_and(retry_from_step = 0), "
                           "count(distill_traj_id) FROM r3l_reflections WHERE run_id = 'r3lflow' GROUP BY step "
                           "ORDER BY step").fetchall()
        assert refl == [(0, 4, True, True, 4), (1, 4, True, True, 4)], "2 prompts x 2 base attempts per step"
        kinds = dict(con.execute("SELECT kind, count(*) FROM trajectories WHERE run_id = 'r3lflow' AND step = 0 "
                                 "GROUP BY kind").fetchall())
        succeeded = con.execute("SELECT count(*) FROM r3l_reflections WHERE run_id = 'r3lflow' AND step = 0 "
                                "AND retry_succeeded").fetchone()[0]
        assert kinds.get("base") == 4 and kinds.get("distill") == 4
        assert kinds.get("reflect", 0) == kinds.get("retry", 0) == succeeded
        fixed = con.execute("SELECT bool_and(reward = 1.0 AND kept) FROM trajectories WHERE run_id = 'r3lflow' "
                            "AND kind IN ('reflect', 'retry')").fetchone()[0]
        assert fixed in (True, None)
        groups = con.execute("SELECT count(DISTINCT group_id) FROM trajectories WHERE run_id = 'r3lflow' AND step = 0 "
                             "AND kind IN ('base', 'distill')").fetchone()[0]
        assert groups == 2
    finally:
        con.close()


def test_r3l_metrics_and_viewer_reach_mlflow(r3l_run):
    work, result = r3l_run
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    m = run.data.metrics
    assert m["r3l/valid_rate"] == 1.0 and m["r3l/pivot_mean"] == 0.0 and m["r3l/retries"] == 4
    for key in ("r3l/second_success", "r3l/second_improve", "r3l/second_reward_diff", "r3l/pivot/0", "train/kl"):
        assert key in m, key
    assert run.data.params["trainer.loss"] == "opmd" and run.data.params["mix.advantage"] == "opmd_reweight_adv"
    html = (work / "mlartifacts").rglob("step_000001.html")
    page = next(html).read_text()
    assert "R3L: base attempt" in page and "badge guidance" in page
