"""Data: RL prompt files (loaders, dataset formats, the paper's prompt wording)."""
