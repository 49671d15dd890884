"""Pipeline stages, by concern: ``rollout`` (agent loop + SAAR), ``data``, ``rewards``, ``stores``, ``reports``, ``training``,
``envs`` (multi-turn text games) and ``r3l`` (reflect and retry).

Layering: ``tasks`` imports ``models`` and ``sandbox``; nothing here imports ``flows``.
"""
