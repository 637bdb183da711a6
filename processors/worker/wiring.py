"""What every agent of the worker needs: settings, the ports (:mod:`.ports`), its topics and tables."""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from agentlog.audit.store import Store
from agentlog.core.redaction import Redactor
from agentlog.streams.keyring import Keyring
from agentlog.streams.settings import Settings
from agentlog.worker.ports import Producer, Runner, Topic
from agentlog.worker.tables import Table


class OwnLogRecords:
    """The log offsets the broker acknowledged to this process's sequencer, per partition, as ranges.

    Kafka never rewrites an offset, so a record at an offset acknowledged to our producer is the
    sequencer's own record: the live log check skips it without decoding or hashing it, and checks in
    full every other one (appended by another producer, or before this process started). The check
    reads each partition in offset order and :meth:`ours` forgets the ranges it has passed, so what is
    kept is the check's lag: one range while the sequencer's records follow each other, at most
    :data:`MAX_RANGES` (the oldest are dropped; their records are then checked in full).
    """

    MAX_RANGES = 10_000

    def __init__(self) -> None:
        self._ranges: dict[int, tuple[list[int], list[int]]] = {}  # partition -> (starts, ends), sorted, disjoint

    def add(self, partition: int, offset: int) -> None:
        starts, ends = self._ranges.setdefault(partition, ([], []))
        if ends and ends[-1] == offset:
            ends[-1] = offset + 1
            return
        i = len(starts)
        if ends and offset < ends[-1]:  # acknowledged out of order (rare): keep the ranges sorted
            i = bisect_right(starts, offset)
            if i and ends[i - 1] > offset:
                return
        starts.insert(i, offset)
        ends.insert(i, offset + 1)
        if len(starts) > self.MAX_RANGES:
            del starts[0], ends[0]

    def ours(self, partition: int, offset: int) -> bool:
        """Whether ``offset`` was acknowledged to us; the ranges below it are forgotten (the check has passed them)."""
        ranges = self._ranges.get(partition)
        if not ranges:
            return False
        starts, ends = ranges
        passed = bisect_right(ends, offset)
        if passed:
            del starts[:passed], ends[:passed]
        return bool(starts) and starts[0] <= offset

    def __len__(self) -> int:
        return sum(len(starts) for starts, _ in self._ranges.values())


@dataclass
class Wiring:
    """The worker's parts, built once and handed to each agent.

    :func:`agentlog.worker.app.build_app` builds them on Faust and Kafka,
    :func:`agentlog.worker.memory.memory_wiring` in memory.
    """

    settings: Settings
    runner: Runner
    producer: Producer
    topics: dict[str, Topic]
    tables: dict[str, Table]
    store: Store | None = None  # set when the audit sink runs in this worker
    #: The log offsets acknowledged to this process's sequencer, until the log check has passed them:
    #: its own records need no re-hashing.
    own_log: OwnLogRecords = field(default_factory=OwnLogRecords)
    #: Each topic's full name by its short name (``topics[short].get_topic_name()``, once per topic).
    topic_names: dict[str, str] = field(default_factory=dict)
    #: The worker's HTTP application and the (host, port) it listens on, when it serves one
    #: (:func:`agentlog.worker.web.install`).
    web_app: Any = None
    web_address: tuple[str, int] | None = None
    #: Every run's data key (:mod:`agentlog.streams.keyring`), kept up to date with the keyring topic;
    #: ``keyring_ready`` is set once it holds what the topic held when the worker started.
    keyring: Keyring | None = None
    keyring_ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: What the sequencer applies to every event before hashing and sealing (:mod:`agentlog.streams.redaction`):
    #: the deployment's policy, by default every built-in detector masking every content member.
    redactor: Redactor = field(default_factory=Redactor)
    #: The agents running on Kafka transactions, by name (:func:`agentlog.worker.txruntime.install`).
    tx_agents: dict[str, Any] = field(default_factory=dict)
    #: The Faust app the ports above are built on, for :mod:`agentlog.worker.app` (which runs it) and the
    #: tests of what it builds; nothing else reads it (None in memory).
    app: Any = None

    async def send(self, short: str, key: str | None, value: bytes) -> Any:
        """Send to one of our topics; returns the delivery future (await it to know it is durable).

        Straight to the producer with bytes we encoded ourselves (key → partition: the producer's default
        murmur2 partitioner).
        """
        return await self.producer.send(
            self.topics[short].get_topic_name(), key.encode("utf-8") if key is not None else None, value, None,
        )
