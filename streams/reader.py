"""Reading topics by position, without a consumer group.

Replay, export and the tests need "the records of this run, from here to the end as
it is now" — a bounded read by explicit assignment and seek, not group membership.
The end offsets are captured when the read starts, so a read always terminates even
while producers keep writing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError

from agentlog.core.redaction import metrics_only_error, stored_metrics_only
from agentlog.core.sealing import is_sealed, sealed_paths
from agentlog.core.sequencing import REJECTION_CONTENT
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import AgentlogError, InfraError, ReplayError
from agentlog.streams.admin import describe_partitions
from agentlog.streams.codec import decode_ingest, decode_record
from agentlog.streams.keyring import Keyring, load_keyring
from agentlog.streams.security import acl_hint, client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import partition_for, topic_name

log = logging.getLogger(__name__)

Record = tuple[int, int, str | None, dict[str, Any]]
#: ``(offset, key, value)`` as the broker holds them (these topics hold no tombstones).
RawRecord = tuple[int, bytes | None, bytes]
#: A position in several catalogue topics: short name → partition → offset.
Marks = dict[str, dict[int, int]]


def _decoder(short_name: str) -> Callable[[bytes], dict[str, Any]]:
    return decode_ingest if short_name == "ingest" else decode_record


#: How long the broker may hold a fetch that has nothing to return. Reads are bounded by the end
#: offsets seen at their start (``until_end``, what every caller uses), so an empty fetch only
#: happens at a partition's end, and aiokafka's 500 ms default then held up the next request on the
#: same connection by that long. An unbounded read would poll every 10 ms while idle.
READER_FETCH_MAX_WAIT_MS = 10
#: The same for :class:`TopicTail`, which waits at its partitions' ends on purpose: the broker holds an
#: empty fetch this long (aiokafka's default) and answers at once when a record arrives.
TAIL_FETCH_MAX_WAIT_MS = 500


def _consumer(settings: Settings, isolation_level: str,
              fetch_max_wait_ms: int = READER_FETCH_MAX_WAIT_MS) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        **client_kwargs(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        client_id="agentlog-reader",
        fetch_max_wait_ms=fetch_max_wait_ms,
    )


async def _start(consumer: AIOKafkaConsumer, settings: Settings) -> None:
    """Start ``consumer``; an unreachable broker is one clear ``InfraError``."""
    try:
        await consumer.start()
    except KafkaConnectionError as e:
        raise InfraError(f"Kafka at {settings.kafka_bootstrap} is unreachable ({e}); run `agentlog infra up`") from e


async def _start_admin(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    """Start ``admin``; an unreachable broker is one clear ``InfraError``."""
    try:
        await admin.start()
    except KafkaConnectionError as e:
        raise InfraError(f"Kafka at {settings.kafka_bootstrap} is unreachable ({e}); run `agentlog infra up`") from e


async def _first_failure(*steps: Awaitable[Any]) -> None:
    """Run ``steps`` side by side to their ends; raise the first one's error, in their order, if any failed."""
    for outcome in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


async def _nothing() -> dict[TopicPartition, int]:
    return {}


def _plain_batches(fetched: dict[TopicPartition, list[Any]], ends: dict[TopicPartition, int],
                   key_bytes: bytes | None) -> list[tuple[int, list[RawRecord]]]:
    """``getmany``'s records as ``(partition, [(offset, key, value), …])``: the key's records below the end."""
    out = []
    for tp, messages in fetched.items():
        if not messages:
            continue
        end = ends.get(tp)
        if end is None:
            end = messages[-1].offset + 1
        out.append((tp.partition, [(m.offset, m.key, m.value) for m in messages
                                   if m.offset < end and (key_bytes is None or m.key == key_bytes)]))
    return out


