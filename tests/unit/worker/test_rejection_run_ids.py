"""A rejection names the run of what it rejects: the doc's runId, else the record's Kafka key (no broker).

The agents run as the worker runs them, on the in-memory ports of :mod:`agentlog.worker.memory`;
each record is delivered with its raw key, as Faust delivers the ingest and ``otel-events`` records.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlog.core.otel import plan_trace
from agentlog.core.sequencing import Source, rejection_record
from agentlog.schemas.records import KEY_RUN_ID_MAX, run_id_of_key
from agentlog.streams.codec import encode_json
from agentlog.streams.settings import Settings
from agentlog.worker import sequencer
from agentlog.worker import spans as sp
from agentlog.worker.batch import FaustAgents, position_key
from agentlog.worker.memory import MemoryStream, event, memory_wiring, parts
from agentlog.worker.otlp import decode_request, span_dicts, trace_records
from agentlog.worker.wiring import Wiring

CORPUS = Path(__file__).resolve().parents[2] / "otel_corpus"
SOURCE = Source("p.ingest", 0, 7, 0)


@pytest.mark.parametrize(("key", "run_id"), [
    (b"run-1", "run-1"),
    ("rün-ß".encode(), "rün-ß"),
    (None, None),
    (b"", None),
    (b"\xff\xfe", None),  # not UTF-8: no run id is such a string
    (b"r" * KEY_RUN_ID_MAX, "r" * KEY_RUN_ID_MAX),
    (b"r" * (KEY_RUN_ID_MAX + 1), None),
])
def test_a_key_names_the_run_it_decodes_to(key: bytes | None, run_id: str | None) -> None:
    assert run_id_of_key(key) == run_id


def test_the_docs_run_id_comes_first_and_the_key_stands_in_where_it_names_none() -> None:
    doc = {"runId": "from-doc", "eventId": "e1", "sequence": 3}
    assert rejection_record("sequence_gap", "", b"{}", SOURCE, doc, b"from-key")["runId"] == "from-doc"
    assert rejection_record("decode_error", "", b"{", SOURCE, None, b"from-key")["runId"] == "from-key"
    assert rejection_record("invalid_envelope", "", b"{}", SOURCE, {**doc, "runId": 42}, b"k")["runId"] == "k"
    assert rejection_record("decode_error", "", b"{", SOURCE, None)["runId"] is None


# --- the agents -----------------------------------------------------------------------------------


def _run_agent(wiring: Wiring, agent_name: str, table: str, topic: str, records: list[tuple[bytes | None, bytes]],
               *, first: int = 0, at: float = 1_000.0) -> list[tuple[str, str | None, Any]]:
    """Run ``agent_name`` on ``(key, value)`` records at offsets ``first``.. of ``topic[0]``; the records it sent."""
    _, agent = parts(wiring).runner.agents[agent_name]
    producer = parts(wiring).producer
    before = len(producer.log)
    held = wiring.tables[table]

    async def go() -> None:
        stream = MemoryStream([event(topic, 0, first + i, value, at, key) for i, (key, value) in enumerate(records)])
        running = asyncio.ensure_future(agent(stream))
        while not running.done() and (held.get(0, position_key(topic, 0)) or 0) < first + len(records):
            await asyncio.sleep(0.002)
        stream.close()
        await running

    asyncio.run(go())
    return [(entry[1], entry[3].decode() if entry[3] is not None else None, orjson.loads(entry[4]))
            for entry in producer.log[before:] if entry[0] == "sent" and entry[4] is not None]


def _rejections(sent: list[tuple[str, str | None, Any]]) -> list[tuple[str | None, str, str | None]]:
    """``(record key, reason, runId)`` of each rejection sent."""
    return [(key, value["reason"], value["runId"]) for topic, key, value in sent if topic.endswith(".rejections")]


def test_the_sequencer_files_an_unreadable_record_under_its_key(tmp_path: Path) -> None:
    wiring = memory_wiring(Settings(home=tmp_path), tables=("index", "runs", "closed"))
    sequencer.install(wiring, replay=False)
    gap = {"eventId": "e5", "runId": "doc-run", "type": "variable.changed", "payload": {"name": "v", "value": 1},
           "timestamp": "2025-03-04T05:06:07.089Z", "sequence": 5}
    sent = _run_agent(wiring, "sequencer", "runs", wiring.topics["ingest"].get_topic_name(), [
        (b"run-a", b'{"runId": oops'),               # not JSON
        (b"run-a", json.dumps({"hello": 1}).encode()),  # not a RunEventDoc
        (b"\xff\xfe", b"not json"),                  # a key that is no run id
        (None, b"\x07binary"),                       # no key at all
        (b"other-key", encode_json(gap)),            # a doc: its own runId
    ])
    assert _rejections(sent) == [
        ("run-a", "decode_error", "run-a"),
        ("run-a", "invalid_envelope", "run-a"),
        (None, "decode_error", None),
        (None, "bad_magic", None),
        ("doc-run", "sequence_gap", "doc-run"),
    ]


def _corpus_spans(name: str) -> list[dict[str, Any]]:
    spans, refused = span_dicts(decode_request((CORPUS / f"{name}.pb.gz").read_bytes(), "application/x-protobuf",
                                               "gzip"))
    assert spans and not refused
    return spans


def test_the_otel_run_sequencer_files_a_malformed_record_under_its_run_key(tmp_path: Path) -> None:
    wiring = memory_wiring(Settings(home=tmp_path, otlp_port=0))
    sp.install(wiring, FaustAgents(wiring))
    spans = _corpus_spans("openai_agents.openllmetry")
    plan = plan_trace(spans[0]["traceId"], {s["spanId"]: s for s in spans}, published={})
    run, events = next(iter(plan.runs.items()))
    good = orjson.dumps({"run": run, "trace": plan.trace_id, "events": events})
    sent = _run_agent(wiring, "otel-sequencer", sp.SEQ, wiring.topics["otel-events"].get_topic_name(), [
        (b"conv-9", b"not json"),
        (run.encode(), good),
    ])
    assert _rejections(sent) == [("conv-9", "decode_error", "conv-9")]


def test_a_span_the_mapper_refuses_is_filed_under_the_run_that_holds_its_place(tmp_path: Path) -> None:
    wiring = memory_wiring(Settings(home=tmp_path, otlp_port=0))
    sp.install(wiring, FaustAgents(wiring))
    spans = _corpus_spans("langgraph.openinference")
    broken = next(s for s in spans if s["attributes"].get("openinference.span.kind") == "LLM")
    broken["attributes"]["llm.token_count.prompt"] = "twenty"
    [(trace_id, value)], oversize = trace_records(spans, 900_000)
    assert not oversize
    topic = wiring.topics["spans"].get_topic_name()
    sent = _run_agent(wiring, "otel-spans", sp.HELD, topic, [(trace_id.encode(), value)])
    sent += _run_agent(wiring, "otel-spans", sp.HELD, topic, [(None, sp.TICK)], first=1,
                       at=1_000.0 + sp.SETTLE_MS / 1000 + 0.5)  # the trace is due: published
    [(key, reason, run_id)] = _rejections(sent)
    holder = [value["run"] for topic_, _, value in sent if topic_.endswith(".otel-events")
              for e in value["events"] if e["doc"]["payload"].get("rejected", {}).get("spanId") == broken["spanId"]]
    assert (key, reason, [run_id]) == (run_id, "invalid_payload", holder) and run_id is not None
