#!/usr/bin/env bash
# CLEANER (SAAR) inside verl's Ray + FSDP trainer, the paper's setup (configs/verl/cleaner_grpo.yaml).
#
#   infra/verl/run_cleaner_grpo.sh [hydra overrides...]
#   MODEL=/ckpt/Qwen3-4B TRAIN=data/verl/train.parquet VAL=data/verl/val.parquet GPUS=8 infra/verl/run_cleaner_grpo.sh
#
# Needs a CUDA node with `pip install -e '.[verl,gpu]'` (verl + SGLang), run from the repo root so
# Ray workers import `tasks.training.verl_loop`. Data: verl RL parquet (`cleaner data ...` writes it).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-Qwen/Qwen3-4B}
TRAIN=${TRAIN:-data/verl/train.parquet}
VAL=${VAL:-data/verl/val.parquet}
GPUS=${GPUS:-8}
NNODES=${NNODES:-1}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false TOKENIZERS_PARALLELISM=false
python -c 'import verl, sglang' 2>/dev/null || { echo "run_cleaner_grpo.sh: needs verl and sglang (pip install -e '.[verl,gpu]' on a CUDA node)" >&2; exit 2; }

exec python -m verl.trainer.main_ppo \
  --config-path "$PWD/configs/verl" --config-name cleaner_grpo \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$TRAIN" data.val_files="$VAL" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$PWD/configs/verl/agent_loops.yaml" \
  reward.custom_reward_function.path="$PWD/tasks/training/verl_loop.py" \
  trainer.n_gpus_per_node="$GPUS" trainer.nnodes="$NNODES" \
  "$@"
