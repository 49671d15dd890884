"""verl's own trainers on CPU through real Ray actors, up to their first ``generate_sequences`` and back.

Both trainers start from the paper's config (``configs/verl/cleaner_grpo.yaml`` on verl's ``ppo_trainer``
defaults) shrunk to this machine, with data read by verl's own dataset from a parquet file:

- **V1** (``trainer.use_v1``, verl's default): what ``verl.trainer.main_ppo.TaskRunnerV1.run`` does —
  ``tq.init(config.transfer_queue)``, the trainer class of ``trainer.v1.trainer_mode`` (``PPOTrainerSync``), its
  ``init``, the agent-loop manager built by ``TaskRunnerV1.init_agent_loop_manager`` itself (from
  ``rollout.agent.agent_loop_manager_class``) and ``trainer.fit``; the first replay-buffer sample (the rows V1's
  Ray agent-loop workers put into TransferQueue) is read back whole and the run stops there.
- **legacy** (``trainer.use_v1=false``): ``RayPPOTrainer(...).fit()``; the manager is built as its
  ``init_workers`` builds it, and the run stops when the first ``generate_sequences`` returns.

Replaced, because they cannot run here and the run stops before they are used: the rollout servers (verl's
replicas are vLLM, SGLang or TensorRT-LLM, GPU only) by ``ScriptClient`` (verl's ``LLMServerClient`` contract,
``TokenOutput`` with the server's ``global_steps`` as the real client tags it), the FSDP worker groups and the
checkpoint engine (GPU placement groups; ``NoCheckpoints``). Everything else — datasets, dataloaders, ``fit``,
the manager's creation, the Ray workers, TransferQueue and the replay buffer — is verl's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from tests.scripted import scripted_turn

ROOT = Path(__file__).resolve().parents[1]
SERVER_STEP = 1
"""The weights version the scripted servers report (``TokenOutput.extra_fields["global_steps"]``)."""


class StopAfterRollout(Exception):
    """Raised once the first rollout is back; carries it."""

    def __init__(self, rows):
        super().__init__("stopped after the first rollout")
        self.rows = rows


class ScriptClient:
    """Stands in for verl's ``LLMServerClient``: ``generate(request_id, *, prompt_ids, sampling_params)`` answers
    from the script of the case named in the prompt (``case <name>``); each request id (one trajectory: the loop
    keeps one for all its turns) walks its own copy. Picklable: verl sends it to every agent-loop worker."""

    def __init__(self, model_dir, scripts: dict[str, list]):
        self.model_dir, self.scripts = str(model_dir), scripts
        self._chat, self._left = None, {}

    def __getstate__(self):
        return {**self.__dict__, "_chat": None}

    @property
    def chat(self):
        if self._chat is None:
            from transformers import AutoTokenizer

            from models.chat import ChatFormat

            self._chat = ChatFormat(AutoTokenizer.from_pretrained(self.model_dir))
        return self._chat

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        assert sampling_params["logprobs"] and sampling_params["max_new_tokens"] >= 1
        case = re.search(r"case (\w+)", self.chat.decode(prompt_ids)).group(1)
        left = self._left.setdefault(request_id, list(self.scripts[case]))
        ids, lps, finish = scripted_turn(self.chat, left.pop(0), -0.001 * (len(left) + 1))
        fields = {"global_steps": SERVER_STEP, "min_global_steps": SERVER_STEP, "max_global_steps": SERVER_STEP}
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason=finish, num_preempted=0, extra_fields=fields)


class NoCheckpoints:
    """The checkpoint engine's calls the trainers make before their first rollout: nothing to sync here."""

    def update_weights(self, *args, **kwargs):
        return None

    def sleep_replicas(self, *args, **kwargs):
        return None


def write_rows(path: Path, rows: list[dict]) -> Path:
    """A verl RL parquet (``data_source``, ``prompt``, ``ability``, ``reward_model``, ``extra_info``)."""
    pd.DataFrame(rows).to_parquet(path)
    return path