class TopicReader:
    """One started group-less consumer for several bounded reads, one after another.

    Each read is an explicit assignment and seek, so a reader can read the snapshots
    topic, then a run's log, paying one consumer start-up (connection, metadata round trips)
    instead of one per read; for a short replay the start-ups are most of the wall time. Use it
    as an async context manager; reads must not overlap (one consumer, one assignment).

    The topics' partitions come from an admin client started beside the consumer
    (:func:`agentlog.streams.admin.describe_partitions`), looked up once per topic.
    """

    def __init__(self, settings: Settings, *, isolation_level: str = "read_committed",
                 topics: Iterable[str] = ()) -> None:
        """``topics``: the catalogue topics (short names) the reads will touch, so their partitions
        are looked up while the consumer starts instead of one round trip per first read of each."""
        self.settings = settings
        self._consumer = _consumer(settings, isolation_level)
        self._admin = AIOKafkaAdminClient(**client_kwargs(settings), client_id="agentlog-reader")
        self._topics = tuple(topic_name(settings, short) for short in topics)
        self._partitions: dict[str, list[int]] = {}

    async def __aenter__(self) -> TopicReader:
        try:
            await _first_failure(_start(self._consumer, self.settings), self._start_admin())
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _stop(self) -> None:
        await asyncio.gather(self._consumer.stop(), self._admin.close())

    async def _start_admin(self) -> None:
        await _start_admin(self._admin, self.settings)
        if self._topics:
            await self._describe(self._topics)

    async def _describe(self, topics: Iterable[str]) -> None:
        topics = tuple(topics)
        try:
            self._partitions.update(await describe_partitions(self._admin, topics))
        except KafkaError as e:
            raise InfraError(f"describing {', '.join(topics)} on {self.settings.kafka_bootstrap} failed: {e}") from e

    async def _topic_partitions(self, short_name: str, key: str | None) -> list[TopicPartition]:
        topic = topic_name(self.settings, short_name)
        if topic not in self._partitions:
            await self._describe([topic])
        parts = self._partitions.get(topic)
        if not parts:
            raise InfraError(f"topic {topic} does not exist on {self.settings.kafka_bootstrap}; "
                             f"run `agentlog infra up`{acl_hint(self.settings)}")
        if key is not None:
            parts = [partition_for(self.settings, key, short_name, partitions=len(parts))]
        return [TopicPartition(topic, p) for p in parts]

    def _track(self, tps: list[TopicPartition]) -> None:
        """Have the consumer fetch the metadata of ``tps``' topics, which its offset look-ups then wait for.

        aiokafka's consumer fetches the metadata of the topics assigned to it; a look-up of a partition it
        holds no metadata for fails instead and is retried after ``retry_backoff_ms`` (100 ms), one topic a
        round. Each partition gets a position and is paused, so the fetcher neither looks a position up
        (a request of its own, which holds up the read's first fetch, by up to 200 ms) nor fetches; a read
        assigns its partitions again once it knows where to read.
        """
        consumer = self._consumer
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        consumer.pause(*tps)

    async def end_marks(self, short_names: Iterable[str]) -> Marks:
        """:func:`end_marks` on this reader's consumer."""
        shorts = tuple(short_names)
        try:
            tps = [tp for short in shorts for tp in await self._topic_partitions(short, None)]
            self._track(tps)
            ends = await self._consumer.end_offsets(tps)
        except KafkaError as e:
            raise InfraError(f"reading the end offsets of {', '.join(shorts)} from "
                             f"{self.settings.kafka_bootstrap} failed: {e}") from e
        short_of = {topic_name(self.settings, short): short for short in shorts}
        marks: Marks = {short: {} for short in shorts}
        for tp, offset in ends.items():
            marks[short_of[tp.topic]][tp.partition] = offset
        return marks

    async def read(
        self,
        short_name: str,
        *,
        key: str | None = None,
        from_offsets: dict[int, int] | None = None,
        until_end: bool = True,
        skip_undecodable: bool = False,
    ) -> AsyncGenerator[Record, None]:
        """:func:`read_topic` on this reader's consumer.

        Each record is decoded as it is handed over, not a fetched batch at a time: decoding a
        batch of a thousand log records up front and then walking them made each decode take
        twice as long (measured in a replay; most likely the decoded objects of a whole batch
        no longer fit the CPU caches, where one record's do).
        """
        decode = _decoder(short_name)
        async for partition, batch in self.read_raw(short_name, key=key, from_offsets=from_offsets,
                                                    until_end=until_end):
            for offset, record_key, raw in batch:
                try:
                    value = decode(raw)
                except AgentlogError as e:
                    if not skip_undecodable:
                        raise
                    log.info("skipping undecodable record %s[%d]@%d: %s", short_name, partition, offset, e)
                    continue
                yield partition, offset, record_key.decode() if record_key is not None else None, value

    async def read_raw(
        self,
        short_name: str,
        *,
        key: str | None = None,
        from_offsets: dict[int, int] | None = None,
        until_end: bool = True,
    ) -> AsyncGenerator[tuple[int, list[RawRecord]], None]:
        """The records :meth:`read` reads, undecoded: ``(partition, [(offset, key, value bytes), …])`` per fetch.

        For a caller whose per-record work is the hot path (re-derivation): its loop over a fetched
        batch is plain Python, where an async generator costs a resumption per record, and it
        decodes each record the way it needs.
        """
        consumer = self._consumer
        topic = topic_name(self.settings, short_name)
        try:
            tps = await self._topic_partitions(short_name, key)
            self._track(tps)
            starts = {tp: (from_offsets or {}).get(tp.partition) for tp in tps}
            unset = [tp for tp, o in starts.items() if o is None]
            begin, ends = await asyncio.gather(
                consumer.beginning_offsets(unset) if unset else _nothing(),
                consumer.end_offsets(tps) if until_end else _nothing())
            positions = {tp: starts[tp] if starts[tp] is not None else begin[tp] for tp in tps}
            # Assign, seek and pause what is already read to its end in one go, without letting
            # the event loop run in between: aiokafka's fetcher then never sees a partition
            # without a position (it would look the position up, and reads stalled ~200 ms),
            # nor fetches one nobody reads (the broker holds such a fetch up to
            # fetch_max_wait_ms, and with it the next request on this connection).
            consumer.assign(tps)
            live = set()
            for tp in tps:
                consumer.seek(tp, positions[tp])
                if not until_end or positions[tp] < ends[tp]:
                    live.add(tp)
                else:
                    consumer.pause(tp)
            key_bytes = key.encode() if key is not None else None
            while live:
                fetched = await consumer.getmany(*live, timeout_ms=500)
                if until_end:
                    for tp in list(live):
                        if await consumer.position(tp) >= ends[tp]:
                            # Read to its end: pause it before the fetcher asks for more (see above).
                            live.discard(tp)
                            consumer.pause(tp)
                batches = _plain_batches(fetched, ends, key_bytes)
                # Drop aiokafka's record objects before the batch is walked: alive for the whole walk of a
                # batch, a thousand of them outlived several young collections each and were promoted, which set
                # off full collections.
                fetched.clear()
                for partition_batch in batches:
                    yield partition_batch
        except KafkaError as e:
            raise InfraError(f"reading {topic} from {self.settings.kafka_bootstrap} failed: {e}") from e


