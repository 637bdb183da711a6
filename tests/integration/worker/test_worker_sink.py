"""The whole worker with its audit sink: log → ClickHouse (chdb owned by the worker), queries
answered by the worker's HTTP endpoint, Prometheus metrics at /metrics.

The CLI runs in a separate process, as a user's would: it cannot open the chdb
directory the worker owns, so it must find the worker through the owner file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
import uuid

import pytest

from agentlog.audit import sink as audit_sink
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, free_port
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _tune_sink(monkeypatch, *, rows: int, flush_s: float, lanes: int | None = None) -> None:
    """Small batches and a short (or long) flush, so a few records exercise what a load would."""
    monkeypatch.setattr(audit_sink, "BATCH_ROWS", rows)
    monkeypatch.setattr(audit_sink, "FLUSH_S", flush_s)
    if lanes is not None:
        monkeypatch.setattr(audit_sink, "LANES", lanes)


def test_sink_fills_clickhouse_and_the_worker_answers_queries(settings):
    settings = settings.replace(web_port=free_port())
    asyncio.run(ensure_topics(settings))
    run_id = f"sink-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    worker = WorkerProcess(settings, sink=True, web=True).start()
    try:
        async def scenario():
            from agentlog.audit.store import read_owner

            async def owned():
                owner = read_owner(settings)
                return owner if owner and owner.get("queryUrl") else None

            await wait_until(owned, timeout=120, what="the worker to own the store", worker=worker)
            summary = await publish_docs(settings, docs, wire="avro")
            assert summary.accepted == len(docs)

            async def timeline():
                done = agentlog_cli(settings, "query", "run-timeline", "--param", f"run_id={run_id}", "--json")
                if done.returncode != 0:
                    return None
                rows = json.loads(done.stdout)["rows"]
                return rows if len(rows) == len(docs) else None

            rows = await wait_until(timeline, timeout=180, interval=2, what="run-timeline via the worker",
                                    worker=worker)
            columns = json.loads(agentlog_cli(settings, "query", "run-timeline", "--param", f"run_id={run_id}",
                                      "--json").stdout)["columns"]
            seq_col, type_col = columns.index("sequence"), columns.index("type")
            assert [r[seq_col] for r in rows] == list(range(len(docs)))
            assert [r[type_col] for r in rows] == [d["type"] for d in docs]

            refused = agentlog_cli(settings, "sql", "DROP TABLE events")
            assert refused.returncode == 2 and "read_only" in refused.stderr

            with urllib.request.urlopen(f"http://127.0.0.1:{settings.web_port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            accepted = [line for line in text.splitlines() if line.startswith("agentlog_events_accepted_total")]
            assert accepted and float(accepted[0].split()[-1]) >= len(docs)
            assert "agentlog_sink_rows_total{table=\"log\"}" in text

        asyncio.run(scenario())
    finally:
        worker.stop()


# -- the sink alone: real Kafka, real chdb, crashes at the two points that matter -----------------

class _Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so the sink's retry loop does not catch it."""


def _crashing_sink(settings, store, *, after_batches: int, mode: str):
    from agentlog.audit.sink import AuditSink

    class Crashing(AuditSink):
        done = 0

        async def flush(self, tp, messages, *, lo, hi, marked, **lane):
            if Crashing.done == after_batches:
                if mode == "before_insert":  # range recorded, rows not inserted
                    self.sink.mark(tp.topic, tp.partition, lo, hi)
                    raise _Killed
                await super().flush(tp, messages, lo=lo, hi=hi, marked=marked, **lane)  # rows in, killed before the next batch
                raise _Killed
            Crashing.done += 1
            await super().flush(tp, messages, lo=lo, hi=hi, marked=marked, **lane)

    return Crashing(settings, store)


