"""The keyring topic: every run's wrapped data key, and the key-encryption keys (KEKs) that open them.

The keyring is a compacted topic keyed by run id, co-partitioned with ``ingest`` and the log. The sequencer
writes a run's key record before the first log record sealed under it (:mod:`agentlog.worker.sequencer`); an
erasure (``agentlog erase``) writes the run's erased marker over it. Every process that shows content — the worker
(replay verdicts, served results), the CLI, the console — reads the topic into a :class:`Keyring` and opens
records through it; ``agentlog verify`` and the re-derivation replay need no key at all.

KEKs come from ``AGENTLOG_KEK`` (base64 of 32 random bytes, never printed) or from the files in
``AGENTLOG_KEK_FILE`` (comma-separated; default ``$AGENTLOG_HOME/keys/kek``, made with mode 0600 on first use). The
first KEK wraps new keys; every one listed opens the records that name it, which is how a rotation keeps old runs
readable (README "Personal data").
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import binascii
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

import rocksdict
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from agentlog.core.keyring import KeyRecord, KeyringError, KeyWrapper, LocalKek, mint, unwrap
from agentlog.core.lru import Lru
from agentlog.core.sealing import DataKey, is_sealed, open_event, open_value
from agentlog.core.sequencing import REJECTION_CONTENT, rejection_sealing
from agentlog.schemas.errors import InfraError
from agentlog.streams.admin import topic_partitions
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings, create_private_file
from agentlog.streams.topics import partition_for, topic_name

__all__ = ["KeyStore", "Keyring", "MemoryKeyStore", "RocksKeyStore", "follow_keyring", "kek_paths", "load_keyring",
           "load_wrappers", "read_keyring", "scan_keyring"]

log = logging.getLogger("agentlog.keyring")

#: The longest a follower of the topic waits for records before noting how far it has read (an idle partition's
#: position moves past commit markers without a record): how late a sequencer taking over a partition can start.
FOLLOW_WAIT_MS = 200


def kek_paths(settings: Settings) -> list[Path]:
    """The KEK files: ``kek_file`` (comma-separated, the current one first) or the home's default."""
    if settings.kek_file:
        return [Path(p.strip()).expanduser() for p in settings.kek_file.split(",") if p.strip()]
    return [settings.home / "keys" / "kek"]


def _read_or_create(path: Path, *, create: bool) -> bytes:
    try:
        if not path.exists() and create and create_private_file(path, base64.b64encode(os.urandom(32)) + b"\n"):
            log.warning("created the key-encryption key %s: back it up; without it no content can be read", path)
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            log.warning("key-encryption key %s is readable by others; chmod 600 it", path)
        return base64.b64decode(path.read_bytes().strip(), validate=True)
    except (OSError, binascii.Error) as e:
        raise KeyringError(f"cannot read the key-encryption key {path}: {e}; set AGENTLOG_KEK_FILE to a file holding "
                           "base64 of 32 random bytes, or AGENTLOG_KEK") from e


def load_wrappers(settings: Settings) -> tuple[KeyWrapper, dict[str, KeyWrapper]]:
    """The current KEK (wraps new data keys) and every configured KEK by id (open existing ones)."""
    if settings.kek:
        try:
            kek: KeyWrapper = LocalKek(base64.b64decode(settings.kek, validate=True))
        except binascii.Error as e:
            raise KeyringError("AGENTLOG_KEK is not base64 of 32 bytes") from e
        return kek, {kek.kek_id: kek}
    paths = kek_paths(settings)
    wrappers: list[KeyWrapper] = [LocalKek(_read_or_create(p, create=i == 0)) for i, p in enumerate(paths)]
    return wrappers[0], {w.kek_id: w for w in wrappers}


class KeyStore(Protocol):
    """Where a :class:`Keyring` keeps its records: each run's latest, and the run each key id belongs to."""

    def get(self, run_id: str) -> KeyRecord | None: ...

    def put(self, record: KeyRecord, value: bytes | None = None) -> None:
        """Keep ``record`` as its run's latest (``value``: its bytes on the topic, when at hand)."""

    def delete(self, record: KeyRecord) -> None: ...

    def run_of(self, key_id: str) -> str | None: ...

    def records(self) -> Iterator[KeyRecord]: ...


class MemoryKeyStore:
    """The records in two dicts: what a command that reads the topic once holds (``agentlog erase``, the CLI)."""

    def __init__(self) -> None:
        self._records: dict[str, KeyRecord] = {}
        self._run_of_key: dict[str, str] = {}

    def get(self, run_id: str) -> KeyRecord | None:
        return self._records.get(run_id)

    def put(self, record: KeyRecord, value: bytes | None = None) -> None:
        self._records[record.run_id] = record
        self._run_of_key[record.key_id] = record.run_id

    def delete(self, record: KeyRecord) -> None:
        self._records.pop(record.run_id, None)
        self._run_of_key.pop(record.key_id, None)

    def run_of(self, key_id: str) -> str | None:
        return self._run_of_key.get(key_id)

    def records(self) -> Iterator[KeyRecord]:
        return iter(list(self._records.values()))


