"""Broker-side observations the fault tests make without asking the worker.

Progress is the committed log's end offsets; "drained" is the worker's Faust group having
committed every record of every topic it consumes (ingest, handoff-links) and, when the worker runs
the audit sink, the sink's own group having committed every record of the topics it stores. The
Faust group commits, per partition, the lowest durable position of the agents reading the topic
(processors/worker/positions.py); the sink commits a batch only after its insert returned, so a
drained sink group means ClickHouse holds everything.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name

#: What the worker's Faust group reads: ingest (sequencing and the fold in one pass) and handoff-links.
#: The log is read by the worker's log check and the audit sink, each in a group of its own.
CONSUMED = ("ingest", "handoff-links")


class Offsets:
    """One long-lived consumer + admin client for cheap end-offset / group-offset polling."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None,
                                         enable_auto_commit=False)
        self.admin = AIOKafkaAdminClient(**client_kwargs(settings), request_timeout_ms=20_000)
        self.group = f"{settings.topic_prefix}-worker"

    async def __aenter__(self) -> Offsets:
        await self.consumer.start()
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    def _tps(self, shorts: tuple[str, ...]) -> list[TopicPartition]:
        return [TopicPartition(topic_name(self.settings, s), p)
                for s in shorts for p in range(self.settings.partitions)]

    async def ends(self, shorts: tuple[str, ...] = ("log",)) -> dict[TopicPartition, int]:
        return await self.consumer.end_offsets(self._tps(shorts))

    async def log_end(self) -> int:
        return sum((await self.ends(("log",))).values())

    async def lag(self, shorts: tuple[str, ...] = CONSUMED, *, group: str | None = None) -> int:
        """Records a group (the worker's Faust group by default) has not committed yet, over ``shorts``."""
        ends = await self.ends(shorts)
        committed = await self.admin.list_consumer_group_offsets(group or self.group, partitions=list(ends))
        lag = 0
        for tp, end in ends.items():
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            lag += max(0, end - done)
        return lag

    async def sink_lag(self) -> int:
        """Records the audit sink's own group (``<prefix>.audit-sink``) has not committed, over the topics it stores.

        The sink resumes from its ledger in ClickHouse and commits only after an insert returned, so
        zero here means ClickHouse holds every record.
        """
        from agentlog.audit.sink import SINK_TOPICS

        return await self.lag(tuple(SINK_TOPICS), group=f"{self.settings.topic_prefix}.audit-sink")

    async def drained(self, *, sink: bool) -> bool:
        """The Faust group has committed all of ingest and handoff-links (and the sink all it stores)."""
        return await self.lag() == 0 and (not sink or await self.sink_lag() == 0)
