"""The sequencer redacts before hashing and sealing, on by default (no broker).

The redaction corpus (:mod:`tests.unit.redaction.corpus`) goes through the sequencer agent as the worker runs it, in
:class:`agentlog.worker.memory.MemoryWorker` (on :func:`agentlog.worker.memory.memory_wiring`, whose redactor is the
deployment's: the default policy here). What is checked is what the log holds: each committed doc opened with the
run's key is the redacted form, with what was done in its payload's ``$redactions``, and the chain hash covers it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from typing import Any

import pytest

from agentlog.core.redaction import Redactor, parse_policy
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.schemas.content import REDACTIONS, clear_tree, content_members
from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.settings import Settings
from agentlog.worker.memory import MemoryWorker, memory_wiring
from tests.unit.redaction import corpus
from tests.unit.redaction.test_corpus import _forms, _metadata

#: The kinds the goal asks 100% of (issue #42): structured values with a format or a checksum.
STRUCTURED = ("card", "iban", "email", "api_key", "jwt", "private_key")


def _load(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


PLANTED = _load(corpus.PLANTED)
CLEAN = _load(corpus.CLEAN)


def _worker(tmp_path, redactor: Redactor | None = None) -> MemoryWorker:
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path), redactor=redactor))
    worker.sequencer()
    return worker


def _committed(worker: MemoryWorker, docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[bytes | None]]:
    """Feed ``docs`` (one run each, at sequence 0); the log records in order, and every output's bytes (the records
    of every topic the sequencer writes, its tables' changelogs too)."""
    asyncio.run(worker.feed("sequencer", [encode_json(doc) for doc in docs]))
    logged = [decode_record(value) for value in worker.values("log")]
    assert not worker.values("rejections")
    changelogs = [table.changelog for table in worker.wiring.tables.values()]  # type: ignore[attr-defined]
    return logged, [*(v for short in worker.wiring.topics if short != "ingest" for v in worker.values(short)),
                    *(v for topic in changelogs for v in worker.log.values(topic))]


