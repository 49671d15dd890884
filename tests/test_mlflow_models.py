"""Checkpoints as MLflow logged models and the registry's aliases, on the tiny model in a real sqlite store.

A LoRA checkpoint is logged merged into its base and loads with ``mlflow.transformers.load_model`` giving
the adapter's outputs; logging a checkpoint twice reuses it; ``@best`` moves only to a strictly better
held-out pass@1 across runs, and ``@latest`` is the newest run's final checkpoint.
"""

from __future__ import annotations

import pytest
import torch

from models.lora import is_adapter, load_policy
from tasks.stores import registry, tracking
from tasks.stores.config import TrackingConfig
from tests.test_lora import _adapter, _logits

PASS = "eval/saar_off/all/pass_at_1"


@pytest.fixture
def store(tmp_path):
    import mlflow

    cfg = TrackingConfig(mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "art"))
    yield cfg
    mlflow.set_tracking_uri(None)


def test_a_lora_checkpoint_is_logged_merged_and_loads_with_the_adapters_outputs(store, warm_model_dir, tmp_path, chat):
    import mlflow.transformers

    adapter = _adapter(warm_model_dir, tmp_path / "adapter", 0)
    assert is_adapter(adapter)
    mlrun = tracking.open_run(store, "lora", "r1", {}, {})
    model_id = registry.log_checkpoint(store, mlrun, "r1", "lora", adapter, 3, {PASS: 0.5})
    assert registry.log_checkpoint(store, mlrun, "r1", "lora", adapter, 3, {PASS: 0.5}) == model_id  # reused
    assert [m.model_id for m in registry.run_models(store, mlrun, "r1")] == [model_id]
    pipe = mlflow.transformers.load_model(f"models:/{model_id}")
    ids = chat.prompt_ids([{"role": "user", "content": "What is 12 * 34?"}])
    assert torch.allclose(_logits(pipe.model, ids), _logits(load_policy(adapter), ids), atol=1e-4)
    assert pipe.tokenizer.chat_template == chat.tokenizer.chat_template


def _run(cfg: TrackingConfig, run_id: str, ckpt, passes: dict[int, float]) -> dict[str, str]:
    mlrun = tracking.open_run(cfg, "reg", run_id, {}, {})
    for version, p in passes.items():
        registry.log_checkpoint(cfg, mlrun, run_id, "reg", ckpt, version, {PASS: p})
    return registry.register_run(cfg, mlrun, run_id, "reg")


def test_best_moves_only_to_a_better_checkpoint_and_latest_is_the_last_final(store, warm_model_dir, tmp_path, capfd):
    from mlflow import MlflowClient

    client = MlflowClient(store.mlflow_uri, registry_uri=store.mlflow_uri)

    def alias(name: str) -> str:
        tags = client.get_model_version_by_alias("reg", name).tags
        return f"{tags['cleaner.run_id']}:{tags['cleaner.policy_version']}"

    # run a: best policy 2 (0.5) registered first (version 1), final policy 4 (0.375) second (version 2)
    assert _run(store, "a", warm_model_dir, {0: 0.25, 2: 0.5, 4: 0.375}) == {"run_best": "1", "final": "2", "best": "1"}
    assert (alias("best"), alias("latest")) == ("a:2", "a:4")
    # run b: its best is its final (0.25 < 0.5): one version, @best stays with run a
    assert _run(store, "b", warm_model_dir, {0: 0.125, 2: 0.25}) == {"run_best": "3", "final": "3", "best": "1"}
    assert (alias("best"), alias("latest")) == ("a:2", "b:2")
    # run c: a tie (0.5) does not move @best; run d: 0.75 does
    assert _run(store, "c", warm_model_dir, {1: 0.5})["best"] == "1"
    assert _run(store, "d", warm_model_dir, {1: 0.75})["best"] == "5"
    assert (alias("best"), alias("latest")) == ("d:1", "d:1")
    folder, model_id = registry.resolve(store, "models:/reg@best", tmp_path / "cache")
    assert model_id == registry.model_id_of(client.get_model_version_by_alias("reg", "best"))
    assert folder == tmp_path / "cache" / model_id / "model" and (folder / "config.json").exists()
    assert client.get_logged_model(model_id).tags["cleaner.run_id"] == "d"
    assert client.get_logged_model(model_id).tags["mlflow.modelVersions"] == '[{"name": "reg", "version": 5}]'
    assert "already exists" not in capfd.readouterr().err  # a fresh store: no "Registered model 'reg' already exists"


