"""The ClickHouse store: one code path for embedded chdb and a ClickHouse server.

``open_store`` takes ``chdb:///<dir>`` (the ClickHouse engine in-process, data in
``<dir>``) or ``http(s)://user:pass@host:port/db`` and returns a :class:`Store`
wrapping a clickhouse-connect client; nothing above this module knows which.

chdb has two process-level limits that shape this module (verified on chdb 4.4 /
ClickHouse 26.9):

* a directory can be open in ONE process: a second process fails with
  ``Cannot lock file <dir>/status ... (CANNOT_OPEN_FILE)``;
* a process can have ONE directory open at a time: opening another while a client
  is open fails with ``EmbeddedServer already initialized with path ...``. Two
  clients on the same directory in one process share the engine and work.

So within a process every ``open_store`` of a directory shares one client
(reference-counted registry), and across processes one process owns the directory:
it holds an exclusive ``flock`` on ``<dir>.lock``, taken before the
engine opens and released by the kernel when the process ends, however it ends, so
a SIGKILLed owner never blocks its own restart and a recycled pid is never taken for
an owner. Beside it an owner file ``<dir>.owner.json`` ``{pid, cmd, started, role?,
queryUrl?}`` says who holds the lock, so a second process gets a one-line
``store_locked`` error (:class:`agentlog.schemas.errors.StoreLockedError`) naming the owner
instead of the engine's lock message, and the CLI can send its query to the
owner's ``queryUrl`` instead. The owner file is only ever believed while the lock is held.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError as _CCError

from agentlog.audit.rows import rows_for
from agentlog.schemas.errors import StoreError, StoreLockedError
from agentlog.streams.settings import Settings

__all__ = [
    "ClickHouseError",
    "QueryResult",
    "Store",
    "lock_file",
    "open_store",
    "owner_file",
    "read_owner",
    "redact_url",
    "store_url",
]



class ClickHouseError(StoreError):
    """ClickHouse refused a statement; ``server_code``/``server_name`` are the server's own (e.g. 164 READONLY)."""

    code = "clickhouse_error"

    def __init__(self, message: str, *, server_code: int | None = None, server_name: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.server_code = server_code
        self.server_name = server_name

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().to_dict())
        if self.server_code is not None:
            out["serverCode"] = self.server_code
        if self.server_name is not None:
            out["serverName"] = self.server_name
        return out


_CODE_RE = re.compile(r"Code:\s*(\d+)")
_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)")


def _server_error(e: Exception, what: str) -> ClickHouseError:
    """A ClickHouseError that keeps the server's numeric code and symbolic name, on one line."""
    text = " ".join(str(e).split())
    code_m = _CODE_RE.search(text)
    name_m = _NAME_RE.search(text[code_m.end():] if code_m else text)
    server_code = int(code_m.group(1)) if code_m else None
    server_name = name_m.group(1) if name_m else None
    # The server appends a version trailer and sometimes the whole query; keep the first sentence-ish part.
    msg = text
    if code_m:
        msg = text[code_m.start():]
    cut = msg.find(". (", 0)
    if cut != -1 and server_name:
        msg = msg[: msg.find(")", cut) + 1]
    return ClickHouseError(f"{what}: {msg[:500]}", server_code=server_code, server_name=server_name)


@dataclass(frozen=True)
class QueryResult:
    """Rows of a query with their column names; ``rows`` are tuples in column order."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]

    def to_dataframe(self) -> Any:
        """A pandas DataFrame (pandas is optional; StoreError ``no_pandas`` without it)."""
        try:
            import pandas as pd  # optional dependency: imported only by the caller that asks for a DataFrame
        except ImportError as e:
            raise StoreError("pandas is not installed; pip install pandas", code="no_pandas") from e
        return pd.DataFrame.from_records(self.rows, columns=list(self.columns))


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (URLs end up in errors and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


def store_url(settings_or_url: Settings | str) -> str:
    return settings_or_url if isinstance(settings_or_url, str) else settings_or_url.store_url


def _chdb_path(url: str) -> str | None:
    """Directory of a ``chdb://`` URL (``None`` for a server URL, ``':memory:'`` for none)."""
    if not url.startswith("chdb:"):
        return None
    rest = url[len("chdb:"):]
    if rest.startswith("//"):
        rest = rest[2:]
    if rest in ("", ":memory:"):
        return ":memory:"
    return os.path.realpath(os.path.expanduser(rest))


def owner_file(path: str | os.PathLike[str]) -> Path:
    """``<dir>.owner.json`` beside the chdb directory (not inside: the engine owns that)."""
    return Path(str(Path(path)) + ".owner.json")


