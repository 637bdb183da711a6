"""When the worker asks for a run to be closed (the rules are :mod:`processors.core.lifetimes`).

The sequencer tells :class:`Lifetimes` each run's new head once its batch is durable; a timer
then asks, on the run's own ingest partition, for every run that is due to close. Only runs in
flight are tracked (one entry each), and what is tracked is rebuilt from the ``heads`` table of
each partition this worker is assigned, so a restart or a rebalance loses no due run. Asking is
idempotent: the sequencer closes a run once and ignores a request the run has moved on from.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from processors.core.lifetimes import Reason, close_request, due
from processors.metrics import METRICS
from processors.worker.fence import settling

if TYPE_CHECKING:
    from processors.worker.wiring import Wiring

log = logging.getLogger("agentlog.lifetimes")

#: A request not answered within this many seconds (lost with a crash, say) is made again.
ASK_AGAIN_S = 60.0


class Lifetimes:
    """The runs in flight of this worker's ingest partitions, and when each is due to close."""

    def __init__(self, wiring: Wiring) -> None:
        self._wiring = wiring
        self._grace_s = wiring.settings.run_grace_s
        self._idle_s = wiring.settings.run_idle_s
        #: runId -> (partition, due at (epoch s), next sequence, reason)
        self._due: dict[str, tuple[int, float, int, Reason]] = {}
        self._asked: dict[str, float] = {}  # runId -> when its close was last asked for
        self._scanned: set[int] = set()  # partitions whose heads are tracked in this assignment
        self._assignment = -1

    def __len__(self) -> int:
        return len(self._due)

    def track(self, partition: int, run_id: str, head: dict[str, Any], now_s: float | None = None) -> None:
        at, reason = due(head, grace_s=self._grace_s, idle_s=self._idle_s,
                         now_s=time.time() if now_s is None else now_s)
        self._due[run_id] = (partition, at, int(head["next"]), reason)
        self._asked.pop(run_id, None)

    def forget(self, run_id: str) -> None:
        self._due.pop(run_id, None)
        self._asked.pop(run_id, None)

    def unask(self, run_id: str) -> None:
        self._asked.pop(run_id, None)

    def due_now(self, partitions: set[int], now_s: float) -> list[tuple[str, int, int, Reason]]:
        """The runs of ``partitions`` due by ``now_s`` and not asked for lately: (runId, partition, next, reason)."""
        out = []
        for run_id, (partition, at, nxt, reason) in self._due.items():
            if at <= now_s and partition in partitions and self._asked.get(run_id, 0.0) <= now_s - ASK_AGAIN_S:
                out.append((run_id, partition, nxt, reason))
        return out

    def rescan(self, partition: int, heads: Any, now_s: float) -> int:
        """Track every run whose head the table holds in ``partition``; returns how many."""
        n = 0
        for key in heads.keys_from(partition, ""):
            if key.startswith("\x00"):  # the agent's positions, not runs
                continue
            head = heads.get(partition, key)
            if isinstance(head, dict) and "next" in head:
                self.track(partition, key, head, now_s)
                n += 1
        return n

    async def sweep(self) -> None:
        """Ask for the close of every run due (one timer tick)."""
        wiring = self._wiring
        if settling(wiring.app):
            return
        topic = wiring.topics["ingest"].get_topic_name()
        fence = wiring.fence
        if fence.assignments != self._assignment:
            self._assignment = fence.assignments
            self._scanned.clear()
        owned = set(fence.partitions(topic))
        now_s = time.time()
        for partition in sorted(owned - self._scanned):
            n = self.rescan(partition, wiring.tables["heads"], now_s)
            self._scanned.add(partition)
            log.info("ingest partition %d: %d runs in flight", partition, n)
        for run_id in [r for r, (p, *_) in self._due.items() if p not in owned]:
            self.forget(run_id)  # its partition moved: its next owner tracks it
        producer = wiring.app.producer
        for run_id, partition, nxt, reason in self.due_now(owned, now_s):
            await producer.send(topic, run_id.encode("utf-8"), close_request(run_id, nxt, reason), partition,
                                None, None)
            self._asked[run_id] = now_s
            METRICS.inc("agentlog_run_closes_asked_total", reason=reason)
        METRICS.set("agentlog_runs_in_flight", len(self._due))


def install(wiring: Wiring, lifetimes: Lifetimes) -> None:
    """Run :meth:`Lifetimes.sweep` on a timer: often enough for the grace period, at most every 10 s."""
    interval = min(10.0, max(0.2, wiring.settings.run_grace_s / 4))

    @wiring.app.timer(interval=interval)  # type: ignore[untyped-decorator]  # faust's App.timer is @no_type_check
    async def close_due_runs() -> None:
        try:
            await lifetimes.sweep()
        except Exception:  # never stop the worker over a sweep; the next one tries again
            log.exception("asking for due runs to close failed")
