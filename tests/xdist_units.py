"""A pytest-xdist scheduler that hands out whole units of work in collection order (tests/conftest.py says which).

xdist's own ``loadgroup`` groups by an ``@group`` suffix it appends to ``item._nodeid``; pytest 9 builds ``nodeid``
from ``item._id`` instead, so the suffix never reaches the scheduler and every test would be a unit of its own. Here
the unit is computed from the plain node id. Units are handed out in the order the workers collected them (the
collection puts the slow ones first), not reordered by their number of tests as ``loadscope`` does by default.
"""

from __future__ import annotations

from collections.abc import Callable

from xdist.scheduler import LoadScopeScheduling


class UnitScheduling(LoadScopeScheduling):
    """``LoadScopeScheduling`` with ``unit_of(nodeid)`` as the scope."""

    def __init__(self, config, log, unit_of: Callable[[str], str]) -> None:
        super().__init__(config, log)
        self.unit_of = unit_of
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return self.unit_of(nodeid)
