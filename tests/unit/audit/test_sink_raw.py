"""The log's fast path: ClickHouse maps and proves raw CommittedEvent records.

On a real store (chdb; a ClickHouse server too when configured), no broker. Every stored row must
be the very row the Python mapping makes (``rows_for``), ``doc`` byte-identical to the reference
``rfc8785`` JCS, whichever path stored it — and each record must take the path it should: the
records our sequencer writes go through ClickHouse, anything it cannot prove through Python.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.audit.exactly_once import BlockingSink, SequenceTops, token_for
from agentlog.audit.migrations import migrate
from agentlog.audit.rows import rows_for
from agentlog.audit.sink import AuditSink, split_batch
from agentlog.audit.store import Store, open_store
from agentlog.metrics import METRICS
from agentlog.schemas.canonical import GENESIS, chain_hash, jcs, loads_strict
from agentlog.streams.codec import encode_committed, encode_record
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from tests.unit.audit.conftest import store_url  # noqa: F401  (fixture: chdb, and a server when set)
from tests.unit.audit.records import Partition, Record
from tests.unit.schemas.strategies import valid_docs

COLUMNS = ("run_id", "sequence", "event_id", "causation_id", "type", "node_id", "event_time", "ingested_at",
           "source_topic", "kafka_partition", "kafka_offset", "hash", "prev_hash", "payload", "doc", "state_hash")
SOURCE = {"topic": "t.ingest", "partition": 3, "offset": 41, "timestampMs": 1_767_225_600_123}


def _doc(run: str, seq: int, payload: Any, **extra: Any) -> dict[str, Any]:
    return {"eventId": f"{run}-{seq}", "runId": run, "type": "variable.changed", "sequence": seq,
            "timestamp": "2026-01-01T00:00:00.123Z", "nodeId": "n1", "payload": payload, **extra}


def _record(doc: dict[str, Any], prev: str = GENESIS, *, state_hash: str = "ab" * 32,
            source: dict[str, Any] | None = None) -> bytes:
    """A CommittedEvent as the sequencer writes it."""
    return encode_committed(jcs(doc), prev, chain_hash(prev, doc), source or SOURCE, state_hash)


def _ms(v: Any) -> Any:
    """A datetime as ``DateTime64(3, 'UTC')`` keeps it (clickhouse-connect truncates to milliseconds)."""
    return v.replace(tzinfo=None, microsecond=v.microsecond // 1000 * 1000) if hasattr(v, "tzinfo") else v


def _stored(s: Store, run_ids: list[str]) -> list[tuple[Any, ...]]:
    rows = s.query(f"SELECT {', '.join(COLUMNS)} FROM events WHERE run_id IN {{r:Array(String)}} "
                   "ORDER BY run_id, sequence", {"r": run_ids}).rows
    return [tuple(_ms(v) for v in r) for r in rows]


def _expected(values: list[bytes]) -> list[tuple[Any, ...]]:
    """What the Python path stores for ``values`` (one row per natural key, first wins)."""
    _, names, cols = rows_for("committed", [loads_strict(v) for v in values], parsed=True)
    assert names == COLUMNS
    seen: dict[tuple[Any, Any], tuple[Any, ...]] = {}
    for row in zip(*cols, strict=True):
        seen.setdefault((row[0], row[1]), tuple(_ms(v) for v in row))
    return sorted(seen.values(), key=lambda r: (r[0], r[1]))


HARD_PAYLOADS = {
    "floats": {"big": 1e21, "tiny": 5e-324, "negzero": -0.0, "half": 0.5, "e7": 1e-7, "int": 2**53 - 1},
    "non-BMP": {"\U0001F600": "\U0001F600 smile", "\ue000": "private", "é": "e\u0301"},
    "escapes": {"q": 'say "hi"', "bs": "a\\b", "ctl": "\u0000\u001f\n\t", "ls": "\u2028\u2029", "slash": "/"},
    "nested hash keys": {"x": {"hash": "ff", "prevHash": "00"}, "s": ',"hash":"' + "0" * 64 + '"'},
    "nested runId and payload keys": {"payload": {"runId": "other", "payload": 1}, "z": ',"runId":"x"}'},
    "null payload": None,
    "scalar payload": 'just a "string"',
    "empty": {},
    "array": [1, "two", [3.5, None, True], {"runId": "r"}],
}


def test_hard_docs_go_through_clickhouse_byte_identical_to_rfc8785(store_url):  # noqa: F811
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)
        values = [_record(_doc(f"hard-{i}", 0, p)) for i, p in enumerate(HARD_PAYLOADS.values())]
        proven, unproven = sink.insert_log(values, token_for("p.log", 0, 0, len(values) - 1))
        assert (proven, unproven) == (len(values), [])
        runs = [f"hard-{i}" for i in range(len(values))]
        assert _stored(s, runs) == _expected(values)
        for i, payload in enumerate(HARD_PAYLOADS.values()):
            doc, stored_payload = s.query("SELECT doc, payload FROM events WHERE run_id = {r:String}",
                                          {"r": f"hard-{i}"}).rows[0]
            assert doc.encode() == rfc8785.dumps(_doc(f"hard-{i}", 0, payload))
            assert stored_payload.encode() == (b"" if payload is None else rfc8785.dumps(payload))
        assert s.query("SELECT count() FROM sink_stage_sink").rows[0][0] == 0, "the stage is left empty"


def _foreign_records() -> dict[str, bytes]:
    """Records ClickHouse must not store itself, by why."""
    doc = _doc("foreign", 0, {"a": 1})
    good = _record(doc)
    return {
        # the doc written with another key order: not the text the (correct) chain hash was computed from
        "doc text not JCS": good.replace(b'{"eventId":"foreign-0","nodeId":"n1",', b'{"nodeId":"n1","eventId":"foreign-0",'),
        "pretty-printed (a line break)": encode_record({"doc": _doc("foreign", 1, {"b": 2}), "prevHash": GENESIS,
                                                       "hash": chain_hash(GENESIS, _doc("foreign", 1, {"b": 2})),
                                                       "source": SOURCE, "stateHash": "ab" * 32}
                                                      ).replace(b',"hash"', b',\n"hash"'),
        "tampered hash": encode_committed(jcs(_doc("foreign", 2, {"c": 3})), GENESIS, "f" * 64, SOURCE, "ab" * 32),
        "escaped id": _record(_doc('foreign"quote', 3, {})),
        "numeric timestamp": _record(_doc("foreign", 4, {}) | {"timestamp": 1_767_225_600_000}),
        "offset timestamp": _record(_doc("foreign", 5, {}) | {"timestamp": "2026-01-01T05:30:00+05:30"}),
        "leap second": _record(_doc("foreign", 6, {}) | {"timestamp": "2016-12-31T23:59:60Z"}),
        "unknown source key": _record(_doc("foreign", 7, {}), source={**SOURCE, "extra": True}),
        # what an agentlog before 0.2 wrote: refused (log_format_unsupported), never stored without its state hash
        "log format 1 (no stateHash)": encode_record({"doc": _doc("foreign", 8, {}), "prevHash": GENESIS,
                                                      "hash": chain_hash(GENESIS, _doc("foreign", 8, {})),
                                                      "source": SOURCE}),
        "not JSON": b'{"doc": nope',
    }


def test_records_clickhouse_cannot_prove_take_the_python_path_and_are_stored_as_before(store_url):  # noqa: F811
    migrate(store_url)
    with open_store(store_url) as s:
        foreign = _foreign_records()
        ours = [_record(_doc("ours", q, {"q": q})) for q in range(3)]
        values = [*ours, *foreign.values()]
        messages = [Record(topic="p.log", partition=0, offset=i, timestamp=0, value=v) for i, v in enumerate(values)]
        sink = AuditSink(Settings(topic_prefix="p"), s, topics={"log": "committed"})
        assert topic_name(sink.settings, "log") == "p.log"

        unproven0 = METRICS.get("agentlog_sink_unproven_total", table="log")
        proven, rest = asyncio.run(sink._insert_log(messages, token_for("p.log", 0, 0, len(values) - 1), reform=False))
        assert proven == len(ours)
        assert [m.value for m in rest] == list(foreign.values()), "exactly the foreign records, in offset order"
        assert METRICS.get("agentlog_sink_unproven_total", table="log") == unproven0 + len(foreign)

        s.command("TRUNCATE TABLE events")
        # the whole batch as the sink flushes it (another partition: another range token)
        asyncio.run(sink.flush(Partition("p.log", 1), messages, lo=0, hi=len(values) - 1, marked=False))
        refused = ("not JSON", "tampered hash", "log format 1 (no stateHash)")
        decodable = [v for k, v in foreign.items() if k not in refused]
        tampered = foreign["tampered hash"]
        assert _stored(s, ["ours", "foreign", 'foreign"quote']) == _expected([*ours, *decodable, tampered])
        for doc, in s.query("SELECT doc FROM events").rows:
            assert doc.encode() == rfc8785.dumps(loads_strict(doc.encode()))
        format_1 = values.index(foreign["log format 1 (no stateHash)"])
        assert s.query("SELECT reason, source_offset, run_id FROM rejections ORDER BY source_offset").rows == [
            ("log_format_unsupported", format_1, "foreign"), ("sink_undecodable", len(values) - 1, "")]
        [(detail,)] = s.query("SELECT detail FROM rejections WHERE reason = 'log_format_unsupported'").rows
        assert detail == ("log record run foreign, sequence 8: this log was written by an agentlog before 0.2 (log "
                          "format 1, records without stateHash); re-ingest its runs with `agentlog publish` from an "
                          "export made with that version")


def test_the_range_token_protects_events_and_the_rollups_and_a_reform_lands_what_is_missing(store_url):  # noqa: F811
    """The token rides on the INSERT … SELECT from the stage: proven by a token whose part is gone
    (the state a SIGKILL leaves), which drops the insert — in ``events`` and in the views."""
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)
        values = [_record(_doc(f"tok-{q % 3}", q, {"q": q})) for q in range(30)]
        token = token_for("p.log", 2, 100, 129)
        ghost = [v.replace(b"tok-", b"gst-") for v in values]  # same shape, other runs (hashes fail: Python path)
        _, names, cols = rows_for("committed", [loads_strict(v) for v in ghost])
        for taken in (token, f"{token}/reform-1"):
            s.insert("events", cols, names, column_oriented=True, dedup_token=taken)
        s.command("ALTER TABLE events DELETE WHERE startsWith(run_id, 'gst-')", settings={"mutations_sync": 2})

        def counts() -> tuple[int, int]:
            return (int(s.query("SELECT count() FROM events").rows[0][0]),
                    int(s.query("SELECT sum(events) FROM run_rollup WHERE startsWith(run_id, 'tok-')").rows[0][0]))

        assert sink.insert_log(values, token) == (30, [])
        assert counts() == (0, 0), "the token dropped the insert into events and into the rollup views"
        dropped = METRICS.get("agentlog_sink_dropped_tokens_total", table="events")
        assert sink.insert_log(values, token, reform=True) == (30, [])
        assert counts() == (30, 30)
        assert METRICS.get("agentlog_sink_dropped_tokens_total", table="events") == dropped + 1  # reform-1 was taken
        assert sink.insert_log(values, token, reform=True) == (30, [])  # again: nothing missing, nothing added
        assert counts() == (30, 30)
        # the same range inserted again normally: dropped by the token (and by key)
        assert sink.insert_log(values, token) == (30, [])
        assert counts() == (30, 30)


def test_keys_stored_earlier_or_twice_in_the_batch_are_inserted_once(store_url):  # noqa: F811
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)
        first = [_record(_doc("dup", q, {"q": q})) for q in range(10)]
        assert sink.insert_log(first, token_for("p.log", 0, 0, 9)) == (10, [])
        # one insert, one part: a batch lands all or nothing (migration 0002's premise)
        assert s.query("SELECT count() FROM system.parts WHERE database = currentDatabase() "
                       "AND table = 'events' AND active").rows[0][0] == 1
        again = [first[8], first[9], _record(_doc("dup", 10, {})), _record(_doc("dup", 10, {})),
                 _record(_doc("dup", 11, {}))]  # at-least-once: stored keys and an in-batch repeat
        assert sink.insert_log(again, token_for("p.log", 0, 10, 14)) == (5, [])
        assert s.query("SELECT count(), uniqExact(run_id, sequence), max(sequence) FROM events").rows[0] == (12, 12, 11)
        assert int(s.query("SELECT sum(events) FROM run_rollup").rows[0][0]) == 12


def test_generated_docs_are_stored_as_the_python_mapping_stores_them(tmp_path):
    """Whatever a valid doc holds, the row is the Python mapping's, by whichever path it went."""
    url = f"chdb://{tmp_path / 'ch'}"
    migrate(url)
    with open_store(url) as s:
        sink = BlockingSink(s)
        batches = iter(range(10**6))
        paths = {"clickhouse": 0, "python": 0}

        @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(docs=st.lists(valid_docs(), min_size=1, max_size=25))
        def check(docs: list[dict[str, Any]]) -> None:
            s.command("TRUNCATE TABLE events")
            values, seen = [], set()
            for d in docs:
                if (d["runId"], d["sequence"]) not in seen:
                    seen.add((d["runId"], d["sequence"]))
                    values.append(_record(d, state_hash="cd" * 32))
            token = token_for("p.log", 0, next(batches), 0)
            proven, unproven = sink.insert_log(values, token)
            assert proven + len(unproven) == len(values)
            paths["clickhouse"] += proven
            paths["python"] += len(unproven)
            if unproven:
                _, names, cols = rows_for("committed", [loads_strict(v) for v in unproven], parsed=True)
                sink.insert_rows("events", names, cols, token + "/py")
            assert _stored(s, sorted({r for r, _ in seen})) == _expected(values)
            for doc, in s.query("SELECT doc FROM events").rows:
                assert doc.encode() == rfc8785.dumps(loads_strict(doc.encode()))

        check()
        assert paths["clickhouse"] and paths["python"], f"both paths must be exercised: {paths}"