async def read_topic(
    settings: Settings,
    short_name: str,
    *,
    key: str | None = None,
    from_offsets: dict[int, int] | None = None,
    until_end: bool = True,
    isolation_level: str = "read_committed",
    skip_undecodable: bool = False,
) -> AsyncGenerator[Record, None]:
    """Yield ``(partition, offset, key, value)`` from a catalogue topic.

    With ``key`` only that key's partition is read and other keys are skipped.
    ``from_offsets`` maps partition → first offset (default: the beginning).
    With ``until_end`` the read stops at the end offsets seen when it started.
    Undecodable values raise (their ``EventRejected``), or are skipped with a log
    line when ``skip_undecodable`` — ingest may legitimately hold garbage that the
    sequencer rejected. One consumer per call; :class:`TopicReader` reuses one.
    """
    async with TopicReader(settings, isolation_level=isolation_level, topics=(short_name,)) as reader:
        async for record in reader.read(short_name, key=key, from_offsets=from_offsets, until_end=until_end,
                                        skip_undecodable=skip_undecodable):
            yield record


async def end_marks(settings: Settings, short_names: Iterable[str]) -> Marks:
    """Every partition's end offset of the given catalogue topics, now (``read_committed``: the last stable offset).

    A wait for records yet to be written starts here (:class:`TopicTail`): whatever is written
    after this call is at or past these offsets, so the wait never reads what the topics held before.
    """
    shorts = tuple(short_names)
    async with TopicReader(settings, topics=shorts) as reader:
        return await reader.end_marks(shorts)


