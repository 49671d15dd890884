"""Code execution for tool calls: one ``ExecutionResult`` type, several isolated backends.

``make_sandbox(SandboxConfig(backend=...))`` builds ``local`` (host fork-server executors,
bubblewrap where available), ``docker`` (warm pool of locked-down containers) or ``auto``.
See ``sandbox/THREAT_MODEL.md`` for what is isolated and ``sandbox/bench.py`` for speed.
"""