def _alone(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each entry's doc as the first event of a run of its own."""
    return [{**e["doc"], "runId": f"redact-{i}", "sequence": 0} for i, e in enumerate(entries)]


def test_the_planted_corpus_never_reaches_the_log(tmp_path):
    worker = _worker(tmp_path)
    logged, outputs = _committed(worker, _alone(PLANTED))
    assert len(logged) == len(PLANTED)
    missed, unrecorded = [], []
    for entry, record in zip(PLANTED, logged, strict=True):
        assert record["hash"] == chain_hash(GENESIS, record["doc"])  # the chain covers the stored form
        stored = worker.wiring.keyring.open(record["doc"])
        text = json.dumps(stored, ensure_ascii=False)
        if any(form in text for form in _forms(entry)):
            missed.append((entry["kind"], entry["value"]))
        rules = {r["rule"] for r in stored["payload"].get(REDACTIONS, [])}
        if entry["kind"] not in rules:
            unrecorded.append((entry["kind"], entry["value"]))
        assert entry["value"] not in json.dumps(stored["payload"].get(REDACTIONS), ensure_ascii=False)
    found = Counter(e["kind"] for e in PLANTED) - Counter(kind for kind, _ in missed)
    structured = {k: found[k] / n for k, n in Counter(e["kind"] for e in PLANTED).items() if k in STRUCTURED}
    assert structured == dict.fromkeys(STRUCTURED, 1.0)
    assert missed == [] and unrecorded == []
    # and nothing planted is in any byte the sequencer sent (log, keyring, snapshots, checkpoints)
    everything = b"".join(v for v in outputs if v is not None).decode("utf-8", "replace")
    assert not [e["value"] for e in PLANTED if e["kind"] in STRUCTURED and e["value"] in everything]


def test_the_clean_corpus_is_stored_as_published_but_for_under_one_percent(tmp_path):
    worker = _worker(tmp_path)
    docs = _alone(CLEAN)
    logged, _ = _committed(worker, docs)
    touched = [(e["kind"], e["value"]) for e, doc, record in zip(CLEAN, docs, logged, strict=True)
               if worker.wiring.keyring.open(record["doc"]) != doc]
    assert len(touched) / len(CLEAN) <= 0.01, touched


def test_the_record_is_clear_metadata_and_names_no_original(tmp_path):
    worker = _worker(tmp_path)
    doc = {"eventId": "e-0", "runId": "r-record", "type": "agent.toolReturned", "sequence": 0,
           "timestamp": "2026-11-28T10:00:00Z",
           "payload": {"callId": "c1", "tool": "crm.lookup", "isError": False,
                       "result": {"email": "alice@example.com", "notes": ["call +44 20 7946 0958", "ok"]},
                       REDACTIONS: [{"path": "payload.result", "rule": "forged", "action": "keep", "count": 1}]}}
    (record,), _ = _committed(worker, [doc])
    sealed = record["doc"]["payload"]
    # sealed content beside a clear record (a host's own "$redactions" replaced by the sequencer's)
    assert sealed[REDACTIONS] == [{"path": "payload.result", "rule": "email", "action": "mask", "count": 1},
                                  {"path": "payload.result", "rule": "phone", "action": "mask", "count": 1}]
    assert "$sealed" in sealed["result"]
    opened = worker.wiring.keyring.open(record["doc"])
    assert opened["payload"]["result"] == {"email": "[REDACTED:email]", "notes": ["call [REDACTED:phone]", "ok"]}


def test_a_redelivered_record_is_redacted_byte_identically():
    redactor = Redactor()
    for entry in PLANTED[::5]:
        first, again = redactor.stored(entry["doc"]), Redactor().stored(json.loads(json.dumps(entry["doc"])))
        assert encode_json(first) == encode_json(again)
        # published again (an export re-ingested), nothing is found again; the record, which only the sequencer
        # writes, is its own, so there is none
        again = redactor.stored(first)
        assert REDACTIONS not in again["payload"]
        assert again == {**first, "payload": {k: v for k, v in first["payload"].items() if k != REDACTIONS}}


def test_a_payload_that_is_not_an_object_keeps_its_record_beside_its_value():
    doc = {"eventId": "e", "runId": "r", "type": "log.appended", "sequence": 0, "timestamp": "2026-11-28T10:00:00Z",
           "payload": "mail bob@example.org"}
    assert Redactor().stored(doc)["payload"] == {
        REDACTIONS: [{"path": "payload", "rule": "email", "action": "mask", "count": 1}],
        "$value": "mail [REDACTED:email]"}
    dropped = Redactor(parse_policy("metrics_only = true").default).stored(doc)
    assert dropped["payload"] == {REDACTIONS: [{"path": "payload", "rule": "metrics-only", "action": "drop",
                                                "count": 1}]}


def test_metrics_only_stores_no_content_and_keeps_the_metadata(tmp_path):
    worker = _worker(tmp_path, Redactor(parse_policy("metrics_only = true").default))
    docs = _alone(PLANTED)
    logged, outputs = _committed(worker, docs)
    for doc, record in zip(docs, logged, strict=True):
        stored = worker.wiring.keyring.open(record["doc"])
        payload = stored["payload"]
        assert [p for p, _ in content_members(payload, clear_tree(doc["type"]))] == []
        assert {r["rule"] for r in payload[REDACTIONS]} == {"metrics-only"}
        kept = {**stored, "payload": {k: v for k, v in payload.items() if k != REDACTIONS}}
        assert kept == _metadata(doc)  # every metadata member as published, the envelope too
    everything = b"".join(v for v in outputs if v is not None).decode("utf-8", "replace")
    assert not [e["value"] for e in PLANTED if e["value"] in everything]


def test_a_metrics_only_class_keeps_no_content_of_its_runs_nor_of_their_children(tmp_path):
    worker = _worker(tmp_path, Redactor(parse_policy('[classes."ci"]\nmetrics_only = true\n').default))

    def run(run_id: str, started: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"eventId": f"{run_id}-0", "runId": run_id, "type": "run.started", "sequence": 0,
                 "timestamp": "2026-11-28T10:00:00Z", "payload": started},
                {"eventId": f"{run_id}-1", "runId": run_id, "type": "variable.changed", "sequence": 1,
                 "timestamp": "2026-11-28T10:00:01Z", "payload": {"name": "goal", "value": f"MARKER in {run_id}"}}]

    ci, child, prod = run("ci-run", {"runClass": "ci"}), run("ci-child", {"parentRunId": "ci-run"}), run(
        "prod-run", {"runClass": "prod"})
    logged, _ = _committed(worker, [*ci, *child, *prod])
    stored = {(r["doc"]["runId"], r["doc"]["sequence"]): worker.wiring.keyring.open(r["doc"]) for r in logged}
    for run_id in ("ci-run", "ci-child"):
        payload = stored[run_id, 1]["payload"]
        assert "value" not in payload and payload["name"] == "goal"  # the content dropped, the metadata kept
        assert payload[REDACTIONS] == [{"path": "payload.value", "rule": "metrics-only", "action": "drop",
                                        "count": 1}]
        assert worker.wiring.keyring.run_class(run_id) == "ci"  # the child's class is its parent's
    assert stored["prod-run", 1] == prod[1]
    assert worker.wiring.keyring.run_class("prod-run") == "prod"


