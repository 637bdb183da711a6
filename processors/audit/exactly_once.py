"""The audit sink's inserts, exactly once: the ledger of offset ranges, range tokens, the natural-key filter.

No Kafka here: :mod:`agentlog.audit.sink` reads the topics and hands over each batch with its
offset range (or ranges); this module stores it so that ``SELECT count()`` (no FINAL) equals the
records sent, whatever was killed when. After the design of ClickHouse's Kafka Connect sink
(state = offset ranges):

1. before inserting the batch ``[lo, hi]`` of a partition, the sink appends that range to
   ``sink_ranges`` (ClickHouse itself, the same store as the data; every range is kept); a batch
   of several partitions appends all its ranges in one insert (one part: all or none;
   :meth:`BlockingSink.mark_ranges`);
2. the batch is inserted with ``insert_deduplication_token = <topic>/<partition>/<lo>-<hi>``
   (the ranges joined by ``+`` for a batch of several partitions: :func:`batch_token`);
   the tables keep a deduplication window, so inserting the same range twice stores it once
   (their materialized views skip the duplicate too);
3. on (re)assignment the sink reads the last range per partition (:meth:`BlockingSink.last_ranges`),
   seeks to ``lo`` and re-forms exactly ``[lo, hi]``. It does NOT trust that range's token: ClickHouse
   writes a token to the table's deduplication log before the part carrying it is committed, so a
   SIGKILL in between leaves a token whose rows do not exist, and a re-insert with it would be
   dropped silently. The re-formed batch inserts only the rows whose natural key is missing, under
   a fresh token ``<range>/reform-<n>``, and checks afterwards that they are there (n + 1 if not).
   ClickHouse also commits the events part before it runs the rollup views, so the runs of a
   re-formed log range get their rollups repaired from ``events`` or ``transitions``
   (:mod:`agentlog.audit.rollups`). Then it carries on from ``hi + 1``.

The consumer keeps batches contiguous, so no offset can fall between two ranges; ``LEDGER_GAPS``
lists any gap between recorded ranges, and there should be none.

Records the topics hold twice (at-least-once producers) are dropped by natural key before
the insert (:meth:`BlockingSink.insert_rows`). On chdb a log batch whose every run starts above
the highest sequence that run may have stored skips that lookup (:class:`SequenceTops`: the
sink is the only writer of ``events`` there).

The log (most of the volume) goes to ClickHouse as raw records in one insert, and ClickHouse maps
them and proves each row exact against the chain hash (:meth:`BlockingSink.insert_log`,
:mod:`agentlog.audit.raw`); the dedup token, the natural-key filter and the re-form run in SQL
there. The records it cannot prove go back to the consumer, which maps them in Python
(:func:`agentlog.audit.sink.split_batch`) and inserts them under the token ``<range>/py``.

Every call blocks (chdb is in-process): the consumer makes them from a thread, one statement at a
time per staging tables.
"""

from __future__ import annotations

import base64
import collections
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from agentlog.audit import raw as raw_sql
from agentlog.audit.rollups import ROLLUP_SOURCES
from agentlog.audit.rollups import repair as repair_rollups
from agentlog.audit.rows import rows_for
from agentlog.audit.store import Store, dedup_settings
from agentlog.metrics import METRICS
from agentlog.schemas.errors import StoreError

log = logging.getLogger("agentlog.sink")

#: The natural key of each table's records (0001's ReplacingMergeTree keys): one row per key.
NATURAL_KEYS: dict[str, tuple[str, ...]] = {
    "events": ("run_id", "sequence"),
    "transitions": ("parent_run_id", "dispatch_id", "phase"),
    "violations": ("run_id", "sequence", "event_id", "code"),
    "rejections": ("source_topic", "source_partition", "source_offset"),
    "snapshots": ("run_id", "at_sequence"),
    "replay_verdicts": ("source_run_id", "replay_run_id", "record_hash"),
    "checkpoints": ("run_id", "sequence", "key_id"),
}


