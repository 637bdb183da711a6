"""The :class:`agentlog.worker.txlog.RecordLog` contract in memory (the twin the runtime's unit tests use)."""

from __future__ import annotations

from agentlog.worker.txlog import MemoryLog, RecordLog
from tests.contract.txlog import LogContract


class TestMemoryLog(LogContract):
    def make_log(self) -> RecordLog:
        return MemoryLog(partitions=2)

    def topics(self) -> tuple[str, str, str]:
        return "ingest", "log", "changelog"
