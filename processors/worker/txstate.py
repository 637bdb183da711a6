"""The transactional runtime's local state: per input partition, a table's keys in RocksDB, restored from its changelog.

A :class:`StateTable` is one table of an agent on the transactional runtime (:mod:`agentlog.worker.txruntime`):
the :class:`agentlog.worker.tables.Table` port, each partition a RocksDB database (``rocksdict``, within the
worker's :class:`agentlog.worker.tables.RocksBudget`) that holds, beside the keys, the offset of the last changelog
record it reflects. Its changelog records go out in the transaction of the batch that wrote them, and the local
database is written only once that transaction is committed, so the database is always a prefix of the committed
changelog: :meth:`StateTable.restore` (at assignment, after the partition's writer has fenced any earlier one, so
no transaction of the partition is left open) reads the changelog's tail past that offset and ends at exactly
what the committed transactions wrote. A worker on a new disk reads the whole (compacted) changelog.

Keys and values are stored as their :func:`agentlog.worker.tables.encode` bytes (JSON), as the changelog holds them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import rocksdict

from agentlog.worker.tables import RocksTable, encode
from agentlog.worker.txlog import LogRecord

#: The key a partition's database keeps the offset of the last changelog record it reflects under (not JSON,
#: so never a table key).
RESTORED_KEY = b"\x00restored"


#: Opens a database at a path (``RocksBudget.open`` with the table's TTL, in the worker).
Opener = Callable[[Path], Any]


def plain_opener(path: Path) -> Any:
    """A RocksDB database with rocksdict's defaults (tests, tools)."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    return rocksdict.Rdict(str(path), options=options)


class StateTable(RocksTable):
    """One table, per partition a RocksDB database restored from the changelog's tail (module docstring).

    Reads, batched writes and the LRU of decoded values are :class:`agentlog.worker.tables.RocksTable`'s.
    """

    def __init__(self, name: str, changelog: str, root: Path, *, opener: Opener = plain_opener,
                 cached: int = 8192) -> None:
        super().__init__(cached)
        self.name = name
        self.changelog = changelog
        self._root = root
        self._opener = opener
        self._dbs: dict[int, Any] = {}

    def _path(self, partition: int) -> Path:
        return self._root / f"{self.name}-{partition}"

    def _db(self, partition: int) -> Any:
        db = self._dbs.get(partition)
        if db is None:
            self._root.mkdir(parents=True, exist_ok=True)
            db = self._dbs[partition] = self._opener(self._path(partition))
        return db

    def restored_to(self, partition: int) -> int | None:
        """The offset of the last changelog record the local copy of ``partition`` reflects (None: none)."""
        raw = self._db(partition).get(RESTORED_KEY)
        return None if raw is None else int(raw)

    def tail_start(self, partition: int) -> int:
        """The first changelog offset the local copy of ``partition`` does not reflect (where a restore reads from)."""
        last = self.restored_to(partition)
        return 0 if last is None else last + 1

    def restore(self, partition: int, records: Sequence[LogRecord]) -> int:
        """Apply the changelog's committed records past :meth:`tail_start`; returns how many were applied (a record
        without a key is not a table write)."""
        applied = 0
        if records:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for rec in records:
                if rec.key is None:
                    continue
                applied += 1
                if rec.value is None:
                    batch.delete(rec.key)
                else:
                    batch.put(rec.key, rec.value)
            batch.put(RESTORED_KEY, str(records[-1].offset).encode())
            self._db(partition).write(batch)
        self.forget_cached()
        return applied

    def close(self, partition: int, *, drop: bool = False) -> None:
        """Close ``partition``'s database (``drop``: delete it too: another worker owns the partition now)."""
        db = self._dbs.pop(partition, None)
        if db is not None:
            db.close()
        if drop:
            shutil.rmtree(self._path(partition), ignore_errors=True)
        self.forget_cached()

    def close_all(self) -> None:
        for partition in list(self._dbs):
            self.close(partition)

    def put(self, partition: int, key: str, value: Any, encoded: tuple[bytes, bytes | None] | None = None) -> None:
        self.put_many(partition, [(key, value, encoded or (encode(key), None if value is None else encode(value)))])

    def put_many(self, partition: int, writes: Sequence[tuple[str, Any, tuple[bytes, bytes | None]]],
                 restored_to: int | None = None) -> None:
        """Write ``writes`` in one RocksDB write batch, with the changelog offset they bring the copy to."""
        self._write(partition, writes, None if restored_to is None else (RESTORED_KEY, str(restored_to).encode()))

    def persisted(self, partition: int, offset: int) -> None:
        self._db(partition).put(RESTORED_KEY, str(offset).encode())