def compose(model_dir, data: Path, *overrides: str):
    """The paper's config on verl's defaults, shrunk to 2 cores: ``overrides`` last."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    small = [
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data}", f"data.val_files={data}",
        "data.train_batch_size=2", "data.max_prompt_length=1024", "data.max_response_length=512",
        "data.dataloader_num_workers=0", "data.filter_overlong_prompts=false",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={ROOT}/configs/verl/agent_loops.yaml",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "cleaner.max_new_tokens=128",
        "cleaner.sandbox.backend=local", "cleaner.sandbox.workers=1", "reward.reward_kwargs.max_resp_len=512",
        "trainer.logger=[console]", "trainer.val_before_train=false", "trainer.resume_mode=disable",
        "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "transfer_queue.backend.SimpleStorage.total_storage_size=64", *overrides,
    ]
    with initialize_config_dir(config_dir=str(ROOT / "configs" / "verl"), version_base=None):
        return hydra_compose(config_name="cleaner_grpo", overrides=small)


def start_ray() -> None:
    import ray

    env = {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(ROOT / ".prefect"))}
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})


def run_v1(config, client: ScriptClient) -> dict:
    """verl's V1 task runner's steps, to the first replay-buffer sample; its rows read back from TransferQueue."""
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)

    class RolloutOnly(trainer_cls):
        def _setup(self):  # the CPU half of PPOTrainer._setup: no worker groups, servers or checkpoint engine
            self._init_tokenizer()
            self._init_dataloader()
            self._init_dump_executor()
            self.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=None)
            self.checkpoint_manager = NoCheckpoints()
            self._load_checkpoint()

        def get_llm_client(self):
            return client

    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    tq.init(config.transfer_queue)
    try:
        runner = SimpleNamespace(config=config, trainer=RolloutOnly(config=config))
        runner.trainer.init()
        TaskRunnerV1.__ray_metadata__.modified_class.init_agent_loop_manager(runner)
        sample = runner.trainer.replay_buffer.sample

        def sample_then_stop(*args, **kwargs):
            batch, _ = sample(*args, **kwargs)
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id)
            raise StopAfterRollout({"keys": list(batch.keys), "tags": list(batch.tags), "data": data})

        runner.trainer.replay_buffer.sample = sample_then_stop
        try:
            runner.trainer.fit(runner.agent_loop_manager)
        except StopAfterRollout as stop:
            return {"manager": runner.agent_loop_manager, **stop.rows}
        raise AssertionError("fit() ended without sampling a rollout")
    finally:
        tq.close()


def run_legacy(config, client: ScriptClient):
    """verl's legacy ``RayPPOTrainer.fit`` to its first ``generate_sequences``; returns (manager, its output)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.import_utils import load_class_from_fqn
    from verl.workers.config import HFModelConfig

    model = omega_conf_to_dataclass(config.actor_rollout_ref.model, HFModelConfig)
    trainer = RayPPOTrainer(config=config, tokenizer=model.tokenizer, processor=model.processor,
                            role_worker_mapping={Role.ActorRollout: None}, resource_pool_manager=None,
                            collate_fn=collate_fn)
    fqn = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class  # as RayPPOTrainer.init_workers does
    manager = load_class_from_fqn(fqn, "AgentLoopManager").create(
        config=config, llm_client=client, teacher_client=None, reward_loop_worker_handles=None)
    generate = manager.generate_sequences

    def generate_then_stop(batch):
        raise StopAfterRollout(generate(batch))

    manager.generate_sequences = generate_then_stop
    trainer.async_rollout_manager, trainer.checkpoint_manager = manager, NoCheckpoints()
    trainer.actor_rollout_wg = SimpleNamespace()
    try:
        trainer.fit()
    except StopAfterRollout as stop:
        return manager, stop.rows
    raise AssertionError("fit() ended without a rollout")