class TopicTail:
    """Follows catalogue topics from given offsets on, as records arrive: no end, no consumer group.

    For a wait on records others are yet to write (the sequencer's decisions on what a publisher
    sent): :meth:`poll` hands over what arrived since the last call, decoded. Undecodable
    records are skipped with a log line (an internal topic holds only what our processors wrote).
    """

    def __init__(self, settings: Settings, since: Marks, *, isolation_level: str = "read_committed") -> None:
        self.settings = settings
        self._since = since
        self._consumer = _consumer(settings, isolation_level, fetch_max_wait_ms=TAIL_FETCH_MAX_WAIT_MS)
        self._short_of = {topic_name(settings, short): short for short in since}

    async def __aenter__(self) -> TopicTail:
        await _start(self._consumer, self.settings)
        try:
            starts = {TopicPartition(topic_name(self.settings, short), partition): offset
                      for short, offsets in self._since.items() for partition, offset in offsets.items()}
            self._consumer.assign(list(starts))
            for tp, offset in starts.items():
                self._consumer.seek(tp, offset)
        except BaseException:
            await self._consumer.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_s: float) -> list[tuple[str, int, int, dict[str, Any]]]:
        """``(short name, partition, offset, value)`` of what arrived, waiting up to ``timeout_s`` for a record."""
        try:
            fetched = await self._consumer.getmany(timeout_ms=max(0, int(timeout_s * 1000)))
        except KafkaError as e:
            raise InfraError(f"reading {', '.join(self._short_of)} from {self.settings.kafka_bootstrap} "
                             f"failed: {e}") from e
        out = []
        for tp, messages in fetched.items():
            short = self._short_of[tp.topic]
            for m in messages:
                try:
                    value = decode_record(m.value)
                except AgentlogError as e:
                    log.info("skipping undecodable record %s[%d]@%d: %s", short, tp.partition, m.offset, e)
                    continue
                out.append((short, tp.partition, m.offset, value))
        return out


class RunLog(list[dict[str, Any]]):
    """The events of one run in log order; ``conflicts`` lists duplicates that were *not* identical.

    Each conflict is ``{"runId", "sequence", "kept", "dropped"}`` (the two records).
    """

    conflicts: list[dict[str, Any]]

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = []


def _run_item(short_name: str, topic: str, partition: int, offset: int, value: dict[str, Any]) -> dict[str, Any]:
    """A record of a run as :func:`read_run` and :func:`iter_run` hand it over: a ``log`` record as it is, an
    ``ingest`` doc with where it was read."""
    if short_name != "ingest":
        return value
    return {"doc": value, "source": {"topic": topic, "partition": partition, "offset": offset}}


