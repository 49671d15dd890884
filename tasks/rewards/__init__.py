"""Rewards: the grader registry (math, multiple choice, code tests in the sandbox) and reward shaping."""
