"""The worker in memory: its agents built as the worker builds them, their batches handed over by hand.

A unit test of an agent's logic builds it on :func:`memory_wiring` (the worker's topics, a keyring of the test's
life, the deployment's redactor) and :class:`MemoryWorker`, whose agents run on the transactional runtime
(:class:`agentlog.worker.txruntime.TxAgent`) over one :class:`agentlog.worker.txlog.MemoryLog`: what a batch commits
is read back from that log, and what the worker's own producer sends (close requests, ticks, OTLP spans) lands in it
too. Tables are RocksDB databases under the settings' state directory, restored from the log's changelogs when an
agent takes a partition, as on Kafka. No task or timer runs by itself: :class:`MemoryRunner` keeps them for the test.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from agentlog.core.keyring import LocalKek
from agentlog.core.redaction import Redactor
from agentlog.streams.keyring import Keyring
from agentlog.streams.redaction import load_redactor
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from agentlog.worker import sequencer, txruntime
from agentlog.worker.owned import Owned
from agentlog.worker.ports import NamedTopic, TaskFn, Topic
from agentlog.worker.txlog import Appended, LogRecord, MemoryLog
from agentlog.worker.txstate import plain_opener
from agentlog.worker.wiring import Wiring


class TopicPartition(NamedTuple):
    """A topic partition (the shape of aiokafka's)."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MemoryMessage:
    """One fetched record as the runtime reads it (the fields of aiokafka's ``ConsumerRecord`` it uses)."""

    offset: int
    timestamp: int
    value: bytes | None
    key: bytes | None = None


class MemoryRunner:
    """Keeps the tasks and timers the code registers (the ``Runner`` port); a test runs them by hand."""

    def __init__(self) -> None:
        self.tasks: list[TaskFn] = []
        self.timers: list[tuple[float, TaskFn]] = []

    def task(self, fn: TaskFn) -> None:
        self.tasks.append(fn)

    def timer(self, interval: float, fn: TaskFn) -> None:
        self.timers.append((interval, fn))


class MemoryProducer:
    """The worker's own producer (the ``Producer`` port) on a :class:`MemoryLog`: a send is committed at once.

    ``refuse``: topics whose sends fail (a send the broker does not take); ``sent``: every send, in order.
    """

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.refuse: set[str] = set()
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None]] = []

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None) -> Awaitable[Any]:
        self.sent.append((topic, key, value, partition))
        done: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        if topic in self.refuse:
            done.set_exception(OSError(f"the broker refused a record of {topic}"))
        else:
            done.set_result(self.log.append(topic, key, value, partition))
        return done


#: The topics :func:`memory_wiring` declares (the worker's own, as :func:`agentlog.worker.app.build_app` does).
TOPICS = ("ingest", "log", "transitions", "violations", "rejections", "snapshots", "verdicts", "handoff-links",
          "checkpoints", "keyring")


def memory_wiring(settings: Settings | None = None, *, partitions: int = 1, redactor: Redactor | None = None,
                  log: MemoryLog | None = None) -> Wiring:
    """A :class:`Wiring` on a :class:`MemoryLog` (``log``, else a new one of ``partitions``): the worker's topics,
    a :class:`MemoryRunner`, a :class:`MemoryProducer`, a keyring of its own.

    The sequencer redacts as a worker with these settings does (:func:`agentlog.streams.redaction.load_redactor`:
    the default policy unless ``settings.redaction_policy`` names one), or with ``redactor``.
    """
    settings = settings or Settings()
    kek = LocalKek(os.urandom(32))  # a key-encryption key of this wiring's life only
    ready = asyncio.Event()
    ready.set()
    topics: dict[str, Topic] = {short: NamedTopic(topic_name(settings, short)) for short in TOPICS}
    return Wiring(
        settings=settings,
        runner=MemoryRunner(),
        producer=MemoryProducer(log if log is not None else MemoryLog(partitions)),
        topics=topics,
        tables={},
        keyring=Keyring(kek, {kek.kek_id: kek}),
        keyring_ready=ready,
        redactor=redactor if redactor is not None else load_redactor(settings),
    )