def _lookups(monkeypatch) -> list[bool]:
    """Spy on which ``events`` insert the sink runs: ``filtered`` per ``raw.insert_sql`` call."""
    from agentlog.audit import raw

    calls: list[bool] = []
    real = raw.insert_sql

    def spy(stage: str, *, filtered: bool = True, settings: Mapping[str, int | str] | None = None) -> str:
        calls.append(filtered)
        return real(stage, filtered=filtered, settings=settings)

    monkeypatch.setattr(raw, "insert_sql", spy)
    return calls


def test_a_batch_continuing_every_run_skips_the_key_lookup_and_one_that_repeats_a_key_does_not(tmp_path, monkeypatch):
    """The stored-key lookup is skipped only where no stored key can repeat (:class:`SequenceTops`).

    Runs stored by an earlier process (the rows are there before this engine's sink saw the run),
    a record the log holds again at a later offset, a batch repeating what another sink of the
    process stored meanwhile: none of them stored twice, and only the batches that continue
    every run past what is stored go in without the lookup.
    """
    url = f"chdb://{tmp_path / 'ch'}"
    migrate(url)
    prev = [_record(_doc("old", q, {"q": q})) for q in range(10)]
    with open_store(url) as s:  # "a previous process": its bounds go with its engine
        BlockingSink(s).insert_log(prev, token_for("p.log", 0, 0, 9))
    with open_store(url) as s:
        filtered = _lookups(monkeypatch)
        a, b = BlockingSink(s, stage="a"), BlockingSink(s, stage="b")
        assert a.tops is b.tops, "the sinks of one engine share the bounds"

        def count() -> tuple[int, int]:
            return tuple(s.query("SELECT count(), uniqExact(run_id, sequence) FROM events").rows[0])

        # first sight of "old" since this engine opened: its stored rows are looked up, 5..9 repeat
        assert a.insert_log([*prev[5:], _record(_doc("old", 10, {}))], token_for("p.log", 0, 5, 10)) == (6, [])
        assert count() == (11, 11) and filtered == [True]
        # contiguous, every run past its bound (a new run too): no lookup, nothing lost
        nxt = [_record(_doc("old", q, {"q": q})) for q in range(11, 20)] + [_record(_doc("new", 0, {}))]
        assert a.insert_log(nxt, token_for("p.log", 0, 11, 20)) == (10, [])
        assert count() == (21, 21) and filtered == [True, False]
        # the log holds old-15 again (an at-least-once producer) beside new keys: looked up, stored once
        again = [_record(_doc("old", 15, {"q": 15})), _record(_doc("old", 20, {})), _record(_doc("new", 1, {}))]
        assert a.insert_log(again, token_for("p.log", 0, 21, 23)) == (3, [])
        assert count() == (23, 23) and filtered == [True, False, True]
        # sink b stores old-21..22 (a zombie owner of the partition); a's next batch repeats old-22
        assert b.insert_log([_record(_doc("old", 21, {})), _record(_doc("old", 22, {}))],
                            token_for("p.log", 0, 24, 25)) == (2, [])
        assert a.insert_log([_record(_doc("old", 22, {})), _record(_doc("old", 23, {}))],
                            token_for("p.log", 0, 26, 27)) == (2, [])
        assert count() == (26, 26) and filtered == [True, False, True, False, True]
        assert int(s.query("SELECT sum(events) FROM run_rollup").rows[0][0]) == 26


