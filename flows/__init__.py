"""Prefect flows (``train``, ``evaluate``, ``warmup``, ``compare``), the run config tree and the ``cleaner`` CLI.

The top layer: flows import ``tasks`` (and through it ``models``, ``sandbox``); nothing imports ``flows``.
Flow modules import only config modules and light store helpers at the top (torch is loaded inside the
tasks), so Prefect workers and ``cleaner --help`` start fast (``tests/test_light_imports.py``).
"""

import os

# MLflow prints "View run … at: <url>" when a run on a tracking server ends, with a link that opens its GenAI view;
# the flows print their own links, in the model-training view (``tasks.stores.links``).
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
