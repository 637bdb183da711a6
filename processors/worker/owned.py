"""The input partitions an agent holds: what the run-lifetime sweep and the OTel tick act on."""

from __future__ import annotations

from collections.abc import Iterable

from agentlog.worker.ports import Partition


class Owned:
    """The partitions an agent's runtime holds now, and how many assignments it has had."""

    def __init__(self) -> None:
        self._owned: frozenset[tuple[str, int]] = frozenset()
        #: How many assignments the agent has had (what was read per assignment is read again after one).
        self.assignments = 0

    def assigned(self, tps: Iterable[Partition]) -> None:
        """The new assignment, every partition of it held (its writer open, its state restored)."""
        self._owned = frozenset((tp.topic, tp.partition) for tp in tps)
        self.assignments += 1

    def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic`` held now."""
        return sorted(p for t, p in self._owned if t == topic)
