"""Broker-side observations the fault tests make without asking the worker.

Progress is the committed log's end offsets; "drained" is every group the worker reads with having
consumed every record of every topic it reads (ingest; handoff-links, OTel spans and events) and, when
the worker runs the audit sink, the sink's own group having consumed every record of the topics it
stores. Each topic is read by its agent's group (``<prefix>-worker-<agent>``, which commits its position in
each batch's transaction); the sink commits a batch only after its insert returned, so a drained sink group means ClickHouse holds
everything.

Lag counts records, not offsets: a topic written in transactions holds a commit marker after each
transaction, which takes an offset no consumer ever receives, so a group that consumed everything sits one
offset below the end of such a partition. What is left between a group's committed offset and the end is
read (committed only) to see whether a record is there.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import reading_group, topic_name

#: What the worker's sequencer and handoff agent read: ingest (sequencing and the fold in one pass) and
#: handoff-links. The log is read by the worker's log check and the audit sink, each in a group of its own.
CONSUMED = ("ingest", "handoff-links")

#: The longest :meth:`Offsets.lag` reads what lies between a committed offset and the end of one partition.
PEEK_S = 5.0


class Offsets:
    """One long-lived consumer + admin client for cheap end-offset / group-offset polling."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None,
                                         enable_auto_commit=False)
        #: Reads what lies past a committed offset, as the worker's consumers do (committed only).
        self.peek = AIOKafkaConsumer(**client_kwargs(settings), group_id=None, enable_auto_commit=False,
                                     isolation_level="read_committed")
        self.admin = AIOKafkaAdminClient(**client_kwargs(settings), request_timeout_ms=20_000)

    async def __aenter__(self) -> Offsets:
        await self.consumer.start()
        await self.peek.start()
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.peek.stop()
        await self.admin.close()

    def _tps(self, shorts: tuple[str, ...]) -> list[TopicPartition]:
        return [TopicPartition(topic_name(self.settings, s), p)
                for s in shorts for p in range(self.settings.partitions)]

    async def ends(self, shorts: tuple[str, ...] = ("log",)) -> dict[TopicPartition, int]:
        return await self.consumer.end_offsets(self._tps(shorts))

    async def log_end(self) -> int:
        return sum((await self.ends(("log",))).values())

    async def lag(self, shorts: tuple[str, ...] = CONSUMED, *, group: str | None = None) -> int:
        """Records the worker's groups (or ``group``) have not consumed yet, over ``shorts``.

        Without ``group``, each topic's is the group that reads it (``reading_group``).
        """
        ends = await self.ends(shorts)
        readers = {topic_name(self.settings, short): group or reading_group(self.settings, short) for short in shorts}
        by_group: dict[str, list[TopicPartition]] = {}
        for tp in ends:
            by_group.setdefault(readers[tp.topic], []).append(tp)
        lag = 0
        for reader, tps in by_group.items():
            committed = await self.admin.list_consumer_group_offsets(reader, partitions=tps)
            for tp in tps:
                meta = committed.get(tp)
                done = meta.offset if meta is not None and meta.offset >= 0 else 0
                if ends[tp] > done:
                    lag += await self._records_between(tp, done, ends[tp])
        return lag

    async def _records_between(self, tp: TopicPartition, start: int, end: int) -> int:
        """``end - start``, or 0 when no record lies at offsets ``start`` ≤ offset < ``end`` (only commit markers)."""
        peek = self.peek
        peek.assign([tp])
        peek.seek(tp, start)
        found = 0
        deadline = asyncio.get_running_loop().time() + PEEK_S
        while await peek.position(tp) < end and asyncio.get_running_loop().time() < deadline:
            got = await peek.getmany(tp, timeout_ms=200)
            found += sum(1 for m in got.get(tp, ()) if m.offset < end)
            if found:
                return end - start  # not drained: how far behind is what the caller reports
        # A position short of ``end`` at the deadline is a transaction still open: its records are not consumed.
        return 0 if await peek.position(tp) >= end else end - start

    async def sink_lag(self) -> int:
        """Records the audit sink's own group (``<prefix>.audit-sink``) has not committed, over the topics it stores.

        The sink resumes from its ledger in ClickHouse and commits only after an insert returned, so
        zero here means ClickHouse holds every record.
        """
        from agentlog.audit.sink import SINK_TOPICS

        return await self.lag(tuple(SINK_TOPICS), group=f"{self.settings.topic_prefix}.audit-sink")

    async def drained(self, *, sink: bool) -> bool:
        """The agents' groups have committed all of ingest and handoff-links (and the sink all it stores)."""
        return await self.lag() == 0 and (not sink or await self.sink_lag() == 0)