#: One lock per (store, staging tables): sinks sharing the staging tables of a store take turns.
_STAGE_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_STAGE_LOCKS_LOCK = threading.Lock()
#: The (store, staging tables) known empty: emptied after the last batch in this process (read and
#: changed under the stage's lock only).
_EMPTY_STAGES: set[tuple[str, str]] = set()


def _stage_lock(url: str, name: str) -> threading.Lock:
    with _STAGE_LOCKS_LOCK:
        return _STAGE_LOCKS.setdefault((url, name), threading.Lock())


class SequenceTops:
    """Per run, an upper bound of the highest ``sequence`` stored in ``events``: which batches need no key lookup.

    The natural-key filter (``NOT IN`` the stored keys) costs a third of the ``events`` insert. A key
    can be stored already only if its sequence is at most the highest one stored for its run. So a
    batch in which every run starts above its bound cannot repeat a stored key, and goes in without
    the lookup (still once per key within the batch, still under its range token). The log holds
    each run's records in sequence order, so that is every batch but the few that carry a
    redelivery or an at-least-once repeat (and every re-form, which filters regardless).

    Sound while the bound is never below what is stored:

    * a run is looked up in ``events`` the first time a batch holds it (:meth:`BlockingSink.insert_log`),
      so rows a previous process stored (past the ledger or not) are counted;
    * every insert into ``events`` by a sink raises its runs' bounds to the batch's highest sequence
      *before* it runs (:meth:`claim`), whether it then lands, fails or is dropped — too high only
      filters more;
    * nothing else writes ``events``: on chdb one process owns the directory (its flock) and only
      the sink inserts into ``events`` there. The bounds are shared by every sink of the process on
      one engine (:func:`_tops_for`), so a zombie sink's batch raises them too. On a ClickHouse
      server other processes' sinks write ``events`` unseen, so there the filter stays on every
      batch (``tops`` is None).

    At most ``cap`` runs are kept (least recently claimed dropped first); a run dropped is looked up
    again when it next appears. The runs a sink sees again are the runs in flight, so the cap is a
    few times as many as a worker has (~250 bytes a run): a finished run ages out instead of staying.
    """

    def __init__(self, cap: int = 20_000) -> None:
        self._tops: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._cap = cap
        self._lock = threading.Lock()

    def unknown(self, runs: Sequence[str]) -> list[str]:
        """The runs with no bound yet (to look up in ``events``)."""
        with self._lock:
            return [r for r in runs if r not in self._tops]

    def learn(self, runs: Sequence[str], stored: dict[str, int]) -> None:
        """Record what ``events`` holds for ``runs`` (a run absent from ``stored`` has no row: -1)."""
        with self._lock:
            for r in runs:
                top = max(self._tops.get(r, -1), stored.get(r, -1))
                self._tops[r] = top
                self._tops.move_to_end(r)
            while len(self._tops) > self._cap:
                self._tops.popitem(last=False)

    def claim(self, spans: dict[str, tuple[int, int]]) -> bool:
        """Raise each run's bound to its span's end; True if every span started above the bound before.

        A run with no bound (never looked up, or dropped) makes the answer False.
        """
        with self._lock:
            clear = all(lo > self._tops.get(r, 1 << 63) for r, (lo, _hi) in spans.items())
            for r, (_lo, hi) in spans.items():
                self._tops[r] = max(self._tops.get(r, -1), hi)
                self._tops.move_to_end(r)
            while len(self._tops) > self._cap:
                self._tops.popitem(last=False)
            return clear


#: One :class:`SequenceTops` per chdb engine, shared by the process's sinks (and their lanes) on it.
_TOPS: weakref.WeakKeyDictionary[Any, SequenceTops] = weakref.WeakKeyDictionary()


def _tops_for(store: Store) -> SequenceTops | None:
    """The bounds of ``store``'s engine; None on a server (other processes write there: see :class:`SequenceTops`)."""
    if store.backend != "chdb":
        return None
    with _STAGE_LOCKS_LOCK:
        tops = _TOPS.get(store.engine)
        if tops is None:
            tops = _TOPS[store.engine] = SequenceTops()
        return tops


