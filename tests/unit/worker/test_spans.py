"""The span mapper (``spans`` → ``otel-events``) and the receiver's ``spans`` records, on the in-memory worker.

A request's spans of one trace travel as one record and are held under one table key per record:
the trace goes out whole and as the offline mapping makes it, a re-sent span adds nothing, a record
that is not a trace's spans is rejected whole and a span that cannot be read is rejected alone.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlog.core.otel import map_trace, plan_trace
from agentlog.core.redaction import Redactor
from agentlog.core.sealing import is_sealed
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import EventRejected
from agentlog.streams.settings import Settings
from agentlog.worker import spans as sp
from agentlog.worker.memory import MemoryWorker, memory_wiring
from agentlog.worker.otlp import decode_request, span_dicts, trace_records
from agentlog.worker.txlog import LogRecord
from agentlog.worker.wiring import Wiring

CORPUS = Path(__file__).resolve().parents[2] / "otel_corpus"
T0 = 1_000.0  # the records' Kafka time, seconds


def _corpus_spans(name: str = "openai_agents.openllmetry") -> list[dict[str, Any]]:
    spans, refused = span_dicts(decode_request((CORPUS / f"{name}.pb.gz").read_bytes(), "application/x-protobuf",
                                               "gzip"))
    assert spans and not refused
    return spans


def _records(worker: MemoryWorker, short: str) -> list[LogRecord]:
    """The committed records (keys and values) of the worker's topic ``short``, every partition in order."""
    topic = worker.topic(short)
    read = asyncio.run(worker.log.read({(topic, p): 0 for p in range(worker.wiring.settings.partitions)}))
    return [rec for where in sorted(read) for rec in read[where]]


def _contents(table: Any, partition: int = 0) -> dict[str, Any]:
    """Every key of a table's partition and its value."""
    return {key: table.get(partition, key) for key in table.keys_from(partition, "")}


class _Mapper:
    """The span mapper agent of a worker in memory, fed records of ``spans`` partition 0, one batch per feed."""

    def __init__(self, tmp_path: Path, redactor: Redactor | None = None) -> None:
        self.worker = MemoryWorker(memory_wiring(Settings(home=tmp_path, otlp_port=0), redactor=redactor))
        self.wiring: Wiring = self.worker.wiring
        sp.install(self.wiring, self.worker.agents)
        self.topic = self.worker.topic("spans")

    def feed(self, values: list[bytes], at: float = T0) -> None:
        """One batch of ``values`` with Kafka time ``at`` (seconds)."""
        asyncio.run(self.worker.feed("otel-spans", values, timestamp_ms=round(at * 1000)))

    def tick(self, at: float) -> None:
        self.feed([sp.TICK], at)

    @property
    def held(self) -> Any:
        return self.wiring.tables[sp.HELD]

    @property
    def data(self) -> dict[str, Any]:
        """What the held-spans table holds (partition 0)."""
        return _contents(self.held)

    def held_keys(self, trace_id: str) -> list[str]:
        return sorted(self.held.keys_from(0, f"{trace_id}\x1f"))

    def out(self, short: str) -> list[dict[str, Any]]:
        return [orjson.loads(v) for v in self.worker.values(short) if v is not None]

    def rejections(self) -> list[dict[str, Any]]:
        """The rejections sent, opened through the worker's keyring (``raw`` and ``detail`` are stored sealed)."""
        stored = self.out("rejections")
        assert all(is_sealed(r["raw"]) and is_sealed(r["detail"]) for r in stored)
        assert self.wiring.keyring is not None
        return [self.wiring.keyring.open_rejection(r) for r in stored]


def _offline(spans: list[dict[str, Any]]) -> list[str]:
    """The event ids the offline mapping gives these spans (one trace, whole), in order."""
    trace_id = spans[0]["traceId"]
    emission = map_trace(trace_id, {s["spanId"]: s for s in spans}, published={}, cursors={})
    return [doc["eventId"] for doc in emission.docs]


def _planned(records: list[dict[str, Any]]) -> list[str]:
    return [e["doc"]["eventId"] for r in records for e in r["events"]]


def test_a_requests_spans_are_one_record_per_trace_in_request_order():
    a, b = _corpus_spans("openai_agents.openllmetry"), _corpus_spans("langgraph.openinference")
    mixed = [s for pair in zip(a, b, strict=False) for s in pair] + a[len(b):] + b[len(a):]
    records, oversize = trace_records(mixed, 900_000)
    assert not oversize
    assert [k for k, _ in records] == [a[0]["traceId"], b[0]["traceId"]]
    for (trace_id, value), spans in zip(records, (a, b), strict=True):
        assert orjson.loads(value) == {"traceId": trace_id, "spans": spans}


