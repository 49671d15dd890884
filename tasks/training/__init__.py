"""Training: the stages of one RL step and their setups, group mixing and advantages, evaluation, the live
engine/sandbox caches, fault injection, SAAR as a verl agent loop, and the rollout and engine benchmarks."""
