"""The worker's tables: per-partition key → value maps with a changelog, on local disk.

Every agent keeps its state in tables partitioned like its source topic (a run's keys live in the partition of the
records that wrote them). Its runtime (:mod:`agentlog.worker.txruntime`) reads and writes them through the small
:class:`Table` port below, always naming the partition, and sends every write's changelog record in the batch's
transaction. :class:`RocksTable` is the RocksDB side of a table (:class:`agentlog.worker.txstate.StateTable` adds
its restore from the changelog); memory is RocksDB's write buffers and block cache, one budget shared by every table
(:class:`RocksBudget`, ``state_cache_mb``), not the number of keys: the tables hold only runs in flight
(:mod:`agentlog.worker.lifetimes`), and what they hold lives on disk.

:class:`MemoryTable` is the same port over a dict, for unit tests of the agents' logic.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from agentlog.core.lru import Lru
from agentlog.schemas.canonical import sized
from agentlog.schemas.errors import ConfigError


class Table(Protocol):
    """One table as the runtime sees it: a name, a changelog topic, keys per partition."""

    name: str
    changelog: str

    def get(self, partition: int, key: str) -> Any:
        """The key's value in ``partition`` (None: absent)."""

    def keys_from(self, partition: int, prefix: str) -> Iterator[str]:
        """Every key of ``partition`` that starts with ``prefix``, in key order."""


_MISSING = object()


def encode(obj: Any) -> bytes:
    """A key or value as its changelog (and local store) bytes: JSON."""
    try:
        return sized(orjson.dumps(obj))
    except (orjson.JSONEncodeError, TypeError):  # integers past 64 bits, non-string keys: any valid JSON does
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class RocksTable:
    """A table's partitions as RocksDB databases (``_db``), read and written by partition.

    The values last read or written are kept decoded in a small LRU (``cached`` entries): a run's
    state is read once per batch that touches the run, and decoding it from JSON each time cost about
    a fifth of the worker's own time per event. Values are never mutated in place (the fold is
    copy-on-write), so a cached one is safe to hand out. Whatever rewrites a database behind the
    table's back (a restore) calls :meth:`forget_cached` after it.
    """

    def __init__(self, cached: int = 8192) -> None:
        self._cache: Lru[tuple[int, str], Any] = Lru(cached)
        import rocksdict

        self._rocksdict = rocksdict

    def _db(self, partition: int) -> Any:
        raise NotImplementedError

    def get(self, partition: int, key: str) -> Any:
        cache = self._cache
        hit = cache.get((partition, key), _MISSING)
        if hit is not _MISSING:
            cache.move_to_end((partition, key))
            return hit
        raw = self._db(partition).get(encode(key))
        value = None if raw is None else orjson.loads(raw)
        self._cache.keep((partition, key), value)  # an absent key too: a run's marker is asked for at every event
        return value

    def _write(self, partition: int, writes: Sequence[tuple[str, Any, tuple[bytes, bytes | None]]],
               also: tuple[bytes, bytes] | None = None) -> None:
        """``writes`` (and the raw pair ``also``) in one RocksDB write batch, then into the LRU."""
        # One RocksDB write batch: a put on the database is a write of its own (~2.2 µs here, measured
        # with rocksdict), a put into a write batch ~0.5 µs, and a batch's writes land together.
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        for _, _, (raw_key, raw_value) in writes:
            if raw_value is None:
                batch.delete(raw_key)
            else:
                batch.put(raw_key, raw_value)
        if also is not None:
            batch.put(*also)
        self._db(partition).write(batch)
        for key, value, _ in writes:
            self._cache.keep((partition, key), value)

    def forget_cached(self) -> None:
        self._cache.clear()

    def keys_from(self, partition: int, prefix: str) -> Iterator[str]:
        start = encode(prefix)[:-1]  # the JSON string without its closing quote: a byte prefix of the keys
        for raw in self._db(partition).keys(from_key=start):
            if not raw.startswith(start):
                return
            yield orjson.loads(raw)


class MemoryTable:
    """The :class:`Table` port over one dict (keys are unique across partitions: a run lives in one)."""

    def __init__(self, name: str, changelog: str | None = None) -> None:
        self.name = name
        self.changelog = changelog or name
        self.data: dict[str, Any] = {}

    def get(self, partition: int, key: str) -> Any:
        return self.data.get(key)

    def put(self, partition: int, key: str, value: Any, encoded: tuple[bytes, bytes | None] | None = None) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value

    def put_many(self, partition: int, writes: Sequence[tuple[str, Any, tuple[bytes, bytes | None]]]) -> None:
        for key, value, encoded in writes:
            self.put(partition, key, value, encoded)

    def keys_from(self, partition: int, prefix: str) -> Iterator[str]:
        return iter(sorted(k for k in self.data if k.startswith(prefix)))



class RocksBudget:
    """Opens every table's RocksDB databases within one memory budget.

    RocksDB's defaults give each database its own block cache and write buffers, so memory would grow with
    tables × partitions. Here all of them share one LRU block cache and one write-buffer manager charged to that
    cache: ``cache_mb`` bounds both together.
    A ``ttl_s`` database drops keys older than that at compaction (the ``closed`` table's markers).
    """

    def __init__(self, cache_mb: int) -> None:
        import rocksdict

        self._rocksdict = rocksdict
        size = max(8, cache_mb) * 1024 * 1024
        self._cache = rocksdict.Cache(size)
        self._buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(size // 2, False,
                                                                                         self._cache)

    def series(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """``agentlog_state_cache_bytes``: what the shared cache holds now (blocks and write buffers charged to it)."""
        yield "agentlog_state_cache_bytes", {}, float(self._cache.get_usage())

    def open(self, path: Path, ttl_s: int | None) -> Any:
        rd = self._rocksdict
        options = rd.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(4 * 1024 * 1024)
        options.set_max_write_buffer_number(2)
        options.set_write_buffer_manager(self._buffers)
        table = rd.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_block_cache(self._cache)
        table.set_cache_index_and_filter_blocks(True)
        options.set_block_based_table_factory(table)
        access = rd.AccessType.read_write() if ttl_s is None else rd.AccessType.with_ttl(ttl_s)
        return rd.Rdict(str(path), options=options, access_type=access)


class StateDirLocked(ConfigError):
    pass


def lock_state_dir(path: Path) -> int:
    """Take the worker's state directory for this process (released when it exits, however it exits).

    Two workers on one directory would open the same RocksDB databases, which RocksDB's own lock refuses
    somewhere inside a rebalance. Refused at start instead, naming the owner.

    Raises:
        StateDirLocked: ``state_dir_locked`` when another live process holds it.
    """
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
        os.close(fd)
        raise StateDirLocked(
            f"the worker state directory {path} is in use by pid {owner}; give each worker on this machine "
            "its own AGENTLOG_STATE_DIR", code="state_dir_locked") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
    return fd  # kept open (and locked) for the life of the process