_MISSING = object()


class RocksKeyStore:
    """The records in a RocksDB database, the ones last used kept decoded (``cached`` of them): a worker's store.

    A worker follows the topic for as long as it runs, and the topic holds a record for every run ever started
    (about 660 bytes a run in dicts): on disk, the worker's memory does not grow with the runs it has seen. The
    database is this process's copy of the topic, rebuilt from the topic at every start: it is opened empty, in a
    directory of its own named by the process (``<parent>/keyring-<pid>-<n>``), and the directories of processes
    that are gone are removed first.
    """

    def __init__(self, parent: Path, *, opener: Callable[[Path], Any] | None = None, cached: int = 8192) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(parent)
        self.path = Path(tempfile.mkdtemp(prefix=f"keyring-{os.getpid()}-", dir=parent))
        self._db = (opener or _open_rocks)(self.path)
        unlogged = rocksdict.WriteOptions()
        # A copy rebuilt at every start needs no write-ahead log (~30% off a load). rocksdict's stub declares
        # disable_wal a method; it is a property.
        unlogged.disable_wal = True  # type: ignore[method-assign,assignment]
        self._db.set_write_options(unlogged)
        self._cache: Lru[str, KeyRecord | None] = Lru(cached)
        atexit.register(self.close)

    def get(self, run_id: str) -> KeyRecord | None:
        hit = self._cache.get(run_id, _MISSING)
        if hit is not _MISSING:
            self._cache.move_to_end(run_id)
            return cast(KeyRecord | None, hit)
        raw = self._db.get(b"r" + run_id.encode("utf-8"))
        record = None if raw is None else KeyRecord.from_value(raw)
        self._cache.keep(run_id, record)  # an absent run too: the sequencer asks at every event of a new run
        return record

    def put(self, record: KeyRecord, value: bytes | None = None) -> None:
        self._db[b"r" + record.run_id.encode("utf-8")] = value if value is not None else record.to_value()
        self._db[b"k" + record.key_id.encode("ascii")] = record.run_id.encode("utf-8")
        self._cache.keep(record.run_id, record)

    def delete(self, record: KeyRecord) -> None:
        del self._db[b"r" + record.run_id.encode("utf-8")]
        del self._db[b"k" + record.key_id.encode("ascii")]
        self._cache.keep(record.run_id, None)

    def run_of(self, key_id: str) -> str | None:
        raw = self._db.get(b"k" + key_id.encode("ascii"))
        return None if raw is None else bytes(raw).decode("utf-8")

    def records(self) -> Iterator[KeyRecord]:
        for key, raw in self._db.items(from_key=b"r"):
            if not key.startswith(b"r"):
                return
            yield KeyRecord.from_value(raw)

    def close(self) -> None:
        """Close the database and remove it (at the latest when the process exits)."""
        if self._db is not None:
            self._db.close()
            self._db = None
            shutil.rmtree(self.path, ignore_errors=True)


def _open_rocks(path: Path) -> Any:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    return rocksdict.Rdict(str(path), options=options)


def _remove_orphans(parent: Path) -> None:
    """Remove the keyring copies of processes that are gone (a worker killed before it could remove its own)."""
    for path in parent.glob("keyring-*-*"):
        try:
            pid = int(path.name.split("-")[1])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # a live process of another user


