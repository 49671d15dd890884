"""Training: the stages of one RL step and their setups, group mixing and advantage estimators,
evaluation, rollout modes, partial-rollout and environment stages, the warm-up gate, the live
engine/sandbox caches, fault injection, SAAR as a verl agent loop, and the rollout and engine benchmarks."""
