"""The Faust application: topics, tables and agents wired together.

Every agent consumes with concurrency 1 and ``take_events`` batches, and every
batch follows the same order: compute outputs with pure functions, send them,
**wait for the broker to acknowledge them**, and only then write the tables.
Faust sends table changelog records immediately (not at commit), so writing the
table first would let a crash leave a table that is ahead of its outputs; a
redelivered record would then look "already done" and its outputs would be lost.
Outputs-then-tables makes every crash window a redelivery of records whose
outputs are byte-identical, and readers dedup by (runId, sequence) or position.

Table writes are awaited too, and only then does the batch's position become
committable (:mod:`processors.commits`: the group commits the slowest agent's durable
position, not Faust's ack bookkeeping). Faust's own pre-commit flush can miss a
changelog record that is between its send buffer and the client, so committing on
its acks could leave a committed source offset whose table write never reached the
broker — the next record of that run would then look like a gap.
Tables are made durable one after another in :data:`TABLE_ORDER`: the
sequencer's eventId index before its heads, so a head never runs ahead of the
index it is checked against (a head behind the index is repaired by
:func:`processors.sequencer.decide` on redelivery).

Changelog records are written to the *source record's* partition explicitly
(:func:`put`), so table partitions stay co-partitioned with the topics by runId.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import faust

from streams.settings import Settings
from streams.topics import topic_name

log = logging.getLogger("agentlog.worker")


@dataclass
class Wiring:
    """What every processor needs: settings, the app, its topics and tables."""

    settings: Settings
    app: faust.App
    topics: dict[str, Any]
    tables: dict[str, Any]
    store: Any = None  # processors.store.Store when the sink runs in this worker
    positions: Any = None  # processors.commits.DurablePositions: what the consumer group commits

    async def send(self, short: str, key: str | None, value: bytes) -> Any:
        """Send to one of our topics; returns the delivery future (await it to know it is durable).

        Straight to the app's producer with bytes we encoded ourselves: Faust's
        ``Topic.send`` costs ~0.5 ms per record in serializer, sensor and
        FutureMessage work we do not use (key → partition is the same default
        murmur2 partitioner either way).
        """
        return await self.app.producer.send(
            self.topics[short].get_topic_name(),
            key.encode("utf-8") if key is not None else None, value, None, None, None,
        )


async def put(table: Any, partition: int, key: str, value: Any) -> Any:
    """Set a table key and send its changelog record to ``partition`` (the source record's).

    Returns the changelog record's delivery future; await it to know the write is durable.
    Sent straight to the app's producer: never attached to the current event, never through
    Faust's send buffer (drained only at commit time under load), and without the per-record
    overhead of ``Topic.send``. The memory store keeps no persisted offsets, so Faust's
    changelog-sent callback has nothing to record.
    """
    table.data[key] = value
    return await table.app.producer.send(
        table.changelog_topic.get_topic_name(), _json_bytes(key), _json_bytes(value), partition, None, None,
    )


def _json_bytes(obj: Any) -> bytes:
    """What the tables' ``json`` serializer reads back at changelog recovery (any valid JSON does)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: Order in which a batch's table writes are made durable (tables not named go last).
TABLE_ORDER = ("index", "heads", "runs", "links")


def lookup(table: Any, key: str) -> Any:
    return table.data.get(key)


async def await_all(futures: list) -> None:
    """Wait until every sent record is acknowledged by the broker (acks=all)."""
    for fut in futures:
        await fut


class Batch:
    """One ``take_events`` batch: outputs go out at once, table writes wait for their acks.

    The one place the module docstring's rule lives: :meth:`commit` awaits every
    output the batch sent, and only then writes the table keys the batch changed
    (to the partition of the record that changed them). Reads see the batch's own
    pending writes first, so later events of the batch build on earlier ones.
    """

    def __init__(self, wiring: "Wiring", agent: str = "", size: int = 0) -> None:
        self.wiring = wiring
        if agent:
            from processors.metrics import METRICS

            METRICS.inc("agentlog_batches_total", agent=agent)
            METRICS.inc("agentlog_batch_events_total", size, agent=agent)
        self._futures: list = []
        self._writes: dict[tuple[str, str], tuple[int, Any]] = {}
        self._positions: dict[tuple[str, str, int], int] = {}  # (table, topic, partition) -> next offset
        app = getattr(wiring, "app", None)
        self._generation = getattr(app, "consumer_generation_id", None)

    def get(self, table: str, key: str) -> Any:
        hit = self._writes.get((table, key))
        return hit[1] if hit is not None else lookup(self.wiring.tables[table], key)

    def set(self, table: str, partition: int, key: str, value: Any) -> None:
        self._writes[(table, key)] = (partition, value)

    async def send(self, short: str, key: str | None, value: bytes) -> None:
        self._futures.append(await self.wiring.send(short, key, value))

    async def commit(self) -> None:
        await await_all(self._futures)
        by_table: dict[str, list[tuple[str, int, Any]]] = {}
        for (table, key), (partition, value) in self._writes.items():
            by_table.setdefault(table, []).append((key, partition, value))
        rank = {name: i for i, name in enumerate(TABLE_ORDER)}
        for table in sorted(by_table, key=lambda t: rank.get(t, len(rank))):
            target = self.wiring.tables[table]
            await await_all([await put(target, partition, key, value) for key, partition, value in by_table[table]])
        self._publish_positions()

    def advanced(self, table: str, topic: str, partition: int, position: int) -> None:
        """Note that every record of the partition below ``position`` is handled once this batch is durable."""
        self._positions[(table, topic, partition)] = position

    def _publish_positions(self) -> None:
        positions = getattr(self.wiring, "positions", None)
        if positions is not None:
            for (table, topic, partition), position in self._positions.items():
                positions.advance(table, topic, partition, position, self._generation)


#: Table key (+ topic and partition) holding the next source offset an agent expects per partition;
#: no runId can start with NUL.
POSITION_KEY = "\x00position\x1f"


async def in_order(batch: Batch, table: str, msg: Any, value: bytes, handle) -> None:
    """Hand ``msg`` to ``handle(offset, timestamp_ms, value)`` — after any records the consumer skipped.

    Each agent keeps, in its own table, the next offset it expects per source
    partition. After crash restarts, Faust's consumer was seen to skip records
    of a partition around a rebalance (and, later, to re-read them). A skipped
    ingest record turns every later event of its run into a ``sequence_gap``;
    so when an offset arrives beyond the expected one, the hole is read with a
    plain consumer and handled first. Offsets below the expected one are
    redeliveries, which every agent already treats as done.
    """
    from streams.reader import fetch_range

    key = f"{POSITION_KEY}{msg.topic}\x1f{msg.partition}"
    expected = batch.get(table, key)
    if expected is not None and msg.offset > expected:
        skipped = await fetch_range(batch.wiring.settings, msg.topic, msg.partition, expected, msg.offset)
        consumer = getattr(getattr(batch.wiring, "app", None), "consumer", None)
        committed = getattr(consumer, "_committed_offset", {}).get(getattr(msg, "tp", None))
        log.warning("%s partition %d: the consumer skipped offsets %d..%d (agent table %s, group committed %s); "
                    "handling %d records first",
                    msg.topic, msg.partition, expected, msg.offset - 1, table, committed, len(skipped))
        from processors.metrics import METRICS

        METRICS.inc("agentlog_skipped_records_healed_total", len(skipped), topic=msg.topic)
        for offset, timestamp_ms, skipped_value in skipped:
            await handle(offset, timestamp_ms, skipped_value or b"")
    await handle(msg.offset, int((msg.timestamp or 0) * 1000), value)
    position = msg.offset + 1 if expected is None else max(expected, msg.offset + 1)
    if position != expected:
        batch.set(table, msg.partition, key, position)
    batch.advanced(table, msg.topic, msg.partition, position)


def ordered_agent(wiring: Wiring, short: str, *, name: str, table: str):
    """Decorator for an agent on topic ``short`` that keeps its positions in ``table`` via :func:`in_order`.

    Concurrency 1 (more can commit past in-flight messages), and registered so the group
    commits no offset of the topic before this agent has made it durable (:mod:`processors.commits`).
    """
    wiring.positions.consumes(wiring.topics[short].get_topic_name(), table)
    return wiring.app.agent(wiring.topics[short], name=name, concurrency=1)


def _broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def build_app(settings: Settings, *, sink: bool = True, replay: bool = True) -> Wiring:
    """Create the worker's Faust app. ``sink=False`` leaves ClickHouse out (benchmarks, tests)."""
    (settings.home / "faust").mkdir(parents=True, exist_ok=True)
    app = faust.App(
        f"{settings.topic_prefix}-worker",
        broker=_broker_urls(settings.kafka_bootstrap),
        store="memory://",
        processing_guarantee="at_least_once",
        autodiscover=False,
        datadir=str(settings.home / "faust"),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=0,
        broker_session_timeout=settings.session_timeout_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # Faust's default 16 KiB producer batch makes a 300-event batch of outputs a dozen
        # sequential produce requests per partition; 1 MiB batches with a 5 ms linger send it in one.
        producer_max_batch_size=1 << 20,
        producer_linger=0.005,
        web_enabled=settings.web_enabled,
        web_port=settings.web_port,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        stream_wait_empty=False,
        # Table keys/values as JSON: str keys come back as str after changelog recovery
        # (the topics below set raw bytes explicitly).
        key_serializer="json",
        value_serializer="json",
    )
    topics = {
        short: app.topic(
            topic_name(settings, short),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
        )
        for short in (
            "ingest", "log", "transitions", "violations", "rejections",
            "snapshots", "digests", "verdicts", "handoff-links",
        )
    }

    def table(name: str) -> Any:
        return app.Table(
            name,
            default=None,
            partitions=settings.partitions,
        )

    tables = {
        "heads": table("seq-heads"),  # runId -> {"next", "hash"}
        "index": table("seq-index"),  # runId␟eventId -> [sequence, hash, partition, offset]
        "runs": table("run-state"),  # runId -> {"state", "next", "head", "since"}
        "links": table("handoff-links"),  # childRunId -> {"link", "terminal", "done"}
        "sink-positions": table("sink-positions"),  # only in_order positions of the sink agents
    }
    from processors import commits

    positions = commits.DurablePositions()
    commits.install(app, positions)
    from processors.metrics import METRICS

    METRICS.add_collector(positions.series)
    wiring = Wiring(settings=settings, app=app, topics=topics, tables=tables, positions=positions)

    from processors import handoff, runstate, sequencer

    sequencer.install(wiring)
    runstate.install(wiring, replay=replay)
    handoff.install(wiring)
    if sink:
        from processors import sink as sink_module

        sink_module.install(wiring)

    @app.task
    async def quiet_client_loggers():
        # A profile of the worker showed ~10 DEBUG log records built per event by the Kafka client
        # stack (about 10% of CPU) although nothing prints them; cap those loggers at INFO.
        level = max(logging.getLogger().getEffectiveLevel(), logging.INFO)
        for name in ("aiokafka", "faust", "mode"):
            logging.getLogger(name).setLevel(level)

    if settings.web_enabled:
        from processors import web

        web.install(wiring)
    return wiring


def internal_topic_specs(wiring: Wiring) -> list:
    """Faust's own topics (table changelogs, the assignor's leader topic) as :class:`TopicSpec` s.

    Created by us before Faust starts, so a missing one is waited for like ours instead of
    crashing Faust's start-up (it declares them itself, and finds them there).
    """
    from streams.topics import TopicSpec, durability_config

    settings = wiring.settings
    rf = settings.replication_factor
    durable = durability_config(rf)
    specs = [
        TopicSpec(table.changelog_topic.get_topic_name(), settings.partitions,
                  {"cleanup.policy": "compact", **durable}, rf)
        for table in wiring.tables.values()
    ]
    specs.append(TopicSpec(f"{wiring.app.conf.id}-__assignor-__leader", 1, dict(durable), rf))
    return specs


def run_worker(settings: Settings, *, sink: bool = True, loglevel: str = "warning", wait_s: float = 300.0) -> None:
    """Run the worker in the foreground until SIGINT/SIGTERM (``agentlog worker``).

    Every topic it reads or writes is created first, waiting up to ``wait_s`` for an
    unreachable broker or for enough brokers to honour the replication factor.
    """
    import asyncio

    from faust.worker import Worker

    from streams.admin import ensure_topics_patiently
    from streams.topics import catalogue

    wiring = build_app(settings, sink=sink)
    loop = asyncio.new_event_loop()  # not Faust's: its loop is made (and owned) by the Worker below
    try:
        loop.run_until_complete(
            ensure_topics_patiently(settings, catalogue(settings) + internal_topic_specs(wiring), wait_s=wait_s))
    finally:
        loop.close()
    worker = Worker(wiring.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