def test_the_python_path_raises_the_bounds_too(tmp_path, monkeypatch):
    """A row stored by the Python path (a record ClickHouse could not prove) counts in its run's bound:
    a later repeat of it through ClickHouse is looked up, not inserted blind."""
    url = f"chdb://{tmp_path / 'ch'}"
    migrate(url)
    with open_store(url) as s:
        filtered = _lookups(monkeypatch)
        sink = BlockingSink(s)
        assert sink.insert_log([_record(_doc("py", 0, {}))], token_for("p.log", 0, 0, 0)) == (1, [])
        _, names, cols = rows_for("committed", [loads_strict(_record(_doc("py", q, {}))) for q in (1, 2)])
        assert sink.insert_rows("events", names, cols, token_for("p.log", 0, 1, 2) + "/py") == 2
        assert sink.insert_log([_record(_doc("py", 2, {})), _record(_doc("py", 3, {}))],
                               token_for("p.log", 0, 3, 4)) == (2, [])
        assert filtered == [False, True]
        assert s.query("SELECT count(), uniqExact(sequence) FROM events").rows[0] == (4, 4)


def test_sequence_tops_answer_clear_only_above_every_bound():
    tops = SequenceTops(cap=2)
    assert not tops.claim({"r": (0, 3)}), "a run never looked up is not clear"
    tops.learn(["s"], {})
    assert tops.claim({"r": (4, 5), "s": (0, 0)})
    assert not tops.claim({"r": (5, 9)}), "5 may be stored"
    assert tops.claim({"r": (10, 10)})
    tops.learn(["t"], {"t": 7})  # over the cap: the least recently claimed run (s) is dropped
    assert tops.unknown(["r", "s", "t"]) == ["s"]
    assert not tops.claim({"t": (7, 8)}) and tops.claim({"t": (9, 9)})


