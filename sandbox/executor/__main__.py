"""``python -m sandbox.executor`` (or the launcher line of ``launch_argv``) starts the fork server."""

from .server import main

main()