def stage_name(worker_id: str, *, shared: bool = False) -> str:
    """The staging tables' suffix for a sink: its worker id as an identifier.

    On chdb one process owns the directory, so the name is stable (a SIGKILLed sink leaves no
    orphan). On a server (``shared=True``) many sinks meet, possibly under one worker id, and two
    sinks sharing a stage would insert each other's rows under their tokens: a random part makes
    it theirs alone. :meth:`BlockingSink.drop_staging` removes them at a clean stop; a SIGKILLed
    sink leaves two Memory tables holding at most one batch (``sink_land_*``/``sink_stage_*``).
    """
    name = "".join(c if c.isalnum() else "_" for c in worker_id)[:60] or "sink"
    return f"{name}_{uuid.uuid4().hex[:12]}" if shared else name


class BlockingSink:
    """Serialises statements on one store from the event loop (chdb is in-process and blocking).

    ``stage`` names this sink's two Memory tables for the log's fast path
    (``sink_land_<stage>``, ``sink_stage_<stage>``; :meth:`insert_log`).
    """

    def __init__(self, store: Store, *, stage: str = "sink") -> None:
        self.store = store
        self.land, self.stage = f"sink_land_{stage}", f"sink_stage_{stage}"
        self._lock = _stage_lock(store.url, stage)
        self._stage_key = (store.url, stage)
        self._staging_ready = False
        #: which batches may skip the stored-key lookup (None: every batch looks up)
        self.tops = _tops_for(store)

    def insert_records(self, kind: str, records: list[dict[str, Any]], token: str, *, reform: bool = False) -> int:
        """Map ``records`` and :meth:`insert_rows` them."""
        return self.insert_rows(*rows_for(kind, records), token, reform=reform)

    def insert_rows(self, table: str, names: tuple[str, ...], cols: list[list[Any]], token: str, *,
                    reform: bool = False) -> int:
        """Insert the rows whose natural key is not stored yet, with ``token``; returns rows inserted.

        The log and the other output topics are written at least once (a producer retry or a
        processor crash re-emits a record at a new offset), so one natural key can occur at two
        offsets. Those copies are dropped here, by key, against the table and within the batch.
        Sound with the token because one insert is one part: it either all landed or none did.

        ``reform=True`` is a batch re-formed after a crash or a rebalance. Its token may be in the
        table's deduplication log without its part (a SIGKILL between ClickHouse writing the token
        and committing the part), so the missing rows go in under ``<token>/reform-<n>`` and are
        looked up again afterwards; n grows until they are there. n is not random so that two
        sinks re-forming the same range at once (a zombie owner) still deduplicate each other.
        """
        with self._lock:
            if table == "events" and self.tops is not None and cols:
                self.tops.claim(_spans(cols[names.index("run_id")], cols[names.index("sequence")]))
            missing = self._missing(table, names, cols)
            if not reform:
                if not missing:
                    return 0
                return self.store.insert(table, missing, names, column_oriented=True, dedup_token=token)
            inserted = self._reinsert(table, names, missing, token)
            if table in ROLLUP_SOURCES:
                self._repair_rollups(table, cols[names.index(ROLLUP_SOURCES[table])], token)
            return inserted

    def insert_log(self, values: list[bytes], token: str, *, reform: bool = False) -> tuple[int, list[bytes]]:
        """Insert raw log records (CommittedEvent JCS bytes) letting ClickHouse map and prove them.

        Returns (proven rows, values ClickHouse could not prove): the caller maps the latter in
        Python (:func:`agentlog.audit.sink.split_batch`). Same guarantees as :meth:`insert_rows` — the natural-key
        filter against the table and within the batch, ``token`` on the insert that writes the
        rows, a re-form inserting only missing keys under ``<token>/reform-<n>`` and repairing the
        rollups — done in SQL over a staged copy of the batch (:mod:`agentlog.audit.raw`).
        The staging tables are emptied again before this returns.

        Raises:
            StoreError: ``sink_stage_mismatch`` if ClickHouse staged another number of records than
                it was sent (the caller then maps the whole batch in Python).
        """
        data = b"\n".join(values)
        with self._lock:
            self._prepare_staging()
            try:
                self.store.insert_raw(self.land, "raw", data, "LineAsString")
                self.store.command(raw_sql.stage_sql(self.land, self.stage))
                proven, staged, clear = self._claim_staged()
                if staged != len(values):
                    raise StoreError(f"{token}: ClickHouse staged {staged} log records of {len(values)}",
                                     code="sink_stage_mismatch")
                unproven = ([base64.b64decode(r[0]) for r in self.store.query(raw_sql.unproven_sql(self.stage)).rows]
                            if proven < staged else [])
                if not reform:
                    if proven:
                        # no count of the missing first: the insert filters them itself, and an
                        # insert that selects no row writes no part (and leaves no token)
                        self._insert_staged(token, filtered=not clear)
                else:
                    missing = self._staged_counts()[0]
                    if missing:
                        self._until_stored("events", token, self._insert_staged, lambda: self._staged_counts()[0])
                    runs = [r[0] for r in self.store.query(raw_sql.runs_sql(self.stage)).rows]
                    self._repair_rollups("events", runs, token)
                return proven, unproven
            finally:
                self._empty_staging()

    def _claim_staged(self) -> tuple[int, int, bool]:
        """(proven rows, staged rows, whether no proven key can be stored already) of the staged batch.

        Claims the batch's runs in :attr:`tops` (looking up the runs it has not seen in ``events``)
        before anything of it is inserted; see :class:`SequenceTops`.
        """
        rows = self.store.query(raw_sql.spans_sql(self.stage)).rows
        proven, staged = sum(int(r[3]) for r in rows), sum(int(r[4]) for r in rows)
        if self.tops is None or not proven:
            return proven, staged, False
        spans = {str(r[0]): (int(r[1]), int(r[2])) for r in rows if r[3]}
        unknown = self.tops.unknown(list(spans))
        if unknown:
            found = self.store.query(raw_sql.tops_sql(), {"runs": unknown}).rows
            self.tops.learn(unknown, {str(r): int(q) for r, q in found})
        return proven, staged, self.tops.claim(spans)

    def _prepare_staging(self) -> None:
        if not self._staging_ready:
            self.store.command(raw_sql.land_ddl(self.land))
            self.store.command(raw_sql.stage_ddl(self.stage))
            self._staging_ready = True
        if self._stage_key not in _EMPTY_STAGES:
            # a crash can leave a batch in them (chdb keeps no Memory rows, a server does), and so
            # can a batch whose emptying failed; after a batch that emptied them, two statements saved
            self._empty_staging()
        _EMPTY_STAGES.discard(self._stage_key)

    def _empty_staging(self) -> None:
        self.store.command(f"TRUNCATE TABLE {self.land}")
        self.store.command(f"TRUNCATE TABLE {self.stage}")
        _EMPTY_STAGES.add(self._stage_key)

    def close(self) -> None:
        """Close the store connection once the statement running on it is done (a cancelled batch's
        thread runs on until its statement returns)."""
        with self._lock:
            self.store.close()

    def drop_staging(self) -> None:
        """Drop this sink's staging tables (a server sink's are its own: see :func:`stage_name`)."""
        with self._lock:
            for table in (self.land, self.stage):
                self.store.command(f"DROP TABLE IF EXISTS {table}")
            self._staging_ready = False
            _EMPTY_STAGES.discard(self._stage_key)

    def _staged_counts(self) -> tuple[int, int, int]:
        missing, proven, staged = self.store.query(raw_sql.missing_sql(self.stage)).rows[0]
        return int(missing), int(proven), int(staged)

    def _insert_staged(self, token: str, *, filtered: bool = True) -> None:
        self.store.command(raw_sql.insert_sql(self.stage, filtered=filtered, settings=dedup_settings(token)))

    def _reinsert(self, table: str, names: tuple[str, ...], cols: list[list[Any]], token: str) -> int:
        """Insert the missing rows of a re-formed batch under fresh tokens until they are stored."""
        if not cols:
            return 0
        n = len(cols[0])
        pending = cols

        def insert(attempt_token: str) -> None:
            self.store.insert(table, pending, names, column_oriented=True, dedup_token=attempt_token)

        def missing() -> int:
            nonlocal pending
            pending = self._missing(table, names, pending)
            return len(pending[0]) if pending else 0

        self._until_stored(table, token, insert, missing)
        return n

    @staticmethod
    def _until_stored(table: str, token: str, insert: Callable[[str], None], missing: Callable[[], int]) -> None:
        """``insert(<token>/reform-<n>)`` for n = 1, 2, … until ``missing()`` rows are none (a re-form).

        A fresh token each time: ClickHouse can hold a token whose part never landed (module
        docstring), and a re-insert under it would be dropped silently.

        Raises:
            StoreError: ``sink_stuck`` after 1000 attempts.
        """
        for attempt in range(1, 1001):
            insert(f"{token}/reform-{attempt}")
            left = missing()
            if not left:
                return
            METRICS.inc("agentlog_sink_dropped_tokens_total", table=table)
            log.warning("%s: insert with token %s/reform-%d was dropped as a duplicate but %d rows are "
                        "missing; retrying with the next token", table, token, attempt, left)
        raise StoreError(f"{table}: rows of {token} still missing after 1000 re-inserts", code="sink_stuck")

    def _repair_rollups(self, table: str, run_ids: list[Any], token: str) -> None:
        """The crash may have come after the table's part and before its views ran: see agentlog.audit.rollups."""
        short = repair_rollups(self.store, [str(r) for r in run_ids], source=table)
        for rollup, runs in short.items():
            METRICS.inc("agentlog_sink_rollups_repaired_total", runs, table=rollup)
            log.warning("%s was short for %d runs of %s (a crash between the %s part and the views); "
                        "repaired from %s", rollup, runs, token, table, table)

    def _missing(self, table: str, names: tuple[str, ...], cols: list[list[Any]]) -> list[list[Any]]:
        """The columns restricted to rows whose natural key is stored neither in ``table`` nor earlier in the batch."""
        keep = self._new_rows(table, names, cols)
        if not keep:
            return []
        return cols if len(keep) == len(cols[0]) else [[col[i] for i in keep] for col in cols]

    def _new_rows(self, table: str, names: tuple[str, ...], cols: list[list[Any]]) -> list[int]:
        key_cols = NATURAL_KEYS[table]
        idx = [names.index(k) for k in key_cols]
        keys = list(zip(*(cols[i] for i in idx), strict=True))
        first = sorted({k[0] for k in keys})
        where = f"{key_cols[0]} IN {{first:Array(String)}}"
        params: dict[str, Any] = {"first": first}
        second = [k[1] for k in keys]
        if len(key_cols) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in second):
            # Bounded by the batch, not by history: the whole batch's range prunes granules by the
            # sort key, and each key's own range (a hash lookup, transform) keeps the rows returned
            # to those the batch could repeat, wherever each run's sequence stands.
            lows: dict[Any, int] = {}
            highs: dict[Any, int] = {}
            for k in keys:
                if k[1] < lows.get(k[0], k[1] + 1):
                    lows[k[0]] = k[1]
                if k[1] > highs.get(k[0], k[1] - 1):
                    highs[k[0]] = k[1]
            c0, c1 = key_cols[0], key_cols[1]
            where += (f" AND {c1} BETWEEN {{lo:Int64}} AND {{hi:Int64}}"
                      f" AND {c1} BETWEEN transform({c0}, {{first:Array(String)}}, {{lows:Array(Int64)}}, toInt64(0))"
                      f" AND transform({c0}, {{first:Array(String)}}, {{highs:Array(Int64)}}, toInt64(-1))")
            params.update(lo=min(second), hi=max(second),
                          lows=[lows[r] for r in first], highs=[highs[r] for r in first])
        stored = {tuple(r) for r in self.store.query(
            f"SELECT {', '.join(key_cols)} FROM {table} WHERE {where}", params).rows}
        keep: list[int] = []
        for i, k in enumerate(keys):
            if k not in stored:
                stored.add(k)
                keep.append(i)
        return keep

    def mark(self, topic: str, partition: int, lo: int, hi: int) -> None:
        """Append ``[lo, hi]`` to the ledger (before its rows are inserted)."""
        self.mark_ranges([(topic, partition, lo, hi)])

    def mark_ranges(self, ranges: Sequence[tuple[str, int, int, int]]) -> None:
        """Append the ranges of one batch to the ledger in one insert: one part, so all of them or none."""
        with self._lock:
            self.store.insert("sink_ranges", [list(r) for r in ranges], ["topic", "partition", "lo", "hi"])

    def last_range(self, topic: str, partition: int) -> tuple[int, int] | None:
        """The newest range of the partition: the batch a crash may have left half-written.

        0002's ``sink_offsets`` is read too, so a store upgraded mid-stream resumes where it was.
        """
        return self.last_ranges([(topic, partition)]).get((topic, partition))

    def last_ranges(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """:meth:`last_range` of many partitions in one query (an assignment's): those with none are absent."""
        wanted = set(partitions)
        if not wanted:
            return {}
        with self._lock:
            rows = self.store.query(
                "SELECT topic, partition, argMax(lo, hi), max(hi) FROM ("
                " SELECT topic, partition, lo, hi FROM sink_ranges"
                " WHERE topic IN {t:Array(String)} AND partition IN {p:Array(Int32)}"
                " UNION ALL"
                " SELECT topic, partition, lo, hi FROM sink_offsets"
                " WHERE topic IN {t:Array(String)} AND partition IN {p:Array(Int32)})"
                " GROUP BY topic, partition",
                {"t": sorted({t for t, _ in wanted}), "p": sorted({p for _, p in wanted})}).rows
        return {(str(t), int(p)): (int(lo), int(hi)) for t, p, lo, hi in rows if (str(t), int(p)) in wanted}


#: Gaps in the ledger: a range starting past every earlier range's end + 1 in its partition.
#: Batches are contiguous by construction (see :mod:`agentlog.audit.sink`), so this must return nothing.
LEDGER_GAPS = """
SELECT topic, partition, prev_hi + 1 AS missing_from, lo - 1 AS missing_to
FROM (
    SELECT topic, partition, lo,
           max(hi) OVER (PARTITION BY topic, partition ORDER BY lo, hi
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi,
           row_number() OVER (PARTITION BY topic, partition ORDER BY lo, hi) AS n
    FROM sink_ranges
)
WHERE n > 1 AND lo > prev_hi + 1
ORDER BY topic, partition, lo
"""


def ledger_gaps(store: Store) -> list[tuple[str, int, int, int]]:
    """``(topic, partition, missing_from, missing_to)`` for every gap between recorded ranges."""
    return [(str(t), int(p), int(a), int(b)) for t, p, a, b in store.query(LEDGER_GAPS).rows]


def _spans(runs: Sequence[Any], sequences: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """Per run, (lowest, highest) sequence among the rows."""
    spans: dict[str, tuple[int, int]] = {}
    for r, q in zip(runs, sequences, strict=True):
        lo, hi = spans.get(r, (q, q))
        spans[r] = (min(lo, q), max(hi, q))
    return spans


def token_for(topic: str, partition: int, lo: int, hi: int) -> str:
    """The insert deduplication token of a batch: its offset range, nothing else."""
    return f"{topic}/{partition}/{lo}-{hi}"


def batch_token(ranges: Sequence[tuple[str, int, int, int]]) -> str:
    """The insert deduplication token of a batch: :func:`token_for` of each of its ranges, joined by ``+``."""
    return "+".join(token_for(*r) for r in ranges)
