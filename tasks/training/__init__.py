"""Training: the stages of one RL step, group mixing and advantages, evaluation, fault injection."""