def lock_file(path: str | os.PathLike[str]) -> Path:
    """``<dir>.lock`` beside the chdb directory: its owner holds an exclusive ``flock`` on it."""
    return Path(str(Path(path)) + ".lock")


#: How long an opener retries a held lock before it says ``store_locked``: long enough to ride
#: out a :func:`read_owner` probe (a shared lock held for microseconds), short for a real owner.
_LOCK_PATIENCE_S = 1.0


def _take_lock(path: str) -> int:
    """Take the directory's exclusive lock; its descriptor is kept open while the store is.

    Raises:
        StoreLockedError: another live process holds it (the message names it from the owner file).
    """
    fd = os.open(lock_file(path), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + _LOCK_PATIENCE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise _locked_error(path, _load_owner(owner_file(path))) from None
            time.sleep(0.05)


def _lock_held(path: str) -> bool:
    """True while some process (this one included) holds the directory's lock.

    Probed with a shared non-blocking ``flock`` on a fresh descriptor, released at once; an
    opener racing the probe retries for :data:`_LOCK_PATIENCE_S`.
    """
    try:
        fd = os.open(lock_file(path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the probe's descriptor drops its shared lock, never the owner's
    return False


def read_owner(settings_or_url: Settings | str) -> dict[str, Any] | None:
    """The owner record of a chdb store if a *live* process holds its lock, else ``None``."""
    path = _chdb_path(store_url(settings_or_url))
    if path is None or path == ":memory:":
        return None
    if not _lock_held(path):
        return None
    owner = _load_owner(owner_file(path))
    if owner is None or not _pid_alive(owner.get("pid")):
        return None  # locked by a process that has not written its record yet (the file is an earlier owner's)
    return owner


def _load_owner(p: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(p.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) still answers kill(0) but holds no lock.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _write_owner(p: Path, record: dict[str, Any]) -> None:
    tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True), "utf-8")
    os.replace(tmp, p)


def _locked_error(path: str, owner: dict[str, Any] | None) -> StoreLockedError:
    if owner and not _pid_alive(owner.get("pid")):
        owner = None  # a record left by an earlier owner: the lock's holder has not written its own yet
    if owner:
        who = f"pid {owner.get('pid')} ({owner.get('cmd', '?')})"
        where = f"; its query endpoint is {owner['queryUrl']}" if owner.get("queryUrl") else ""
    else:
        who, where = "another process", ""
    return StoreLockedError(
        f"chdb directory {path} is in use by {who}{where}: query through the worker's endpoint "
        f"(agentlog query/sql do this automatically) or stop that process first",
        owner=owner,
    )


@dataclass(eq=False)  # one engine is one object: compared (and hashed) by identity
class _Engine:
    """One clickhouse-connect client per chdb directory (or server URL) per process."""

    key: str
    client: Any
    path: str | None
    refs: int = 0
    owner: dict[str, Any] | None = None
    #: the descriptor holding the directory's exclusive flock (None for a server or ``:memory:``)
    lock_fd: int | None = None


_REGISTRY: dict[str, _Engine] = {}
_REGISTRY_LOCK = threading.RLock()


def dedup_settings(token: str) -> dict[str, int | str]:
    """The settings that make an insert idempotent by ``token``, in the table and in its materialized views."""
    return {"insert_deduplicate": 1, "insert_deduplication_token": token,
            "deduplicate_blocks_in_dependent_materialized_views": 1}


class Store:
    """A handle on the audit store. Close it (or use ``with``) so the chdb directory is released."""

    def __init__(self, engine: _Engine, url: str, *, client: Any = None) -> None:
        self._engine = engine
        self.url = url
        self._closed = False
        #: a client of this handle alone (:meth:`fork`); None: the engine's shared one
        self._own_client = client

    def fork(self) -> Store:
        """Another handle on the same store, with a connection of its own on chdb.

        clickhouse-connect's chdb client runs one statement at a time, and chdb releases the GIL
        while a statement runs: two connections on one directory in one process run two
        statements at once on two cores (measured: two SHA-256 scans in 0.36–0.39 s wall against
        0.57–0.61 s on one connection). The fork shares the directory's lock and owner record;
        close it like any handle. On a server (no session) and for ``:memory:`` (a second
        connection would be another database) the fork shares the client.
        """
        self._check_open()
        eng = self._engine
        client = None
        if eng.path is not None and eng.path != ":memory:":
            try:
                client = clickhouse_connect.get_client(dsn=f"chdb://{eng.path}")
            except Exception as e:
                raise StoreError(f"cannot open a second connection on chdb directory {eng.path}: "
                                 f"{' '.join(str(e).split())[:300]}", code="store_unavailable") from e
        with _REGISTRY_LOCK:
            eng.refs += 1
        return Store(eng, self.url, client=client)

    # -- identity -----------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        return self._own_client if self._own_client is not None else self._engine.client

    @property
    def engine(self) -> object:
        """What this handle shares with every other handle on the store (its forks included): an
        identity for state kept per store in the process."""
        return self._engine

    @property
    def backend(self) -> str:
        return "server" if self._engine.path is None else "chdb"

    @property
    def path(self) -> str | None:
        """The chdb directory, ``None`` for a server."""
        return self._engine.path

    def __repr__(self) -> str:
        return f"Store({redact_url(self.url)!r})"

    # -- reads & writes -----------------------------------------------------------------------
    def query(self, sql: str, parameters: Mapping[str, Any] | None = None, *,
              settings: Mapping[str, Any] | None = None) -> QueryResult:
        """Run a SELECT with server-side bound ``{name:Type}`` parameters."""
        self._check_open()
        try:
            res = self.client.query(sql, parameters=dict(parameters or {}), settings=dict(settings or {}))
        except _CCError as e:
            raise _server_error(e, "query failed") from e
        return QueryResult(tuple(res.column_names), [tuple(r) for r in res.result_rows])

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None, *,
                settings: Mapping[str, Any] | None = None) -> Any:
        """Run DDL or another statement that returns no rows."""
        self._check_open()
        try:
            return self.client.command(sql, parameters=dict(parameters or {}) or None,
                                       settings=dict(settings or {}) or None)
        except _CCError as e:
            raise _server_error(e, "statement failed") from e

    def insert(self, table: str, data: Sequence[Sequence[Any]], column_names: Sequence[str], *,
               column_oriented: bool = False, dedup_token: str | None = None) -> int:
        """Insert rows (or columns with ``column_oriented=True``); returns the row count.

        With ``dedup_token`` the insert is idempotent: ClickHouse drops a later insert carrying a
        token it still holds in the table's deduplication window (``non_replicated_deduplication_window``
        on one node, the replicated log on a cluster), and the materialized views skip it too.
        """
        self._check_open()
        n = (len(data[0]) if data else 0) if column_oriented else len(data)
        if n == 0:
            return 0
        settings = dedup_settings(dedup_token) if dedup_token is not None else {}
        # clickhouse-connect's insert context is a reference cycle (it holds a bound method of itself) and keeps the
        # list it was handed after the insert. The worker's collector leaves cycles to a rare full collection
        # (agentlog.worker.gcpause), so the context gets a list of its own, emptied once the insert is done.
        handed = list(data)
        try:
            self.client.insert(table, handed, column_names=list(column_names), column_oriented=column_oriented,
                               settings=settings or None)
        except _CCError as e:
            raise _server_error(e, f"insert into {table} failed") from e
        finally:
            handed.clear()
        return n

    def insert_raw(self, table: str, column: str, data: bytes, fmt: str) -> None:
        """Insert ``data`` in ClickHouse format ``fmt`` into one column, parsed by ClickHouse.

        The audit sink hands a batch of raw records over this way (``LineAsString``) and lets
        ClickHouse map them (:mod:`agentlog.audit.raw`). clickhouse-connect sends the bytes as
        the body of an HTTP insert to a server and through ``INSERT … FROM INFILE`` to chdb
        (chdb ignores data written inline after an ``INSERT … SELECT FROM input()``, silently).
        """
        self._check_open()
        try:
            self.client.raw_insert(table, [column], data, fmt=fmt)
        except _CCError as e:
            raise _server_error(e, f"insert into {table} failed") from e

    def insert_records(self, kind: str, records: Iterable[Mapping[str, Any]], *,
                       dedup_token: str | None = None) -> int:
        """Map a batch of one record kind (CONTRACT.md shapes) and insert it in one columnar insert.

        The tables are plain MergeTree: a batch inserted twice is stored twice unless both
        inserts carry the same ``dedup_token`` (the sink's is its Kafka offset range).
        """
        table, names, cols = rows_for(kind, records)
        return self.insert(table, cols, names, column_oriented=True, dedup_token=dedup_token)

    # -- ownership ----------------------------------------------------------------------------
    def set_query_url(self, query_url: str | None) -> None:
        """Advertise (or withdraw) this process's query endpoint in the owner file.

        The worker calls this once its HTTP endpoint listens, so ``agentlog query``
        in another process can reach the store it cannot open itself.
        """
        eng = self._engine
        if eng.owner is None or eng.path is None:
            return
        with _REGISTRY_LOCK:
            if query_url:
                eng.owner["queryUrl"] = query_url
            else:
                eng.owner.pop("queryUrl", None)
            _write_owner(owner_file(eng.path), eng.owner)

    # -- lifecycle ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed; open_store() again", code="store_closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._own_client is not None:
                self._own_client.close()
        finally:
            _release(self._engine)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(eng: _Engine) -> None:
    with _REGISTRY_LOCK:
        eng.refs -= 1
        if eng.refs > 0:
            return
        _REGISTRY.pop(eng.key, None)
        try:
            eng.client.close()
        finally:
            if eng.path is not None and eng.owner is not None:
                p = owner_file(eng.path)
                current = _load_owner(p)
                if current is not None and current.get("pid") == os.getpid():
                    p.unlink(missing_ok=True)
            if eng.lock_fd is not None:
                os.close(eng.lock_fd)  # releases the flock: the next owner may open the directory
                eng.lock_fd = None


def _release_all_at_exit() -> None:
    with _REGISTRY_LOCK:
        for eng in list(_REGISTRY.values()):
            eng.refs = 1
            with contextlib.suppress(Exception):  # interpreter is exiting; never mask the real exit
                _release(eng)


atexit.register(_release_all_at_exit)


def _command_line() -> str:
    """What to call the owner in an error message: ``agentlog worker``, ``python -c …``."""
    argv = list(sys.argv) or ["python"]
    head = "python -c" if argv[0] == "-c" else Path(argv[0]).name or "python"
    return " ".join([head, *argv[1:]])[:200]


def _open_chdb(path: str, role: str | None) -> _Engine:
    lock_fd: int | None = None
    if path != ":memory:":
        others = [e.path for e in _REGISTRY.values() if e.path is not None and e.path != path]
        if others:
            raise StoreError(
                f"this process already has chdb directory {others[0]} open and chdb allows one directory "
                f"per process; close that store before opening {path}",
                code="store_busy",
            )
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock_fd = _take_lock(path)
        Path(path).mkdir(parents=True, exist_ok=True)
    try:
        client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    except Exception as e:  # chdb raises ProgrammingError/RuntimeError depending on the failure
        if lock_fd is not None:
            os.close(lock_fd)
        text = str(e)
        if "Cannot lock file" in text:
            raise _locked_error(path, _load_owner(owner_file(path))) from e
        if "already initialized with path" in text:
            raise StoreError(
                f"this process already has another chdb directory open (chdb allows one per process); "
                f"close it before opening {path}",
                code="store_busy",
            ) from e
        raise StoreError(f"cannot open chdb directory {path}: {' '.join(text.split())[:300]}",
                         code="store_unavailable") from e
    eng = _Engine(key=f"chdb:{path}", client=client, path=path, lock_fd=lock_fd)
    if path != ":memory:":
        eng.owner = {
            "pid": os.getpid(),
            "cmd": _command_line(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({"role": role} if role else {}),
        }
        _write_owner(owner_file(path), eng.owner)
    return eng


def _open_server(url: str) -> _Engine:
    try:
        # No session id: the worker queries and inserts concurrently, and a session serialises them.
        client = clickhouse_connect.get_client(dsn=url, autogenerate_session_id=False)
    except Exception as e:
        raise StoreError(f"cannot reach ClickHouse at {redact_url(url)}: {' '.join(str(e).split())[:300]}",
                         code="store_unavailable") from e
    return _Engine(key=f"server:{url}", client=client, path=None)


def open_store(settings_or_url: Settings | str, *, role: str | None = None) -> Store:
    """Open (or share, within this process) the store named by ``Settings.store_url`` or a URL.

    ``role`` goes into the chdb owner record when this call opens the directory (``audit-sink``:
    a long-lived worker, which another worker must not wait for).

    Raises:
        StoreError: ``store_locked`` when another live process owns the chdb directory
            (the message names it and its query endpoint), ``store_busy`` when this
            process already has a different chdb directory open, ``store_unavailable``
            when the engine or server cannot be reached, ``bad_store_url`` for an unknown scheme.
    """
    url = store_url(settings_or_url)
    path = _chdb_path(url)
    if path is None and urlsplit(url).scheme not in ("http", "https", "clickhouse", "clickhouses"):
        raise StoreError(f"unsupported store URL {redact_url(url)!r}: use chdb:///<dir> or http(s)://host:8123/db",
                         code="bad_store_url")
    key = f"chdb:{path}" if path is not None else f"server:{url}"
    with _REGISTRY_LOCK:
        eng = _REGISTRY.get(key)
        if eng is None:
            eng = _open_chdb(path, role) if path is not None else _open_server(url)
            _REGISTRY[key] = eng
        eng.refs += 1
    return Store(eng, url)
