"""Pipeline stages, by concern: ``rollout`` (agent loop + SAAR), ``data``, ``rewards``, ``stores``, ``reports``, ``training``.

Layering: ``tasks`` imports ``models`` and ``sandbox``; nothing here imports ``flows``.
"""