async def read_run(
    settings: Settings, run_id: str, *, short_name: str = "log", from_offset: int | None = None,
    opened: bool = True, keyring: Keyring | None = None, refuse_erased: bool = False,
) -> RunLog:
    """The records of ``run_id`` from its partition, deduplicated by ``(runId, sequence)``.

    From ``log`` each item is a CommittedEvent; from ``ingest`` (before the sequencer
    has run) each item is ``{"doc": RunEventDoc, "source": {...}}`` so callers can
    read ``item["doc"]`` either way. The first record of a ``(runId, sequence)`` wins;
    a later identical one is a redelivery and dropped silently; a later *different*
    one is dropped and recorded in ``.conflicts``.

    Log records hold content sealed (SPEC §12). ``opened`` (the default) gives each doc with its
    content readable through ``keyring`` (by default the run's partition of the keyring topic, read
    now), ``[erased]`` where the key is gone; ``opened=False`` gives the stored form, which is what
    the chain hashes and what ``agentlog verify`` checks. Deduplication compares stored forms.
    ``refuse_erased`` (a replay's source) raises ``ReplayError`` (``run_erased``) for a run whose key was erased, and
    (``metrics_only``) for a run stored metrics-only: neither holds content to replay.
    """
    topic = topic_name(settings, short_name)
    result = RunLog()
    seen: dict[tuple[str, int | None], dict[str, Any]] = {}  # a doc may lack its sequence
    from_offsets = None
    if from_offset is not None:
        from_offsets = {partition_for(settings, run_id, short_name): from_offset}
    async for partition, offset, _, value in read_topic(
        settings, short_name, key=run_id, from_offsets=from_offsets, skip_undecodable=short_name == "ingest",
    ):
        item = _run_item(short_name, topic, partition, offset, value)
        doc = item.get("doc")
        if not isinstance(doc, dict) or doc.get("runId") != run_id:
            continue
        ident = (run_id, doc.get("sequence"))
        first = seen.get(ident)
        if first is None:
            seen[ident] = item
            result.append(item)
        elif first["doc"] != doc:
            result.conflicts.append({"runId": run_id, "sequence": ident[1], "kept": first, "dropped": item})
            log.warning("run %s sequence %s: conflicting duplicate at offset %d dropped", run_id, ident[1], offset)
    sealed = opened and short_name != "ingest" and any(sealed_paths(item["doc"]) for item in result)
    if not (sealed or refuse_erased):
        return result
    if keyring is None:  # read once, and only for a run that has content to open (or a replay to refuse)
        keyring = await load_keyring(settings, [run_id])
    if refuse_erased and keyring.erased(run_id):
        raise ReplayError(f"run {run_id} was erased (agentlog erase): its content is gone, so it cannot be "
                          "replayed; its metadata and verification remain", code="run_erased")
    if refuse_erased and stored_metrics_only(item["doc"] for item in result):
        raise metrics_only_error(run_id)
    if sealed:
        for i, item in enumerate(result):
            result[i] = {**item, "doc": keyring.open(item["doc"])}
    return result


async def iter_run(
    settings: Settings, run_id: str, *, short_name: str = "log", opened: bool = True,
    keyring: Keyring | None = None, conflicts: list[dict[str, Any]] | None = None,
) -> AsyncGenerator[dict[str, Any], None]:
    """The items :func:`read_run` returns, each handed over as it is read instead of the run at once.

    For a reader that writes each item out (``agentlog export``): it holds one record at a time, plus
    a 16-byte digest per sequence to tell a redelivery (identical, dropped silently) from a conflicting
    duplicate (dropped, logged, and appended to ``conflicts`` as ``{"runId", "sequence", "dropped"}``).
    ``opened`` opens each doc's content as it passes, through ``keyring`` (by default the run's partition
    of the keyring topic, read at the first sealed doc).
    """
    topic = topic_name(settings, short_name)
    seen: dict[int | None, bytes] = {}
    async for partition, offset, _, value in read_topic(settings, short_name, key=run_id,
                                                        skip_undecodable=short_name == "ingest"):
        item = _run_item(short_name, topic, partition, offset, value)
        doc = item.get("doc")
        if not isinstance(doc, dict) or doc.get("runId") != run_id:
            continue
        sequence = doc.get("sequence")
        digest = hashlib.blake2b(jcs(doc), digest_size=16).digest()
        first = seen.setdefault(sequence, digest)
        if first != digest:
            if conflicts is not None:
                conflicts.append({"runId": run_id, "sequence": sequence, "dropped": item})
            log.warning("run %s sequence %s: conflicting duplicate at offset %d dropped", run_id, sequence, offset)
            continue
        if first is not digest:
            continue  # a redelivery of a record already handed over
        if opened and short_name != "ingest" and sealed_paths(doc):
            if keyring is None:
                keyring = await load_keyring(settings, [run_id])
            item = {**item, "doc": keyring.open(doc)}
        yield item