class Keyring:
    """The keyring's latest record per run (in its :class:`KeyStore`), and the data keys they unwrap to (unwrapped
    once, the last ``cached_keys`` used kept)."""

    def __init__(self, current: KeyWrapper, wrappers: Mapping[str, KeyWrapper], *, store: KeyStore | None = None,
                 cached_keys: int = 8192) -> None:
        self.current = current
        self.wrappers = dict(wrappers)
        self.store: KeyStore = store if store is not None else MemoryKeyStore()
        self._count = 0
        self._keys: Lru[str, DataKey] = Lru(cached_keys)
        #: Where a follower of the topic has read to, by partition (the next offset), and a signal when it moves.
        self._read: dict[int, int] = {}
        self._moved = asyncio.Event()
        self._unfollowed = False  # the follower stopped: nothing it has not read yet will be read

    @classmethod
    def from_settings(cls, settings: Settings, *, store: KeyStore | None = None) -> Keyring:
        return cls(*load_wrappers(settings), store=store)

    def apply(self, value: bytes | None) -> None:
        """Take one record of the topic (the latest for its run wins; a tombstone or filler is skipped)."""
        if not value:
            return
        try:
            record = KeyRecord.from_value(value)
        except KeyringError as e:
            log.error("skipping a keyring record: %s", e)
            return
        self.put(record, value)

    def put(self, record: KeyRecord, value: bytes | None = None) -> None:
        """Keep ``record`` as its run's latest (``value``: its bytes on the topic, when at hand)."""
        old = self.store.get(record.run_id)
        if old is not None and old.erased and not record.erased:
            return  # an erased run stays erased, whatever arrives after its marker
        self.store.put(record, value)
        self._count += old is None
        if record.erased:
            self._keys.pop(record.key_id, None)

    def mint(self, run_id: str, subject: str | None, parent_run_id: str | None, *,
             run_class: str | None = None) -> tuple[DataKey, KeyRecord]:
        """A new data key for ``run_id``, kept here; its record goes to the topic before anything sealed with it."""
        key, record = mint(run_id, subject, parent_run_id, self.current, run_class=run_class)
        self.put(record)
        self._keys.keep(key.key_id, key)
        return key, record

    def forget(self, record: KeyRecord) -> None:
        """Drop ``record``, minted here, whose keyring record never committed (its batch was fenced).

        Whoever owns the run's partition now mints the run's key, or has; that key reaches this keyring through
        the topic. Nothing happens when ``record`` is no longer the run's latest.
        """
        if self.store.get(record.run_id) != record:
            return
        self.store.delete(record)
        self._count -= 1
        self._keys.pop(record.key_id, None)

    def advanced(self, partition: int, position: int) -> None:
        """A follower of the topic has applied every record of ``partition`` before ``position``."""
        if position > self._read.get(partition, -1):
            self._read[partition] = position
            moved, self._moved = self._moved, asyncio.Event()
            moved.set()

    def unfollowed(self) -> None:
        """The follower of the topic stopped: whoever waits in :meth:`reached` is told so."""
        self._unfollowed = True
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def reached(self, ends: Mapping[int, int]) -> None:
        """Return once a follower has applied every record before ``ends`` (offsets by partition).

        Raises:
            KeyringError: the follower stopped first (the worker is stopping, or its follower failed).
        """
        while any(self._read.get(partition, -1) < end for partition, end in ends.items()):
            if self._unfollowed:
                raise KeyringError("the keyring's follower stopped before it read the keys asked for")
            await self._moved.wait()

    def record(self, run_id: str) -> KeyRecord | None:
        return self.store.get(run_id)

    def records(self) -> Iterator[KeyRecord]:
        """Every run's latest record."""
        return self.store.records()

    def run_class(self, run_id: str) -> str | None:
        """``run_id``'s class as its key record says (None: no class, or no record)."""
        rec = self.store.get(run_id)
        return None if rec is None else rec.run_class

    def erased(self, run_id: str) -> bool:
        rec = self.store.get(run_id)
        return rec is not None and rec.erased

    def data_key(self, run_id: str) -> DataKey | None:
        """``run_id``'s data key; None when it has none (yet, or any more)."""
        rec = self.store.get(run_id)
        return None if rec is None or rec.erased else self.key_for(rec.key_id)

    def key_for(self, key_id: str) -> DataKey | None:
        """The data key a sealed token names; None once it is erased.

        Raises:
            KeyringError: the keyring never held this key (its topic is incomplete, or the token was made
                elsewhere), or its KEK is not configured.
        """
        key = self._keys.get(key_id)
        if key is not None:
            self._keys.move_to_end(key_id)
            return key
        run_id = self.store.run_of(key_id)
        rec = None if run_id is None else self.store.get(run_id)
        if rec is None:
            raise KeyringError(f"no data key {key_id} in the keyring: it was never recorded here (the keyring topic "
                               "is incomplete, or the record was sealed by another installation)")
        if rec.erased or rec.key_id != key_id:
            return None
        key = unwrap(rec, self.wrappers)
        self._keys.keep(key_id, key)
        return key

    def open(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` with its content readable (``[erased]`` where the key is gone)."""
        return open_event(doc, self.key_for)

    def open_rejection(self, record: dict[str, Any]) -> dict[str, Any]:
        """A rejection record with its original bytes (``raw``: base64) and detail readable again, or ``[erased]``."""
        sealed = {m: record[m] for m in REJECTION_CONTENT if is_sealed(record.get(m))}
        if not sealed:
            return record
        run, place = rejection_sealing(record)
        return {**record, **{m: open_value(token, self.key_for, run, place, (m,)) for m, token in sealed.items()}}

    def tags(self, subject: str) -> set[str]:
        """``subject``'s tag under every configured KEK (records made before a rotation carry the old one)."""
        return {w.tag(subject) for w in self.wrappers.values()}

    def __len__(self) -> int:
        return self._count


def _consumer(settings: Settings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**client_kwargs(settings), group_id=None, enable_auto_commit=False,
                            auto_offset_reset="earliest", isolation_level="read_committed",
                            client_id="agentlog-keyring", fetch_max_wait_ms=100)


async def _assigned(consumer: AIOKafkaConsumer, settings: Settings,
                    partitions: Iterable[int] | None) -> list[TopicPartition]:
    """Start ``consumer`` on the keyring's ``partitions`` from their start (all by default; none if the topic does not
    exist yet)."""
    topic = topic_name(settings, "keyring")
    # The topic's partitions from an admin client (the consumer has no public call for them), beside the start.
    outcomes: tuple[Any, ...] = await asyncio.gather(consumer.start(), topic_partitions(settings, [topic]),
                                                     return_exceptions=True)
    started, described = outcomes
    if isinstance(started, KafkaError):
        raise InfraError(f"Kafka at {settings.kafka_bootstrap} is unreachable ({started}); run `agentlog infra up`"
                         ) from started
    if isinstance(started, BaseException):
        raise started
    if isinstance(described, BaseException):
        raise described
    known = set(described.get(topic, ()))
    wanted = sorted(known if partitions is None else set(partitions) & known)
    tps = [TopicPartition(topic, p) for p in wanted]
    consumer.assign(tps)
    if tps:
        await consumer.seek_to_beginning(*tps)
    return tps


#: What a read of the keyring hands each record to (an aiokafka ``ConsumerRecord``).
Take = Callable[[Any], None]


async def _read_to(consumer: AIOKafkaConsumer, take: Take, ends: Mapping[TopicPartition, int]) -> None:
    pending = {tp for tp, end in ends.items() if await consumer.position(tp) < end}
    while pending:
        fetched = await consumer.getmany(*pending, timeout_ms=500)
        for messages in fetched.values():
            for m in messages:
                take(m)
        pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}


async def scan_keyring(settings: Settings, runs: Iterable[str] | None, take: Take) -> None:
    """Hand ``take`` every record of the keyring's partitions of ``runs`` (or of all), from their start to their end
    now: what the broker still holds, key records that compaction has yet to remove included."""
    consumer = _consumer(settings)
    partitions = None if runs is None else {partition_for(settings, r, "keyring") for r in runs}
    try:
        tps = await _assigned(consumer, settings, partitions)
        if tps:
            await _read_to(consumer, take, await consumer.end_offsets(tps))
    except KafkaError as e:
        raise InfraError(f"reading the keyring from {settings.kafka_bootstrap} failed: {e}") from e
    finally:
        await consumer.stop()


async def read_keyring(keyring: Keyring, settings: Settings, runs: Iterable[str] | None = None) -> None:
    """Apply the keyring topic's records to ``keyring``, up to its end now: the partitions of ``runs``, or all."""
    await scan_keyring(settings, runs, lambda m: keyring.apply(m.value))


async def load_keyring(settings: Settings, runs: Iterable[str] | None = None) -> Keyring:
    """A :class:`Keyring` holding the topic's records now: of the partitions of ``runs``, or all."""
    keyring = Keyring.from_settings(settings)
    await read_keyring(keyring, settings, runs)
    return keyring


async def follow_keyring(keyring: Keyring, settings: Settings, ready: asyncio.Event) -> None:
    """Keep ``keyring`` up to date with every partition of the topic while the task runs.

    ``ready`` is set once the records that were there at the start are applied: the worker's sequencer waits
    for it, since a run's key must be known before any of its records is sealed again. Afterwards the keyring
    notes how far it has read (:meth:`Keyring.reached`): a sequencer taking over a partition waits until the keys
    its earlier owner committed are applied.
    """
    try:
        consumer = _consumer(settings)
    except BaseException:
        keyring.unfollowed()
        raise
    try:
        tps = await _assigned(consumer, settings, None)
        if not tps:
            raise InfraError(f"topic {topic_name(settings, 'keyring')} does not exist; run `agentlog infra up`")
        await _read_to(consumer, lambda m: keyring.apply(m.value), await consumer.end_offsets(tps))
        ready.set()
        log.info("keyring loaded: %d runs", len(keyring))
        while True:
            for tp in tps:  # past commit markers too, so an idle partition is read to its end
                keyring.advanced(tp.partition, await consumer.position(tp))
            fetched = await consumer.getmany(timeout_ms=FOLLOW_WAIT_MS)
            for messages in fetched.values():
                for m in messages:
                    keyring.apply(m.value)
    finally:
        keyring.unfollowed()
        await consumer.stop()
