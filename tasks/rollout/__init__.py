"""Rollout: the agent loop that joins the policy with the sandbox (state machine, its data types),
SAAR's rules, and APRIL's partial rollouts with their carried buffer."""