async def read_rejections(settings: Settings, *, keyring: Keyring | None = None) -> list[dict[str, Any]]:
    """Every record of the ``rejections`` topic, with the original bytes readable (``raw``: base64, or ``[erased]``).

    The sequencer seals a rejected record's bytes (they are a host's content); they open here through
    ``keyring`` (by default the keyring topic, read once if any record needs it).
    """
    found = [value async for _, _, _, value in read_topic(settings, "rejections")]
    if keyring is None and any(is_sealed(r.get(m)) for r in found for m in REJECTION_CONTENT):
        keyring = await load_keyring(settings)
    return found if keyring is None else [keyring.open_rejection(r) for r in found]


async def offset_for_time(settings: Settings, short_name: str, partition: int, ts_ms: int) -> int:
    """The first offset on ``partition`` whose timestamp is ≥ ``ts_ms`` (the end offset if none is)."""
    topic = topic_name(settings, short_name)
    consumer = _consumer(settings, "read_committed")
    await _start(consumer, settings)
    try:
        tp = TopicPartition(topic, partition)
        found = (await consumer.offsets_for_times({tp: ts_ms}))[tp]
        offset: int = found.offset if found is not None else (await consumer.end_offsets([tp]))[tp]
        return offset
    except KafkaError as e:
        raise InfraError(f"offset lookup on {topic}[{partition}] failed: {e}") from e
    finally:
        await consumer.stop()


async def first_offset(settings: Settings, topic: str, partition: int) -> int:
    """The offset of the first record ``topic[partition]`` still holds (its log start offset)."""
    tp = TopicPartition(topic, partition)
    consumer = _consumer(settings, "read_committed")
    await consumer.start()
    try:
        offset: int = (await consumer.beginning_offsets([tp]))[tp]
        return offset
    except KafkaError as e:
        raise InfraError(
            f"reading the start of {topic}[{partition}] from {settings.kafka_bootstrap} failed: {e}") from e
    finally:
        await consumer.stop()


async def fetch_range(
    settings: Settings, topic: str, partition: int, start: int, stop: int
) -> list[tuple[int, int, bytes | None, bytes]]:
    """Raw ``(offset, timestamp_ms, key, value)`` of records ``start <= offset < stop`` of one partition.

    Plain assign + seek, ``read_committed``; offsets that hold no record (transaction
    markers) are simply absent. The processors use it to read a range their own
    consumer skipped.
    """
    tp = TopicPartition(topic, partition)
    consumer = _consumer(settings, "read_committed")
    await consumer.start()
    out: list[tuple[int, int, bytes | None, bytes]] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        end = min(stop, (await consumer.end_offsets([tp]))[tp])
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=500)
            for m in batches.get(tp, []):
                if m.offset >= stop:
                    break
                out.append((m.offset, m.timestamp, m.key, m.value))
    except KafkaError as e:
        raise InfraError(
            f"reading {topic}[{partition}] {start}..{stop} from {settings.kafka_bootstrap} failed: {e}"
        ) from e
    finally:
        await consumer.stop()
    return out
