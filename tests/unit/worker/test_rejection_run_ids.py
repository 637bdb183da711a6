"""A rejection names the run of what it rejects: the doc's runId, else the record's Kafka key (no broker).

The agents run as the worker runs them, on the transactional runtime in :class:`agentlog.worker.memory.MemoryWorker`;
each record is delivered with its raw key, as the agents' consumers fetch the ingest and ``otel-events`` records.
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
from agentlog.worker import spans as sp
from agentlog.worker.memory import MemoryWorker, memory_wiring
from agentlog.worker.otlp import decode_request, span_dicts, trace_records

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


def _run_agent(worker: MemoryWorker, agent_name: str, records: list[tuple[bytes | None, bytes]], *,
               at: float = 1_000.0) -> list[tuple[str, str | None, Any]]:
    """Hand ``agent_name`` the ``(key, value)`` records as the next batch of its topic's partition 0, fetched at
    ``at`` (seconds); the records it committed to every other topic."""
    topic = worker.wiring.tx_agents[agent_name].topic
    outputs = [short for short in worker.wiring.topics if worker.topic(short) != topic]
    before = {short: len(worker.records(short)) for short in outputs}
    asyncio.run(worker.feed(agent_name, [value for _, value in records], keys=[key for key, _ in records],
                            timestamp_ms=int(at * 1000)))
    return [(worker.topic(short), r.key.decode() if r.key is not None else None, orjson.loads(r.value))
            for short in outputs for r in worker.records(short)[before[short]:] if r.value is not None]


def _rejections(sent: list[tuple[str, str | None, Any]]) -> list[tuple[str | None, str, str | None]]:
    """``(record key, reason, runId)`` of each rejection sent."""
    return [(key, value["reason"], value["runId"]) for topic, key, value in sent if topic.endswith(".rejections")]


def test_the_sequencer_files_an_unreadable_record_under_its_key(tmp_path: Path) -> None:
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path)))
    worker.sequencer()
    gap = {"eventId": "e5", "runId": "doc-run", "type": "variable.changed", "payload": {"name": "v", "value": 1},
           "timestamp": "2025-03-04T05:06:07.089Z", "sequence": 5}
    sent = _run_agent(worker, "sequencer", [
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
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path, otlp_port=0)))
    sp.install(worker.wiring, worker.agents)
    spans = _corpus_spans("openai_agents.openllmetry")
    plan = plan_trace(spans[0]["traceId"], {s["spanId"]: s for s in spans}, published={})
    run, events = next(iter(plan.runs.items()))
    good = orjson.dumps({"run": run, "trace": plan.trace_id, "events": events})
    sent = _run_agent(worker, "otel-sequencer", [
        (b"conv-9", b"not json"),
        (run.encode(), good),
    ])
    assert _rejections(sent) == [("conv-9", "decode_error", "conv-9")]


def test_a_span_the_mapper_refuses_is_filed_under_the_run_that_holds_its_place(tmp_path: Path) -> None:
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path, otlp_port=0)))
    sp.install(worker.wiring, worker.agents)
    spans = _corpus_spans("langgraph.openinference")
    broken = next(s for s in spans if s["attributes"].get("openinference.span.kind") == "LLM")
    broken["attributes"]["llm.token_count.prompt"] = "twenty"
    [(trace_id, value)], oversize = trace_records(spans, 900_000)
    assert not oversize
    sent = _run_agent(worker, "otel-spans", [(trace_id.encode(), value)])
    sent += _run_agent(worker, "otel-spans", [(None, sp.TICK)],
                       at=1_000.0 + sp.SETTLE_MS / 1000 + 0.5)  # the trace is due: published
    [(key, reason, run_id)] = _rejections(sent)
    holder = [value["run"] for topic_, _, value in sent if topic_.endswith(".otel-events")
              for e in value["events"] if e["doc"]["payload"].get("rejected", {}).get("spanId") == broken["spanId"]]
    assert (key, reason, [run_id]) == (run_id, "invalid_payload", holder) and run_id is not None
