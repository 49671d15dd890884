"""Rollout: the agent loop that joins the policy with the sandbox (state machine, its data types) and SAAR's rules."""