async def _produce(settings, short: str, values: list[bytes], keys: list[str]) -> None:
    from aiokafka import AIOKafkaProducer

    from agentlog.streams.topics import topic_name

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for k, v in zip(keys, values, strict=True):
            await producer.send(topic_name(settings, short), v, key=k.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def _run_until(sink, predicate, timeout: float = 120.0) -> None:
    task = asyncio.ensure_future(sink.run())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if task.done():
                task.result()  # re-raise the crash
            assert asyncio.get_running_loop().time() < deadline, "the sink did not get there in time"
            await asyncio.sleep(0.2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, _Killed):
            await task


@pytest.mark.parametrize("mode", ["before_insert", "after_insert"])
def test_sink_is_exactly_once_across_crashes(settings, mode, monkeypatch):
    from agentlog.audit.migrations import migrate
    from agentlog.audit.store import open_store
    from agentlog.streams.codec import encode_record
    from tests.unit.audit.data import audit_batches

    _tune_sink(monkeypatch, rows=7, flush_s=0.2)
    asyncio.run(ensure_topics(settings))
    committed = audit_batches()["committed"]
    verdicts = audit_batches()["verdict"]
    bad = [b"not json at all", encode_record({"no": "doc"})]  # must land in rejections, not vanish

    async def scenario():
        # the log holds some records twice, as after a producer retry: stored once all the same
        copies = committed[3:9]
        await _produce(settings, "log", [encode_record(r) for r in committed + copies] + bad,
                       [r["doc"]["runId"] for r in committed + copies] + ["x", "x"])
        await _produce(settings, "verdicts", [encode_record(v) for v in verdicts],
                       [v["sourceRunId"] for v in verdicts])
        with open_store(settings) as store:
            migrate(store)

            def count(table: str) -> int:
                return store.query(f"SELECT count() FROM {table}").rows[0][0]

            crashed = _crashing_sink(settings, store, after_batches=2, mode=mode)
            with pytest.raises(_Killed):
                await _run_until(crashed, lambda: False)
            assert count("events") < len(committed)  # it did crash mid-way
            from agentlog.audit.sink import AuditSink

            await _run_until(AuditSink(settings, store),
                             lambda: count("events") >= len(committed) and count("replay_verdicts") >= len(verdicts)
                             and count("rejections") >= len(bad))
            # and once more from scratch: a second sink process re-forms its last ranges, adds nothing
            await _run_until(AuditSink(settings, store), lambda: True)
            await asyncio.sleep(1.0)
            assert count("events") == len(committed)  # plain count(), no FINAL
            assert count("replay_verdicts") == len(verdicts)
            assert count("rejections") == len(bad)
            reasons = sorted(r[0] for r in store.query("SELECT reason FROM rejections").rows)
            assert reasons == ["sink_undecodable", "sink_unmappable"]
            dup = store.query("SELECT run_id, sequence FROM events GROUP BY run_id, sequence HAVING count() > 1")
            assert dup.rows == []
            usage = sum(1 for r in committed if r["doc"]["type"] == "provider.usage")
            assert store.query("SELECT sum(calls) FROM usage_hourly").rows[0][0] == usage
            assert store.query("SELECT sum(events) FROM run_rollup").rows[0][0] == len(committed)

    asyncio.run(scenario())


# -- the sink sees an offset gap: it must seek back and heal it, not skip the records -------------

def _gapping_sink(settings, store, *, how: str):
    """A sink that is shown a gap once: a fetch missing its first records, or a seek forward behind its back."""
    from agentlog.audit.sink import AuditSink

    class Gapping(AuditSink):
        gapped = False

        async def _take(self, tp, messages):
            # (records fetched while the rebalance listener still runs arrive with no partition state: the
            # sink drops them and re-reads after its seek, so the gap is shown to an assigned partition)
            if Gapping.gapped or len(messages) < 3 or self._parts.get(tp) is None:
                return await super()._take(tp, messages)
            Gapping.gapped = True
            if how == "stale_fetch":  # a fetch that starts past the expected offset (a re-seek racing it)
                return await super()._take(tp, messages[2:])
            await super()._take(tp, messages[:2])  # then the position jumps forward, as a stray seek would
            assert self.consumer is not None
            self.consumer.seek(tp, messages[0].offset + 8)
            return None

    return Gapping(settings, store)


@pytest.mark.parametrize("how", ["stale_fetch", "seek_forward"])
def test_sink_heals_an_offset_gap_with_zero_loss(settings, how, monkeypatch):
    from agentlog.audit.exactly_once import ledger_gaps
    from agentlog.audit.migrations import migrate
    from agentlog.audit.store import open_store
    from agentlog.metrics import METRICS
    from agentlog.streams.codec import encode_record
    from agentlog.streams.topics import topic_name
    from tests.unit.audit.data import audit_batches

    _tune_sink(monkeypatch, rows=4, flush_s=0.2)
    asyncio.run(ensure_topics(settings))
    committed = audit_batches()["committed"]
    one_run = [r for r in committed if r["doc"]["runId"] == committed[0]["doc"]["runId"]]
    assert len(one_run) >= 12  # one key: one partition, so the gap lands inside a run of records

    async def scenario():
        await _produce(settings, "log", [encode_record(r) for r in one_run], [r["doc"]["runId"] for r in one_run])
        with open_store(settings) as store:
            migrate(store)
            reseeks = METRICS.total("agentlog_sink_reseeks_total")
            await _run_until(_gapping_sink(settings, store, how=how),
                             lambda: store.query("SELECT count() FROM events").rows[0][0] >= len(one_run))
            await asyncio.sleep(0.5)
            assert store.query("SELECT count() FROM events").rows[0][0] == len(one_run)
            got = [r[0] for r in store.query("SELECT sequence FROM events ORDER BY sequence").rows]
            assert got == sorted(r["doc"]["sequence"] for r in one_run)
            assert METRICS.total("agentlog_sink_reseeks_total") > reseeks  # the defence fired
            assert ledger_gaps(store) == []
            ranges = store.query("SELECT partition, min(lo), max(hi) FROM sink_ranges "
                                 "WHERE topic = {t:String} GROUP BY partition", {"t": topic_name(settings, "log")})
            assert [(lo, hi) for _, lo, hi in ranges.rows] == [(0, len(one_run) - 1)]

    asyncio.run(scenario())


# -- a batch fails while the next is already fetched: nothing lost, nothing twice -----------------

class _Glitch(Exception):
    """An error the sink's store retries do not cover (they catch store calls; this escapes the batch)."""


def _failing_sink(settings, store, *, mode: str):
    """A sink whose second batch fails once, after the loop fetched and buffered the records behind it.

    ``retried_after_insert``: the store call raises after the batch's rows landed, so the sink's retry
    must re-form it (a retry under the same token would be dropped as a duplicate, rollups included).
    ``resumed_before_insert`` / ``resumed_after_insert``: the batch itself fails after its range was
    recorded / after its rows landed, so the sink must drop what it fetched ahead and resume the
    partition from the ledger.
    """
    from agentlog.audit.exactly_once import BlockingSink
    from agentlog.audit.sink import AuditSink
    from agentlog.schemas.errors import StoreError

    class Flaky(BlockingSink):
        calls = 0

        def insert_log(self, values, token, *, reform=False):
            out = super().insert_log(values, token, reform=reform)
            Flaky.calls += 1
            if Flaky.calls == 2:
                raise StoreError("injected after the rows landed")
            return out

    class Failing(AuditSink):
        batches = 0
        ahead = 0

        async def flush(self, tp, messages, *, lo, hi, marked, **lane):
            if marked or mode == "retried_after_insert" or Failing.batches != 1:
                Failing.batches += 0 if marked else 1
                return await super().flush(tp, messages, lo=lo, hi=hi, marked=marked, **lane)
            Failing.batches += 1
            if mode == "resumed_before_insert":
                self.sink.mark(tp.topic, tp.partition, lo, hi)
            else:
                await super().flush(tp, messages, lo=lo, hi=hi, marked=marked, **lane)
            for _ in range(200):  # the loop goes on fetching while this batch is in flight
                part = self._parts.get(tp)
                if part is not None and part.messages:
                    Failing.ahead = len(part.messages)
                    break
                await asyncio.sleep(0.05)
            raise _Glitch(f"injected into {lo}-{hi}")

    sink = Failing(settings, store)
    if mode == "retried_after_insert":
        flaky = Flaky(store, stage="flaky")
        sink.sink = flaky
    return sink, Failing, Flaky


@pytest.mark.parametrize("mode", ["retried_after_insert", "resumed_before_insert", "resumed_after_insert"])
def test_a_failed_batch_while_the_next_was_fetched_loses_and_duplicates_nothing(settings, mode, monkeypatch):
    from agentlog.audit.exactly_once import ledger_gaps
    from agentlog.audit.migrations import migrate
    from agentlog.audit.store import open_store
    from agentlog.metrics import METRICS
    from agentlog.streams.codec import encode_record
    from tests.unit.audit.data import audit_batches

    _tune_sink(monkeypatch, rows=4, flush_s=0.2)
    asyncio.run(ensure_topics(settings))
    committed = audit_batches()["committed"]
    one_run = [r for r in committed if r["doc"]["runId"] == committed[0]["doc"]["runId"]]
    assert len(one_run) >= 12  # one key, one partition: batches 0-3, 4-7 (fails), 8-11 …

    async def scenario():
        await _produce(settings, "log", [encode_record(r) for r in one_run], [r["doc"]["runId"] for r in one_run])
        with open_store(settings) as store:
            migrate(store)
            errors = METRICS.total("agentlog_sink_errors_total")
            sink, failing, flaky = _failing_sink(settings, store, mode=mode)

            def count() -> int:
                return store.query("SELECT count() FROM events").rows[0][0]

            await _run_until(sink, lambda: count() >= len(one_run) and failing.batches >= 3)
            await asyncio.sleep(1.0)  # anything stored twice would land by now
            assert count() == len(one_run)  # plain count(), no FINAL
            got = [r[0] for r in store.query("SELECT sequence FROM events ORDER BY sequence").rows]
            assert got == sorted(r["doc"]["sequence"] for r in one_run)
            assert ledger_gaps(store) == []
            assert store.query("SELECT sum(events) FROM run_rollup").rows[0][0] == len(one_run)
            usage = sum(1 for r in one_run if r["doc"]["type"] == "provider.usage")
            assert (store.query("SELECT sum(calls) FROM usage_hourly").rows[0][0] or 0) == usage
            assert METRICS.total("agentlog_sink_errors_total") > errors  # the failure did happen
            if mode == "retried_after_insert":
                assert flaky.calls >= 3
            else:
                assert failing.ahead > 0  # … while the records after it were already fetched

    asyncio.run(scenario())


# -- two lanes: batches of different partitions stored at once ------------------------------------

def test_two_lanes_store_two_partitions_at_once_exactly_once(settings, monkeypatch):
    """With two lanes (``LANES``) two partitions' batches are stored at the same time (each on its own
    connection and staging tables), a partition never has two at once, and the log's at-least-once
    repeats are still stored once: count() without FINAL, no ledger gap, exact rollups."""
    from agentlog.audit.exactly_once import ledger_gaps
    from agentlog.audit.migrations import migrate
    from agentlog.audit.sink import AuditSink
    from agentlog.audit.store import open_store
    from agentlog.streams.codec import encode_record
    from tests.bench.bench_sink import _committed

    _tune_sink(monkeypatch, rows=60, flush_s=0.2, lanes=2)
    settings = settings.replace(partitions=4)
    asyncio.run(ensure_topics(settings))
    records = _committed(3000)
    repeats = records[1000:1040] + records[2500:2510]  # a producer retry re-sends them later

    class Watching(AuditSink):
        now: dict[object, int] = {}
        peak = 0
        lanes: set[int] = set()

        async def flush(self, tp, messages, **kw):
            Watching.now[tp] = Watching.now.get(tp, 0) + 1
            assert Watching.now[tp] == 1, "two batches of one partition at once"
            Watching.peak = max(Watching.peak, sum(Watching.now.values()))
            Watching.lanes.add(kw.get("lane", 0))
            try:
                await super().flush(tp, messages, **kw)
            finally:
                Watching.now[tp] -= 1

    async def scenario():
        await _produce(settings, "log", [encode_record(r) for r in records + repeats],
                       [r["doc"]["runId"] for r in records + repeats])
        with open_store(settings) as store:
            migrate(store)

            def count() -> int:
                return store.query("SELECT count() FROM events").rows[0][0]

            sink = Watching(settings, store, topics={"log": "committed"})
            rows = sink.sinks  # lanes open inside run() and close when it ends

            def ranged() -> int:  # offsets the ledger covers (every partition starts at 0)
                return sum(int(r[0]) for r in store.query("SELECT max(hi) + 1 FROM sink_ranges GROUP BY partition").rows)

            await _run_until(sink, lambda: count() >= len(records) and ranged() >= len(records) + len(repeats))
            await asyncio.sleep(1.0)
            assert count() == len(records)  # plain count(), no FINAL
            assert store.query("SELECT count() FROM (SELECT run_id, sequence FROM events "
                               "GROUP BY run_id, sequence HAVING count() > 1)").rows[0][0] == 0
            assert ledger_gaps(store) == []
            assert store.query("SELECT sum(events) FROM run_rollup").rows[0][0] == len(records)
            assert Watching.peak == 2 and Watching.lanes == {0, 1}
            assert len(rows) == 1, "the lanes' connections are closed when the sink stops"

    asyncio.run(scenario())


# -- scheduling: a busy lane does not stop the fetch, and the longest partition goes first -------

def test_a_busy_lane_lets_the_fetch_go_on_and_the_largest_backlog_is_stored_next(settings, monkeypatch):
    """While every lane is busy the sink keeps fetching (the buffers fill to the end of every
    partition instead of the loop waiting for the lane), and the lane that frees takes the partition
    with the most rows left, all its buffer in one batch (up to 3 x ``BATCH_ROWS``). Exactly once throughout."""
    from agentlog.audit.exactly_once import ledger_gaps
    from agentlog.audit.migrations import migrate
    from agentlog.audit.sink import AuditSink
    from agentlog.audit.store import open_store
    from agentlog.streams.codec import encode_record
    from agentlog.streams.topics import topic_name
    from tests.bench.bench_sink import RUNS, _committed

    # 270 records: with one lane the sink buffers up to (1 + 2) x 100 (the memory bound), so all of them
    _tune_sink(monkeypatch, rows=100, flush_s=30.0, lanes=1)
    settings = settings.replace(partitions=3)
    asyncio.run(ensure_topics(settings))
    records = _committed(270)
    sizes = {0: range(0, 15), 1: range(15, 71), 2: range(71, RUNS)}  # ~40, ~150, ~80 records
    where = {f"sink-run-{r}": p for p, runs in sizes.items() for r in runs}
    total = len(records)

    class Held(AuditSink):
        batches: list[tuple[int, int]] = []
        at_release: dict[int, int] = {}
        fetched_while_busy = False

        async def flush(self, tp, messages, **kw):
            Held.batches.append((tp.partition, len(messages)))
            carried = len(messages) + sum(len(rider.messages) for rider in kw.get("riders", ()))  # buffers that rode along
            if len(Held.batches) == 1:  # hold the only lane until every record is buffered (or 20 s)
                deadline = asyncio.get_running_loop().time() + 20
                while asyncio.get_running_loop().time() < deadline:
                    if sum(len(p.messages) for p in self._parts.values()) + carried == total:
                        Held.fetched_while_busy = True
                        break
                    await asyncio.sleep(0.05)
                Held.at_release = {t.partition: len(p.messages) for t, p in self._parts.items()}
            await super().flush(tp, messages, **kw)

    async def scenario():
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for r in records:
                run = r["doc"]["runId"]
                await producer.send(topic_name(settings, "log"), encode_record(r), key=run.encode(),
                                    partition=where[run])
            await producer.flush()
        finally:
            await producer.stop()
        with open_store(settings) as store:
            migrate(store)

            def count() -> int:
                return store.query("SELECT count() FROM events").rows[0][0]

            await _run_until(Held(settings, store, topics={"log": "committed"}), lambda: count() >= total)
            await asyncio.sleep(0.5)
            assert count() == total  # plain count(), no FINAL
            assert ledger_gaps(store) == []
            assert store.query("SELECT sum(events) FROM run_rollup").rows[0][0] == total
        assert Held.fetched_while_busy, f"the loop stopped fetching while the lane was busy: {Held.batches}"
        largest = max(Held.at_release, key=lambda p: Held.at_release[p])
        assert Held.batches[1] == (largest, Held.at_release[largest]), (Held.at_release, Held.batches)

    asyncio.run(scenario())


def test_the_buffers_stay_bounded_while_a_partition_is_far_ahead_of_its_batch(settings, monkeypatch):
    """The loop fetches on while a batch is stored, but not without bound: with one partition far
    ahead of its batch in flight it buffers at most (lanes + 2) batches (and one fetch), then waits."""
    from agentlog.audit.exactly_once import ledger_gaps
    from agentlog.audit.migrations import migrate
    from agentlog.audit.sink import AuditSink
    from agentlog.audit.store import open_store
    from agentlog.streams.codec import encode_record
    from tests.bench.bench_sink import _committed

    _tune_sink(monkeypatch, rows=50, flush_s=30.0, lanes=1)
    settings = settings.replace(partitions=1)
    asyncio.run(ensure_topics(settings))
    records = _committed(600)

    class Held(AuditSink):
        most = 0
        held = False

        async def flush(self, tp, messages, **kw):
            if not Held.held:  # hold the first batch for 3 s, watching what is buffered meanwhile
                Held.held = True
                for _ in range(60):
                    Held.most = max(Held.most, sum(len(p.messages) for p in self._parts.values()))
                    await asyncio.sleep(0.05)
            await super().flush(tp, messages, **kw)

    async def scenario():
        await _produce(settings, "log", [encode_record(r) for r in records], [r["doc"]["runId"] for r in records])
        with open_store(settings) as store:
            migrate(store)

            def count() -> int:
                return store.query("SELECT count() FROM events").rows[0][0]

            await _run_until(Held(settings, store, topics={"log": "committed"}), lambda: count() >= len(records))
            await asyncio.sleep(0.5)
            assert count() == len(records)
            assert ledger_gaps(store) == []
        assert 100 <= Held.most < (1 + 2) * 50 + 50, Held.most  # it did fetch ahead, and stopped

    asyncio.run(scenario())


def test_two_batches_failing_at_once_still_stop_the_consumer_and_close_the_lanes(settings, monkeypatch):
    """A crash that takes both lanes' batches (not an Exception: no retry) ends the sink with that
    error, and the second batch's error does not skip the cleanup: the consumer stops, the lanes'
    connections close (a leaked one holds the chdb directory for the whole process).

    It also needs the second lane to get a batch while the first partition's buffer is full: that
    partition is paused and the fetch goes on for the others (without it the buffer bound stopped the
    fetch and the free lane idled until the first batch was stored)."""
    from agentlog.audit.migrations import migrate
    from agentlog.audit.sink import AuditSink
    from agentlog.audit.store import open_store
    from agentlog.schemas.errors import StoreError
    from agentlog.streams.codec import encode_record
    from tests.bench.bench_sink import _committed

    _tune_sink(monkeypatch, rows=20, flush_s=0.2, lanes=2)
    settings = settings.replace(partitions=4)
    asyncio.run(ensure_topics(settings))
    records = _committed(400)

    class BothDie(AuditSink):
        arrived = 0
        lanes: list = []
        die_at: float | None = None

        async def flush(self, tp, messages, **kw):
            BothDie.arrived += 1
            BothDie.lanes = list(self.sinks)
            loop = asyncio.get_running_loop()
            for _ in range(200):  # until both lanes hold a batch (10 s at most)
                if BothDie.arrived >= 2:
                    break
                await asyncio.sleep(0.05)
            if BothDie.die_at is None:
                BothDie.die_at = loop.time() + 0.2
            await asyncio.sleep(BothDie.die_at - loop.time())  # both die in the same turn of the loop
            raise _Killed

    async def scenario():
        await _produce(settings, "log", [encode_record(r) for r in records], [r["doc"]["runId"] for r in records])
        with open_store(settings) as store:
            migrate(store)
            sink = BothDie(settings, store, topics={"log": "committed"})
            with pytest.raises(_Killed):
                await _run_until(sink, lambda: False)
            assert BothDie.arrived >= 2 and len(BothDie.lanes) == 2
            assert len(sink.sinks) == 1, "the lanes' connections were not closed"
            with pytest.raises(StoreError, match="closed"):
                BothDie.lanes[1].store.query("SELECT 1")

    asyncio.run(scenario())


# -- a trickle: the partitions' buffers go together, exactly once across a crash ------------------

@pytest.mark.parametrize("mode", ["before_insert", "after_insert"])
def test_a_trickle_goes_in_batches_of_several_partitions_exactly_once_across_a_crash(settings, mode, monkeypatch):
    """Records trickling into four partitions: a buffer that is ``FLUSH_S`` old takes the other
    partitions' buffers along (one set of statements instead of four). A crash after
    such a batch's ranges are recorded (rows in or not) loses and duplicates nothing: the next sink
    re-forms each partition's last range on its own."""
    from agentlog.audit.exactly_once import ledger_gaps
    from agentlog.audit.migrations import migrate
    from agentlog.audit.sink import AuditSink, batch_ranges
    from agentlog.audit.store import open_store
    from agentlog.streams.codec import encode_record
    from tests.bench.bench_sink import _committed

    _tune_sink(monkeypatch, rows=2000, flush_s=0.3, lanes=2)
    settings = settings.replace(partitions=4)
    asyncio.run(ensure_topics(settings))
    records = _committed(1200)

    class Riding(AuditSink):
        batches: list[int] = []  # partitions per batch

        async def flush(self, tp, messages, *, lo, hi, marked, lane=0, riders=()):
            Riding.batches.append(1 + len(riders))
            if len(riders) >= 2 and Riding.crash:
                Riding.crash = False
                if mode == "before_insert":  # every range recorded, no row inserted
                    self.sinks[lane].mark_ranges(batch_ranges(tp, lo, hi, riders))
                    raise _Killed
                await super().flush(tp, messages, lo=lo, hi=hi, marked=marked, lane=lane, riders=riders)
                raise _Killed
            await super().flush(tp, messages, lo=lo, hi=hi, marked=marked, lane=lane, riders=riders)

    async def trickle() -> None:
        for k in range(0, len(records), 40):  # ~400 records/s over four partitions
            wave = records[k:k + 40]
            await _produce(settings, "log", [encode_record(r) for r in wave], [r["doc"]["runId"] for r in wave])
            await asyncio.sleep(0.1)

    async def scenario():
        with open_store(settings) as store:
            migrate(store)

            def count() -> int:
                return store.query("SELECT count() FROM events").rows[0][0]

            producing = asyncio.ensure_future(trickle())
            Riding.crash = True
            with pytest.raises(_Killed):
                await _run_until(Riding(settings, store, topics={"log": "committed"}), lambda: False)
            assert count() < len(records)
            Riding.crash = False
            await _run_until(Riding(settings, store, topics={"log": "committed"}),
                             lambda: producing.done() and count() >= len(records))
            await producing
            await asyncio.sleep(0.5)
            assert count() == len(records)  # plain count(), no FINAL
            assert store.query("SELECT count() FROM (SELECT run_id, sequence FROM events "
                               "GROUP BY run_id, sequence HAVING count() > 1)").rows[0][0] == 0
            assert ledger_gaps(store) == []
            assert store.query("SELECT sum(events) FROM run_rollup").rows[0][0] == len(records)
        assert max(Riding.batches) >= 3, Riding.batches
        ranges = sum(Riding.batches)
        assert len(Riding.batches) < ranges / 2, f"{len(Riding.batches)} batches for {ranges} ranges"

    asyncio.run(scenario())
