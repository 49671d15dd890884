"""Rollout: the agent loop that joins the policy with the sandbox, SAAR's rules, and SAAR as a verl agent loop."""