def test_a_token_is_written_into_the_statement_as_a_string_and_still_drops_a_repeat(store_url):  # noqa: F811
    """The events insert carries its token in its own ``SETTINGS`` (no per-call settings round trips):
    quoted, whatever it holds, and in force for that insert (a repeat under it is dropped)."""
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)
        token = "p.log/0/0-4+p.log/1/'quoted'\\back"
        values = [_record(_doc("quote", q, {"q": q})) for q in range(5)]
        sink.insert_log(values, token)
        sink.tops = None  # no bounds: the repeat below reaches the insert, and only the token can drop it
        s.command("ALTER TABLE events DELETE WHERE run_id = 'quote' AND sequence = 4", settings={"mutations_sync": 2})
        sink.insert_log(values, token)
        assert s.query("SELECT count() FROM events WHERE run_id = 'quote'").rows[0][0] == 4, "the token dropped it"


def test_a_format_1_log_record_is_a_sink_rejection_and_the_rest_of_its_batch_maps():
    """The sink never dies on a record: one without stateHash (an agentlog before 0.2) goes to rejections
    with reason ``log_format_unsupported`` and what to do, its raw bytes kept; the others map as usual."""
    ours = [_record(_doc("mixed", q, {"q": q})) for q in range(3)]
    doc = _doc("mixed", 3, {})
    old = encode_record({"doc": doc, "prevHash": GENESIS, "hash": chain_hash(GENESIS, doc), "source": SOURCE})
    messages = [Record(topic="p.log", partition=0, offset=i, timestamp=5, value=v) for i, v in enumerate([*ours, old])]
    mapped, bad = split_batch("committed", messages)
    assert mapped is not None and mapped[0] == "events" and mapped[2][0] == ["mixed"] * 3
    [rejected] = bad
    assert (rejected["reason"], rejected["runId"], rejected["source"]["offset"]) == ("log_format_unsupported", "mixed", 3)
    assert rejected["detail"].startswith("log record run mixed, sequence 3: this log was written by an agentlog "
                                         "before 0.2")
    assert base64.b64decode(rejected["raw"]) == old
