"""Data: RL prompt files (loaders, dataset formats, the paper's prompt wording) and the synthetic task
(``synthetic``: problems by family, planted mistakes, the warm-up corpus)."""