@pytest.mark.parametrize("limit", [3_000, 5_000, 20_000])
def test_a_trace_is_split_into_records_under_the_limit_and_a_span_too_big_alone_is_refused(limit):
    spans = _corpus_spans()
    big = {**spans[0], "spanId": "ff" * 8, "attributes": {"gen_ai.input.messages": "x" * limit}}
    records, oversize = trace_records([*spans, big], limit)
    assert [orjson.loads(v) for _, v in oversize] == [big] and "ffffffffffffffff" in oversize[0][0]
    assert all(len(value) <= limit for _, value in records)
    fits = [s for s in spans if len(orjson.dumps(s)) + 60 <= limit]
    assert [s for _, v in records for s in orjson.loads(v)["spans"]] == fits
    assert len(records) > 1 or limit == 20_000


def test_a_trace_is_held_one_key_per_record_then_published_whole(tmp_path):
    spans = _corpus_spans()
    trace_id = spans[0]["traceId"]
    (_, first), = trace_records(spans[:5], 900_000)[0]
    (_, second), = trace_records(spans[5:], 900_000)[0]
    mapper = _Mapper(tmp_path)
    mapper.feed([first, second])
    assert len(mapper.held_keys(trace_id)) == 2  # one per record, not one per span
    assert mapper.held.get(0, trace_id)["pending"] == [s["spanId"] for s in spans]
    assert mapper.out("otel-events") == []

    mapper.tick(T0 + 0.5)  # not due yet: 1 s after the last span
    assert mapper.out("otel-events") == []
    mapper.tick(T0 + sp.SETTLE_MS / 1000 + 0.5)
    assert _planned(mapper.out("otel-events")) == _offline(spans)
    assert mapper.held_keys(trace_id) == []  # the held spans are deleted once the trace is out
    assert mapper.held.get(0, trace_id)["pending"] == []


def test_re_sent_spans_add_nothing_while_held_and_after_their_trace_went_out(tmp_path):
    spans = _corpus_spans()
    trace_id = spans[0]["traceId"]
    (_, value), = trace_records(spans, 900_000)[0]
    mapper = _Mapper(tmp_path)
    mapper.feed([value])
    held = mapper.held_keys(trace_id)
    (_, again), = trace_records(spans[2:4], 900_000)[0]  # an exporter's retry of part of the request
    mapper.feed([value, again])
    assert mapper.held_keys(trace_id) == held
    assert mapper.held.get(0, trace_id)["pending"] == [s["spanId"] for s in spans]
    mapper.tick(T0 + 2)
    published = mapper.out("otel-events")
    mapper.feed([value], T0 + 3)
    mapper.tick(T0 + 5)
    assert mapper.out("otel-events") == published and mapper.held_keys(trace_id) == []


def test_an_entry_holding_spans_without_chunks_is_logged_and_does_not_stop_the_mapper(tmp_path, caplog):
    spans = _corpus_spans()
    trace_id = spans[0]["traceId"]
    mapper = _Mapper(tmp_path)
    # An entry naming held spans but no chunks (and no startNs): not a layout the mapper writes.
    mapper.held.put(0, trace_id, {"pending": [s["spanId"] for s in spans[:4]], "published": {},
                                  "firstMs": T0 * 1000, "lastMs": T0 * 1000, "rootSeen": False})
    mapper.held.put(0, "\x00pending\x1f0", [trace_id])
    mapper.feed([trace_records(spans[4:], 900_000)[0][0][1]])
    with caplog.at_level("ERROR", logger="agentlog.otel"):
        mapper.tick(T0 + sp.GRACE_MS / 1000 + 1)
    assert "4 of its" in caplog.text and trace_id in caplog.text
    assert {e["span"] for r in mapper.out("otel-events") for e in r["events"]} <= {s["spanId"] for s in spans[4:]}
    assert mapper.held.get(0, trace_id)["pending"] == [] and mapper.held_keys(trace_id) == []
    assert mapper.held.get(0, "\x00pending\x1f0") == []


