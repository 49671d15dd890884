#!/usr/bin/env bash
# CLEANER (SAAR) inside verl's Ray + FSDP trainer, the paper's setup (configs/verl/cleaner_grpo.yaml).
#
#   infra/verl/run_cleaner_grpo.sh [hydra overrides...]
#   MODEL=/ckpt/Qwen3-4B TRAIN=data/verl/train.parquet VAL=data/verl/val.parquet GPUS=8 infra/verl/run_cleaner_grpo.sh
#
# Needs a CUDA node installed from requirements-gpu.lock (docs/run_at_scale.md: verl, SGLang, flash-attn, then the
# project with --no-deps); `python -m infra.verl.preflight` checks it first. Data: verl RL parquet, written from any
# supported format by `cleaner data to-verl FILE... --out data/verl/train.parquet`.
# One node: run it from the repo root (verl starts Ray itself). Several nodes: `ray start --head` on this one,
# `ray start --address=<head>:6379` on the others, then run it here once (the one driver) with NNODES=<n> and
# RAY_ADDRESS=auto; the workers import `tasks.training.verl_loop` from the same repo path on every node, or, with
# SHIP=runtime_env, from this checkout shipped by Ray (runtime_env working_dir; paths below become relative).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-Qwen/Qwen3-4B}
TRAIN=${TRAIN:-data/verl/train.parquet}
VAL=${VAL:-data/verl/val.parquet}
GPUS=${GPUS:-8}
NNODES=${NNODES:-1}
SHIP=${SHIP:-installed}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false TOKENIZERS_PARALLELISM=false
python -c 'import verl, sglang' 2>/dev/null || { echo "run_cleaner_grpo.sh: needs verl and sglang (install requirements-gpu.lock on a CUDA node: docs/run_at_scale.md)" >&2; exit 2; }

case "$SHIP" in
  installed) HERE="$PWD"; SHIPPED=() ;;
  runtime_env) HERE="."
    SHIPPED=("+ray_kwargs.ray_init.runtime_env.working_dir=$PWD"
             "+ray_kwargs.ray_init.runtime_env.excludes=[.git,.venv,.venv-verl,.venv-lock,.venv-gpu-tf,runs,mlartifacts,data,mutants]") ;;
  *) echo "run_cleaner_grpo.sh: SHIP must be installed or runtime_env, got $SHIP" >&2; exit 2 ;;
esac

exec python -m verl.trainer.main_ppo \
  --config-path "$PWD/configs/verl" --config-name cleaner_grpo \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$TRAIN" data.val_files="$VAL" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/configs/verl/agent_loops.yaml" \
  reward.custom_reward_function.path="$HERE/tasks/training/verl_loop.py" \
  trainer.n_gpus_per_node="$GPUS" trainer.nnodes="$NNODES" \
  ${SHIPPED[@]+"${SHIPPED[@]}"} "$@"