class MemoryWorker:
    """The worker's agents on one wiring and one :class:`MemoryLog`, fed batch by batch (:meth:`feed`).

    Two workers on one log (``memory_wiring(..., log=first.log)``) are two members of each agent's group: the
    one that takes a partition (:meth:`take`) fences the other's writer of it.
    """

    def __init__(self, wiring: Wiring) -> None:
        producer = wiring.producer
        assert isinstance(producer, MemoryProducer), "a MemoryWorker runs on a memory_wiring"
        self.wiring = wiring
        self.log: MemoryLog = producer.log
        self.producer = producer
        runner = wiring.runner
        assert isinstance(runner, MemoryRunner)
        self.runner = runner
        #: Where the agents are made (:mod:`agentlog.worker.handoff`, :mod:`agentlog.worker.spans` install on it).
        self.agents = txruntime.TxAgents(wiring, lambda path, ttl: plain_opener(path), records=self.log.member)
        self._held: set[tuple[str, int]] = set()

    def sequencer(self, *, replay: bool = False) -> sequencer.SequencerAgent:
        """Install the sequencer as the worker does; returns its work (its lifetimes, its hooks)."""
        owned = Owned()
        work = sequencer.build(self.wiring, owned, replay=replay)
        tables = txruntime.state_tables(self.wiring.settings, lambda path, ttl: plain_opener(path),
                                        txruntime.TABLE_NAMES)
        self.wiring.tables.update(tables)
        txruntime.install(self.wiring, work, tables, owned, short="ingest", name="sequencer",
                          records=self.log.member)
        return work

    def topic(self, short: str) -> str:
        return self.wiring.topics[short].get_topic_name()

    async def take(self, name: str, partitions: Sequence[int] = (0,)) -> None:
        """Agent ``name`` is assigned ``partitions`` of its topic (its writers opened, its tables restored)."""
        agent = self.wiring.tx_agents[name]
        await agent.assigned([TopicPartition(agent.topic, p) for p in partitions])
        self._held.update((name, p) for p in partitions)

    async def feed(self, name: str, values: Sequence[bytes | None], *, partition: int = 0,
                   keys: Sequence[bytes | None] | None = None, timestamp_ms: int = 0) -> None:
        """Hand agent ``name`` one batch: ``values`` as the next records of its topic's ``partition``.

        They are appended to the log first (where the agent's topic holds them), then handled as one fetch.
        """
        agent = self.wiring.tx_agents[name]
        if (name, partition) not in self._held:
            await self.take(name, [partition])
        keys = list(keys) if keys is not None else [None] * len(values)
        messages = [MemoryMessage(self.log.append(agent.topic, key, value, partition).offset, timestamp_ms, value,
                                  key) for key, value in zip(keys, values, strict=True)]
        if messages:
            await agent.handle_batch(TopicPartition(agent.topic, partition), messages)

    async def poll(self, name: str, partition: int = 0, *, start: int | None = None, timestamp_ms: int = 0) -> int:
        """Hand agent ``name`` what its consumer fetches now from its topic's ``partition``, as one batch: the
        committed records from the position its last committed transaction noted (the start if none) to the end,
        or from offset ``start`` (a consumer sought back: records handled and committed before, delivered again).

        What an agent reads of records another agent committed (the handoff agent of the sequencer's links), and
        what the new owner of a partition reads again after a batch that did not commit. Returns how many.
        """
        agent = self.wiring.tx_agents[name]
        if (name, partition) not in self._held:
            await self.take(name, [partition])
        if start is None:
            start = await self.log.position(agent.topic, partition) or 0
        records = (await self.log.read({(agent.topic, partition): start}))[(agent.topic, partition)]
        messages = [MemoryMessage(r.offset, timestamp_ms, r.value, r.key) for r in records]
        if messages:
            await agent.handle_batch(TopicPartition(agent.topic, partition), messages)
        return len(messages)

    def values(self, short: str, partition: int | None = None) -> list[bytes | None]:
        """The committed values of the worker's topic ``short``."""
        return self.log.values(self.topic(short), partition)

    def records(self, short: str, partition: int = 0) -> list[LogRecord]:
        """The committed records (offsets, keys, values) of ``partition`` of the worker's topic ``short``."""
        return self.log.committed(self.topic(short), partition)


__all__ = ["MemoryLog", "MemoryMessage", "MemoryProducer", "MemoryRunner", "MemoryWorker", "TopicPartition",
           "memory_wiring"]
