"""When the worker asks for a run to be closed (the rules are :mod:`agentlog.core.lifetimes`).

The sequencer tells :class:`Lifetimes` each run's new record once its batch is durable; a timer
then asks, on the run's own ingest partition, for every run that is due to close — once: a
request the broker has taken reaches the sequencer in its turn, however long the backlog. Only
runs in flight are tracked (one entry each), and what is tracked is rebuilt from the ``runs``
table of each partition this worker is assigned, so a restart or a rebalance loses no due run
(its new owner asks again). Asking twice is harmless: the sequencer closes a run once and
ignores a request the run has moved on from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentlog.core.lifetimes import Reason, close_request, due
from agentlog.metrics import METRICS

if TYPE_CHECKING:
    from agentlog.worker.owned import Owned
    from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.lifetimes")

#: Heads read between two yields to the event loop when a partition's runs are rescanned (~10 ms of reads).
RESCAN_YIELD_EVERY = 1000


class Lifetimes:
    """The runs in flight of this worker's ingest partitions, and when each is due to close."""

    def __init__(self, wiring: Wiring, owned: Owned) -> None:
        self._wiring = wiring
        #: The ``ingest`` partitions the sequencer's runtime holds.
        self._owned = owned
        self._grace_s = wiring.settings.run_grace_s
        self._idle_s = wiring.settings.run_idle_s
        #: runId -> (partition, due at (epoch s), next sequence, reason)
        self._due: dict[str, tuple[int, float, int, Reason]] = {}
        #: Runs whose close request the broker has (or is taking): asked once. The request waits its
        #: turn in the partition however long the backlog is; asking again would only lengthen it.
        self._asked: set[str] = set()
        self._scanned: set[int] = set()  # partitions whose heads are tracked in this assignment
        self._assignment = -1

    def __len__(self) -> int:
        return len(self._due)

    def track(self, partition: int, run_id: str, record: Mapping[str, Any], now_s: float | None = None) -> None:
        """Note the run's record (its ``next``, ``ts`` and ``end``: :func:`agentlog.core.lifetimes.due`)."""
        at, reason = due(record, grace_s=self._grace_s, idle_s=self._idle_s,
                         now_s=time.time() if now_s is None else now_s)
        self._due[run_id] = (partition, at, int(record["next"]), reason)
        self._asked.discard(run_id)

    def forget(self, run_id: str) -> None:
        self._due.pop(run_id, None)
        self._asked.discard(run_id)

    def asked(self, run_id: str) -> None:
        """The run's close request is on its way: not asked for again while it is tracked as it is."""
        self._asked.add(run_id)

    def unask(self, run_id: str) -> None:
        """The run's request was not taken (the run moved on, or the send failed): ask again when it is due."""
        self._asked.discard(run_id)

    def due_now(self, partitions: set[int], now_s: float) -> list[tuple[str, int, int, Reason]]:
        """The runs of ``partitions`` due by ``now_s`` and not asked for: (runId, partition, next, reason)."""
        asked = self._asked
        return [(run_id, partition, nxt, reason) for run_id, (partition, at, nxt, reason) in self._due.items()
                if at <= now_s and partition in partitions and run_id not in asked]

    async def rescan(self, partition: int, runs: Any, now_s: float) -> int:
        """Track every run whose record the ``runs`` table holds in ``partition``; returns how many.

        Yields to the event loop every :data:`RESCAN_YIELD_EVERY` keys: a partition with many runs in
        flight is read from disk, and the agents' batches go on meanwhile.
        """
        n = 0
        for i, key in enumerate(runs.keys_from(partition, "")):
            if i % RESCAN_YIELD_EVERY == RESCAN_YIELD_EVERY - 1:
                await asyncio.sleep(0)
            record = runs.get(partition, key)
            if isinstance(record, dict) and "next" in record:
                self.track(partition, key, record, now_s)
                n += 1
        return n

    async def sweep(self) -> None:
        """Ask for the close of every run due (one timer tick)."""
        wiring = self._wiring
        topic = wiring.topics["ingest"].get_topic_name()
        held = self._owned
        if held.assignments != self._assignment:
            self._assignment = held.assignments
            self._scanned.clear()
        owned = set(held.partitions(topic))
        now_s = time.time()
        for partition in sorted(owned - self._scanned):
            n = await self.rescan(partition, wiring.tables["runs"], now_s)
            self._scanned.add(partition)
            log.info("ingest partition %d: %d runs in flight", partition, n)
        for run_id in [r for r, (p, *_) in self._due.items() if p not in owned]:
            self.forget(run_id)  # its partition moved: its next owner tracks it
        producer = wiring.producer
        sent = []
        for run_id, partition, nxt, reason in self.due_now(owned, now_s):
            self.asked(run_id)
            sent.append((run_id, await producer.send(topic, run_id.encode("utf-8"),
                                                     close_request(run_id, nxt, reason), partition)))
            METRICS.inc("agentlog_run_closes_asked_total", reason=reason)
        for run_id, delivery in sent:
            try:
                await delivery
            except Exception as e:  # not in the partition: the run is asked for again at the next sweep
                log.warning("the close request of run %s was not sent (%s); asking again", run_id, e)
                self.unask(run_id)
        METRICS.set("agentlog_runs_in_flight", len(self._due))


def install(wiring: Wiring, lifetimes: Lifetimes) -> None:
    """Run :meth:`Lifetimes.sweep` on a timer: often enough for the grace period, at most every 10 s."""
    interval = min(10.0, max(0.2, wiring.settings.run_grace_s / 4))

    async def close_due_runs() -> None:
        try:
            await lifetimes.sweep()
        except Exception:  # never stop the worker over a sweep; the next one tries again
            log.exception("asking for due runs to close failed")

    wiring.runner.timer(interval, close_due_runs)
