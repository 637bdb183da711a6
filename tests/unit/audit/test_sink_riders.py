"""A batch of several partitions: which buffers ride along, and that such a batch is exactly once.

On a real store (chdb; a ClickHouse server too when configured), no broker: the choice of riders
reads only the sink's own partition state, and :meth:`AuditSink.flush` only the store.
"""

from __future__ import annotations

import asyncio

from agentlog.audit import sink as sink_module
from agentlog.audit.exactly_once import ledger_gaps, token_for
from agentlog.audit.migrations import migrate
from agentlog.audit.sink import AuditSink, Rider, _Partition
from agentlog.audit.store import open_store
from agentlog.schemas.canonical import GENESIS, chain_hash, jcs
from agentlog.streams.codec import encode_committed
from agentlog.streams.settings import Settings
from tests.unit.audit.conftest import store_url  # noqa: F401  (fixture: chdb, and a server when set)
from tests.unit.audit.records import Partition, Record


def _buffer(tp: Partition, lo: int, n: int, values: list[bytes] | None = None) -> _Partition:
    values = values if values is not None else [b"{}"] * n
    return _Partition(expected=lo + n, lo=lo, messages=[Record(tp.topic, tp.partition, lo + i, 0, v)
                                                        for i, v in enumerate(values)])


def _sink(store: object) -> AuditSink:
    return AuditSink(Settings(topic_prefix="p"), store, topics={"log": "committed", "snapshots": "snapshot"})


def test_the_other_partitions_of_the_topic_ride_along_within_a_batch(store_url, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sink_module, "BATCH_ROWS", 100)
    with open_store(store_url) as s:
        sink = _sink(s)
        log = [Partition("p.log", p) for p in range(6)]
        snap = Partition("p.snapshots", 1)
        sink._parts = {log[0]: _buffer(log[0], 0, 30), log[1]: _buffer(log[1], 5, 40), log[2]: _buffer(log[2], 0, 20),
                       log[3]: _buffer(log[3], 0, 10), log[4]: _buffer(log[4], 0, 0), log[5]: _buffer(log[5], 0, 8),
                       snap: _buffer(snap, 0, 5)}
        sink._parts[log[5]].pending = (0, 7)  # a range to re-form goes on its own
        loop = asyncio.new_event_loop()  # the batch's task is never awaited: a future of a loop that never runs
        sink._inflight = {log[3]: (loop.create_future(), 1)}  # a batch of its own in flight
        riders = sink._riders(log[0], 30, {log[0]})
        # partition order; 30 + 40 + 20 fit in 100, the empty, re-forming, busy ones and the other topic do not ride
        assert [tp for tp, _ in riders] == [log[1], log[2]]
        assert [tp for tp, _ in sink._riders(log[0], 50, {log[0]})] == [log[1]], "a buffer that would pass the cap stays"
        assert [tp for tp, _ in sink._riders(log[0], 30, {log[0], log[1]})] == [log[2]], "taken by another batch"
        assert sink._riders(log[0], 100, {log[0]}) == [], "a full batch (a backlog) goes alone"
        loop.close()


def _committed(run: str, seq: int) -> bytes:
    doc = {"eventId": f"{run}-{seq}", "runId": run, "type": "variable.changed", "sequence": seq,
           "timestamp": "2026-01-01T00:00:00.123Z", "payload": {"q": seq}}
    return encode_committed(jcs(doc), GENESIS, chain_hash(GENESIS, doc),
                            {"topic": "p.ingest", "partition": 0, "offset": seq, "timestampMs": 0}, "ab" * 32)


def test_a_batch_of_three_partitions_records_every_range_first_and_re_forms_per_partition(store_url):  # noqa: F811
    migrate(store_url)
    with open_store(store_url) as s:
        sink = _sink(s)
        tps = [Partition("p.log", p) for p in range(3)]
        values = {tp: [_committed(f"ride-{tp.partition}", q) for q in range(5 + tp.partition)] for tp in tps}
        parts = {tp: _buffer(tp, 10 * tp.partition, len(values[tp]), values[tp]) for tp in tps}
        first, *others = tps
        riders = [Rider(tp, parts[tp], parts[tp].messages, parts[tp].lo, parts[tp].messages[-1].offset) for tp in others]

        def count() -> int:
            return int(s.query("SELECT count() FROM events").rows[0][0])

        asyncio.run(sink.flush(first, parts[first].messages, lo=0, hi=4, marked=False, riders=riders))
        total = sum(len(v) for v in values.values())
        assert count() == total
        ranges = sorted(tuple(r[:4]) for r in s.query("SELECT topic, partition, lo, hi, written_at FROM sink_ranges").rows)
        assert ranges == [("p.log", 0, 0, 4), ("p.log", 1, 10, 15), ("p.log", 2, 20, 26)]
        assert s.query("SELECT uniqExact(written_at) FROM sink_ranges").rows[0][0] == 1, "one ledger insert"
        assert sink._commits == {first: 5, tps[1]: 16, tps[2]: 27}
        # after a crash each partition re-forms its own last range (no token trusted): nothing is added
        for tp in tps:
            part = parts[tp]
            asyncio.run(sink.flush(tp, part.messages, lo=part.lo, hi=part.messages[-1].offset, marked=True))
        # and the same batch once more under its token: dropped
        asyncio.run(sink.flush(first, parts[first].messages, lo=0, hi=4, marked=False, riders=riders))
        assert count() == total
        assert s.query("SELECT sum(events) FROM run_rollup").rows[0][0] == total
        assert ledger_gaps(s) == []
        assert token_for("p.log", 0, 0, 4) == "p.log/0/0-4"
