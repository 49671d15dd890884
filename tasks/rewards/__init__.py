"""Rewards: the grader registry (math, multiple choice, code tests in the sandbox: harness, judge program,
answer comparison) and reward shaping."""
