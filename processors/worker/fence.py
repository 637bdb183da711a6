"""A batch that outlives its partitions writes no table.

Faust does not wait for our batches at a rebalance: records are acknowledged to Faust when a
batch collects them, and ``stream_wait_empty`` is off, so its revocation returns while a batch
is still being handled. That batch then wrote its table stages whenever it finished — after the
rebalance, while (or after) the partitions' next owner recovered the same tables from their
changelogs. The next owner could read the batch's ``runs`` records (a run's head) and not its
``index`` records (two changelog topics, read separately, and Faust applies what a fetch returns beyond
the high watermark it started from): a head ahead of the index is not repairable, and every
redelivered record of the range was refused as a ``sequence_conflict`` (``test_many_workers``,
about one run in 35: 754 records of one partition).

So at a revocation every agent's batch in progress is given until half the rebalance timeout to
become durable (the member rejoins only after: whatever it wrote is in the changelogs before any
new owner reads them; the agent's earlier batches are durable already, each before the next began).
A batch still going after that, and any batch holding records of a partition this worker no longer
owns, writes no table and publishes no position: exactly a crash before its table writes, which
every agent already recovers from (its outputs are byte-identical when the records are handled
again, by whoever owns them).

The wait is only for a member the group is still waiting for. A member the group has dropped
(its session expired while the process stalled) learns it at its next heartbeat and
then rejoins: by the time Faust signals that revocation, the partitions have been given to others,
who may be recovering the tables already. Waiting would let exactly the late write through that the
fence is for, so such a revocation fences at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from agentlog.metrics import METRICS
from agentlog.streams import internals
from agentlog.worker.ports import Event, Partition

#: How long a revocation lets each agent's batch in progress make its tables durable before the member
#: rejoins (bounded by half the rebalance timeout: :func:`wait_bound`). A batch still going after that,
#: or holding records of a partition that moved, writes no table. 5 s: the most :func:`wait_bound` allows
#: with the 10 s rebalance timeout. 0 = never wait (the partitions' next owner handles the batch again).
REVOKE_WAIT_S = 5.0

log = logging.getLogger("agentlog.worker")

Settle = Callable[[], Awaitable[None]]


class Fenced(Exception):
    """A batch holds records of partitions this worker no longer owns: its tables are not written."""


class Fence:
    """The source partitions this worker owns, and the agents' work a revocation waits for."""

    def __init__(self, bound_s: float = 5.0, dropped: Callable[[], bool] | None = None) -> None:
        #: How long a revocation waits for the batches in progress (:func:`wait_bound`).
        self.bound_s = bound_s
        #: Whether the group has dropped this member (:func:`agentlog.streams.internals.membership_probe`).
        self.dropped: Callable[[], bool] = dropped or (lambda: False)
        self._owned: frozenset[tuple[str, int]] | None = None  # None: before the first assignment
        self._settlers: list[Settle] = []
        #: How many assignments this worker has had (what was read per assignment is read again after one).
        self.assignments = 0

    def register(self, settle: Settle) -> None:
        """``settle()`` returns once the agent has no batch in progress (its last one is durable, or failed)."""
        self._settlers.append(settle)

    def unowned(self, sources: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """The (topic, partition)s of ``sources`` not this worker's in the current assignment."""
        owned = self._owned
        return [] if owned is None else sorted(tp for tp in set(sources) if tp not in owned)

    def owned_events(self, events: list[Event]) -> list[Event]:
        """``events`` without those of partitions this worker no longer owns (taken before a rebalance).

        Faust clears its agents' buffers at a revocation; records a batch had already taken are
        dropped here, before anything is sent for them: their new owner handles them.
        """
        owned = self._owned
        if owned is None:
            return events
        return [e for e in events if (e.message.topic, e.message.partition) in owned]

    async def revoked(self) -> bool:
        """Wait (bounded) for the agents' work in progress, then own nothing until the next assignment.

        Returns whether everything settled in time; a batch that did not is fenced when it commits.
        A member the group has already dropped does not wait (see the module docstring).
        """
        settled = True
        if self._owned and self.dropped():
            settled = False
            METRICS.inc("agentlog_batches_fenced_revocations_total", reason="dropped")
            log.warning("the group dropped this worker (its session expired) and gave its partitions to others; "
                        "any batch still in progress writes no table (its records are handled again by their owner)")
        elif self._settlers and self.bound_s > 0:
            waiting = asyncio.ensure_future(asyncio.gather(*(settle() for settle in self._settlers)))
            done, _ = await asyncio.wait({waiting}, timeout=self.bound_s)
            if not done:
                settled = False
                waiting.add_done_callback(_retrieve)
                METRICS.inc("agentlog_batches_fenced_revocations_total", reason="timeout")
                log.warning("a rebalance revoked partitions while a batch was still in progress after %g s; "
                            "it writes no table (its records are handled again by their next owner)", self.bound_s)
            else:
                waiting.result()
        self._owned = frozenset()
        return settled

    def assigned(self, tps: Iterable[Partition]) -> None:
        """The new assignment (Faust's ``on_partitions_assigned``): source partitions as (topic, partition)."""
        self._owned = frozenset((tp.topic, tp.partition) for tp in tps)
        self.assignments += 1

    def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic`` this worker owns now."""
        return sorted(p for t, p in self._owned or () if t == topic)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # a settle that failed late is its agent's own failure, which the agent raises


def wait_bound(revoke_wait_s: float, rebalance_timeout_s: float) -> float:
    """:data:`REVOKE_WAIT_S`, at most half the rebalance timeout.

    The member rejoins only once the revocation returns; past the rebalance timeout the group goes
    on without it and its partitions move anyway, so waiting longer would fence nothing more.
    """
    return max(0.0, min(revoke_wait_s, rebalance_timeout_s / 2))


def install(app: Any, fence: Fence) -> None:
    """Connect ``fence`` to the Faust app's rebalance signals and to its consumer's group membership."""
    fence.dropped = internals.membership_probe(app)

    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        await fence.revoked()

    async def on_assigned(sender: Any, assigned: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        fence.assigned(assigned)

    app.on_partitions_revoked.connect(on_revoked)
    app.on_partitions_assigned.connect(on_assigned)