@pytest.mark.parametrize(("register", "deployment", "parent", "want"), [
    (None, None, None, False),  # `cleaner train` from the shell, a smoke run: the registry is left alone
    (None, "dep-1", None, True),  # a deployment's run (a schedule, the UI)
    (None, None, "mlrun-parent", True),  # a comparison's run
    (False, "dep-1", "mlrun-parent", False),
    (True, None, None, True),  # asked for (the demo does)
])
def test_which_runs_register(register, deployment, parent, want):
    assert registry.wants_registration(register, deployment, parent) is want


def test_env_runs_rank_by_held_out_success_and_best_moves(store, warm_model_dir):
    """An environment evaluation has no pass@1: its checkpoints are ranked by ``eval/<env>/success``."""
    from mlflow import MlflowClient

    client = MlflowClient(store.mlflow_uri, registry_uri=store.mlflow_uri)
    key = "eval/bandit_test/success"

    def env_run(run_id: str, success: dict[int, float]) -> dict[str, str]:
        mlrun = tracking.open_run(store, "env", run_id, {}, {})
        for version, p in success.items():
            registry.log_checkpoint(store, mlrun, run_id, "env", warm_model_dir, version,
                                    {key: p, "eval/bandit_test/score": 9.0})
        return registry.register_run(store, mlrun, run_id, "env")

    assert env_run("a", {0: 0.25, 2: 0.5}) == {"run_best": "1", "final": "1", "best": "1"}
    best = client.get_model_version_by_alias("env", "best")
    assert (best.tags["cleaner.score"], best.tags["cleaner.score_key"]) == ("0.5", key)
    assert "cleaner.pass_at_1" not in best.tags
    assert env_run("b", {0: 0.375}) == {"run_best": "2", "final": "2", "best": "1"}  # worse: @best stays
    assert env_run("c", {0: 0.75, 2: 0.625}) == {"run_best": "3", "final": "4", "best": "3"}  # better: it moves
    assert registry.rank_metric({key: 0.5, PASS: 0.25}) == (PASS, 0.25)  # tool-use pass@1 first
    assert registry.rank_metric({"eval/bandit_test/score": 1.0}) is None


def test_best_moves_under_a_lock_beside_the_sqlite_registry(store, warm_model_dir):
    """Runs that finish together read who holds ``@best`` and move it under one lock (the sqlite store inserted two
    alias rows at once: 'UNIQUE constraint failed: registered_model_aliases'); a mover waits while it is held."""
    import threading
    import time

    from mlflow import MlflowClient

    client = MlflowClient(store.mlflow_uri, registry_uri=store.mlflow_uri)
    assert _run(store, "a", warm_model_dir, {1: 0.5})["best"] == "1"
    out: dict[str, str] = {}
    with registry._alias_lock(store):
        mover = threading.Thread(target=lambda: out.update(_run(store, "b", warm_model_dir, {1: 0.75})))
        mover.start()
        deadline = time.monotonic() + 120
        while not client.search_model_versions("name = 'reg' and tags.`cleaner.run_id` = 'b'"):
            assert mover.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # b's version exists: the mover is at the alias, and must still be waiting
        assert mover.is_alive() and not out
        assert client.get_model_version_by_alias("reg", "best").version == 1
    mover.join(timeout=120)
    assert out["best"] == "2" and client.get_model_version_by_alias("reg", "best").version == 2