def _rejections(worker: MemoryWorker, values: list[bytes]) -> list[dict[str, Any]]:
    """Feed ``values``; the rejections they made, as stored."""
    asyncio.run(worker.feed("sequencer", values))
    return [decode_record(value) for value in worker.values("rejections")]


@pytest.mark.parametrize(("policy", "raw", "detail"), [
    ("", b'{"runId": "r-bad", "note": "card 4111 1111 1111 1111, mail alice@example.com", \xff',
     [{"path": "raw", "rule": "card", "action": "mask", "count": 1},
      {"path": "raw", "rule": "email", "action": "mask", "count": 1}]),
    # a decoding error's detail can quote the bytes, so it is content too
    ("metrics_only = true\n", b'{"runId": "r-bad", "note": "nothing secret here"',
     [{"path": "raw", "rule": "metrics-only", "action": "drop", "count": 1},
      {"path": "detail", "rule": "metrics-only", "action": "drop", "count": 1}]),
])
def test_a_rejected_records_bytes_are_redacted_as_text_before_they_are_sealed(tmp_path, policy, raw, detail):
    worker = _worker(tmp_path, Redactor(parse_policy(policy).default))
    [stored] = _rejections(worker, [raw])
    assert stored["reason"] == "decode_error" and stored["redactions"] == detail
    opened = base64.b64decode(worker.wiring.keyring.open_rejection(stored)["raw"])
    if policy:
        assert opened == b""  # metrics-only: no content
    else:  # the rest as sent, bytes that are not UTF-8 included
        assert opened == (b'{"runId": "r-bad", "note": "card [REDACTED:card], mail [REDACTED:email]", \xff')


def test_a_rejection_with_nothing_to_redact_is_stored_as_before(tmp_path):
    worker = _worker(tmp_path)
    [stored] = _rejections(worker, [b'{"runId": "r-bad", "note": "plain"'])
    assert "redactions" not in stored
    keyring = worker.wiring.keyring
    assert base64.b64decode(keyring.open_rejection(stored)["raw"]) == b'{"runId": "r-bad", "note": "plain"'


@pytest.mark.parametrize("policy", ["[detectors]\nemail = \"off\"\n"])
def test_a_policy_relaxes_the_default(tmp_path, policy):
    worker = _worker(tmp_path, Redactor(parse_policy(policy).default))
    doc = {"eventId": "e", "runId": "r-relaxed", "type": "variable.changed", "sequence": 0,
           "timestamp": "2026-11-28T10:00:00Z", "payload": {"name": "to", "value": "alice@example.com"}}
    (record,), _ = _committed(worker, [doc])
    assert worker.wiring.keyring.open(record["doc"]) == doc