def test_a_record_that_is_not_a_traces_spans_is_rejected_whole_and_nothing_is_held(tmp_path):
    spans = _corpus_spans()
    mapper = _Mapper(tmp_path)
    mapper.feed([orjson.dumps(spans[0]), orjson.dumps({"traceId": spans[0]["traceId"], "spans": spans[0]})])
    rejections = mapper.rejections()
    assert [r["reason"] for r in rejections] == ["decode_error"] * 2
    assert all('{"traceId", "spans": [span, ...]}' in r["detail"] for r in rejections)
    assert orjson.loads(base64.b64decode(rejections[0]["raw"])) == spans[0]
    assert mapper.held.get(0, spans[0]["traceId"]) is None and mapper.held_keys(spans[0]["traceId"]) == []


def test_an_unreadable_span_in_a_record_is_rejected_alone(tmp_path):
    spans = _corpus_spans()
    broken = {k: v for k, v in spans[1].items() if k != "startNs"}
    value = orjson.dumps({"traceId": spans[0]["traceId"], "spans": [spans[0], broken, *spans[2:]]})
    mapper = _Mapper(tmp_path)
    mapper.feed([value, b"not json", orjson.dumps({"traceId": 7, "spans": []})])
    rejections = mapper.rejections()
    assert [r["reason"] for r in rejections] == ["decode_error"] * 3
    assert "KeyError" in rejections[0]["detail"] and orjson.loads(base64.b64decode(rejections[0]["raw"])) == broken
    assert mapper.held.get(0, spans[0]["traceId"])["pending"] == [s["spanId"] for s in spans if s is not spans[1]]


# --- the OTel run sequencer (otel-events → ingest) -------------------------------------------------------------


class _RunSequencer:
    """The OTel run sequencer agent of a worker in memory, fed records of ``otel-events`` partition 0."""

    def __init__(self, tmp_path: Path, redactor: Redactor | None = None) -> None:
        self.worker = MemoryWorker(memory_wiring(Settings(home=tmp_path, otlp_port=0), redactor=redactor))
        self.wiring: Wiring = self.worker.wiring
        sp.install(self.wiring, self.worker.agents)
        self.topic = self.worker.topic("otel-events")

    def feed(self, values: list[bytes]) -> None:
        asyncio.run(self.worker.feed("otel-sequencer", values, timestamp_ms=round(T0 * 1000)))

    @property
    def seq(self) -> Any:
        return self.wiring.tables[sp.SEQ]

    def ingest(self) -> list[bytes]:
        return [v for v in self.worker.values("ingest") if v is not None]

    def run_keys(self, run: str) -> list[str]:
        return sorted(k for k in self.seq.keys_from(0, run) if k == run or k.startswith(f"{run}\x1f"))


def _run_records(spans: list[dict[str, Any]]) -> list[bytes]:
    """The span mapper's ``otel-events`` records for one whole trace."""
    plan = plan_trace(spans[0]["traceId"], {s["spanId"]: s for s in spans}, published={})
    return [orjson.dumps({"run": run, "trace": plan.trace_id, "events": events}) for run, events in plan.runs.items()]


def _one_run_records() -> tuple[str, list[bytes]]:
    """Two traces' records of one run (two turns of a conversation), the first's first."""
    records = []
    for name in ("openai_agents.openllmetry", "langgraph.openllmetry"):
        first = orjson.loads(_run_records(_corpus_spans(name))[0])
        records.append({**first, "run": "conv-1",
                        "events": [{**e, "doc": {**e["doc"], "runId": "conv-1"}} for e in first["events"]]})
    return "conv-1", [orjson.dumps(r) for r in records]


def test_the_run_sequencer_keeps_one_index_entry_per_record_and_sends_canonical_docs(tmp_path):
    run, records = _one_run_records()
    sequencer = _RunSequencer(tmp_path)
    sequencer.feed(records)
    sent = sequencer.ingest()
    docs = [orjson.loads(v) for v in sent]
    assert [d["sequence"] for d in docs] == list(range(len(docs))) and len(docs) > 10
    assert sent == [jcs(d) for d in docs]
    firsts = [0, len(orjson.loads(records[0])["events"])]
    traces = [orjson.loads(r)["trace"] for r in records]
    assert sequencer.run_keys(run) == sorted([run, *(f"{run}\x1fr\x1f{f}" for f in firsts),
                                              *(f"{run}\x1ft\x1f{t}" for t in traces)])
    assert sequencer.seq.get(0, run) == {"next": len(docs), "last": docs[-1]["eventId"], "kept": 0}
    # The cursor's changelog record comes after the index entries it counts.
    changelog_of = sequencer.seq.changelog
    changelog = [orjson.loads(r.key) for r in asyncio.run(sequencer.worker.log.read({(changelog_of, 0): 0}))[
        (changelog_of, 0)] if r.key]
    mine = [k for k in changelog if k == run or k.startswith(f"{run}\x1f")]
    assert mine[-1] == run and mine.count(run) == 1


def test_a_redelivered_or_re_emitted_record_adds_nothing_and_a_replay_sends_the_same_bytes(tmp_path):
    run, records = _one_run_records()
    sequencer = _RunSequencer(tmp_path)
    sequencer.feed(records)
    sent = sequencer.ingest()
    sequencer.feed([records[1], records[0]])
    assert sequencer.ingest() == sent
    fresh = _RunSequencer(tmp_path / "again")
    fresh.feed(records)
    assert fresh.ingest() == sent


def test_a_run_whose_cursor_has_no_index_entries_goes_on_from_the_cursor(tmp_path):
    run, records = _one_run_records()
    whole = _RunSequencer(tmp_path / "whole")
    whole.feed(records)
    sequencer = _RunSequencer(tmp_path)
    first = [orjson.loads(v) for v in whole.ingest()][:len(orjson.loads(records[0])["events"])]
    # Per-event keys beside the cursor and no record entries: not an index the sequencer writes or reads.
    for doc in first:
        sequencer.seq.put(0, f"{run}\x1fs\x1f{doc['sequence']}", doc["eventId"])
        sequencer.seq.put(0, f"{run}\x1fe\x1f{doc['eventId']}", doc["sequence"])
    sequencer.seq.put(0, run, {"next": len(first), "last": first[-1]["eventId"], "kept": 0})
    sequencer.feed(records[1:])
    assert sequencer.ingest() == whole.ingest()[len(first):]
    assert sequencer.seq.get(0, run) == whole.seq.get(0, run)


def test_the_oldest_records_are_forgotten_beyond_the_index_limit(tmp_path, monkeypatch):
    run, records = _one_run_records()
    sizes = [len(orjson.loads(r)["events"]) for r in records]
    monkeypatch.setattr(sp, "RUN_INDEX_MAX", sizes[1])
    sequencer = _RunSequencer(tmp_path)
    sequencer.feed(records)
    trace0, trace1 = (orjson.loads(r)["trace"] for r in records)
    assert sequencer.run_keys(run) == sorted([run, f"{run}\x1fr\x1f{sizes[0]}", f"{run}\x1ft\x1f{trace1}"])
    assert sequencer.seq.get(0, run)["kept"] == sizes[0]
    sequencer.feed(records[1:])
    assert len(sequencer.ingest()) == sum(sizes)  # the kept record's events are still known


@pytest.mark.parametrize(("captured", "code"), [('[{"n": 18014398509481984}]', "unsafe_integer"),
                                                ('[{"n": NaN}]', "non_finite_number")])
def test_a_trace_whose_captured_json_has_what_a_doc_cannot_hold_goes_out_with_that_event_opaque(tmp_path, captured,
                                                                                                  code):
    spans = _corpus_spans()
    chat = next(i for i, s in enumerate(spans) if s["attributes"].get("gen_ai.operation.name") == "chat")
    attributes = {**spans[chat]["attributes"], "gen_ai.output.messages": captured}
    spans[chat] = {**spans[chat], "attributes": attributes}
    mapper = _Mapper(tmp_path)
    mapper.feed([trace_records(spans, 900_000)[0][0][1]])
    mapper.tick(T0 + 2)
    records = mapper.out("otel-events")
    assert _planned(records) == _offline(spans)
    opaque = [e["doc"]["payload"]["unmapped"] for r in records for e in r["events"] if e["doc"]["type"] == "log.appended"
              and "unmapped" in e["doc"]["payload"]]
    assert [(u["type"], u["code"], u["spanId"]) for u in opaque] == [
        ("agent.invocation.completed", code, spans[chat]["spanId"])]


def test_an_otel_events_record_reads_back_as_the_values_it_was_written_from():
    plain = {"run": "r", "trace": "t", "events": [{"doc": {"n": 1.5, "s": "é", "l": (1, 2)}, "span": "s"}]}
    assert sp._json(plain) == orjson.dumps(plain)
    with_null = {**plain, "events": [{"doc": {"n": None, "x": 2.0}, "span": "s"}]}
    assert sp._json(with_null) == jcs(with_null) and orjson.loads(sp._json(with_null)) == with_null
    for bad in (float("nan"), float("inf"), 2**60, 2**70):
        with pytest.raises(EventRejected):
            sp._json({**plain, "events": [{"doc": {"n": bad}, "span": "s"}]})
