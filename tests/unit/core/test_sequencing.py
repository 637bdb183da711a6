"""The sequencer's whole decision for one ingest record, without a broker.

``agentlog.core.sequencing.sequence`` decodes, validates and decides; the worker's agent only
feeds it records and writes what it returns. So every rejection reason the contract lists
(CONTRACT.md "Rejection", ``agentlog.schemas.validate.REJECTION_CODES``) is pinned here by one test with a
hand-made raw value, plus the accepted / redelivered / head-repair outcomes and the rejection
record. Expected hashes come from ``agentlog.schemas.canonical.chain_hash`` (the primitive the contract
defines the chain with), never from the function under test.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct

import pytest
import rfc8785

from agentlog.core.sequencing import (
    RAW_MAX_BYTES,
    Accepted,
    Decoded,
    Handled,
    Redelivered,
    Rejected,
    Source,
    rejection_record,
    sequence,
)
from agentlog.schemas.avro import encode_avro
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.schemas.validate import REJECTION_CODES

SRC = Source("t.ingest", 1, 41, 1_700_000_000_000)
MAX = 1_048_576


def _doc(seq: int = 0, **over) -> dict:
    doc = {"eventId": f"r1:{seq}", "runId": "r1", "type": "variable.changed",
           "payload": {"name": "x", "value": seq}, "timestamp": "2025-01-15T10:00:00.000Z", "sequence": seq}
    doc.update(over)
    return doc


def _json(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class _Run:
    """A run's sequencer tables as plain dicts: head and eventId index."""

    def __init__(self, head: dict | None = None, index: dict | None = None) -> None:
        self.head, self.index = head, dict(index or {})
        self.asked: list[str] = []

    def head_of(self, run_id: str) -> dict | None:
        self.asked.append(run_id)
        return self.head

    def lookup_of(self, run_id: str):
        return self.index.get


def _run(raw: bytes, run: _Run | None = None, *, source: Source = SRC, max_bytes: int = MAX) -> Decoded:
    run = run or _Run()
    return sequence(raw, run.head_of, run.lookup_of, source, max_bytes=max_bytes)


def _reason(raw: bytes, run: _Run | None = None, **kw) -> str:
    decision = _run(raw, run, **kw).decision
    assert isinstance(decision, Rejected), decision
    assert decision.detail  # every rejection says why
    return decision.reason


# --- one test per reason code --------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b"hello, world",                        # text that is not JSON
    b"",                                    # empty value
    b'{"eventId": "x", ',                   # JSON cut short
    b'{"a": 1, "a": 2}',                    # duplicate key
    b'{"a": "\xff"}',                       # not UTF-8
], ids=["text", "empty", "truncated-json", "duplicate-key", "not-utf8"])
def test_decode_error_json(raw):
    decoded = _run(raw)
    assert decoded.decision.reason == "decode_error"
    assert decoded.doc is None and decoded.unexpected is None


def test_decode_error_avro_truncated_or_trailing():
    framed = encode_avro(_doc())
    assert _reason(framed[:-3]) == "decode_error"
    assert _reason(framed + b"\x00") == "decode_error"
    assert _reason(b"\x00\x00\x00") == "decode_error"  # not even a whole Confluent header


def test_bad_magic():
    assert _reason(b"\x07\x00\x00\x00\x01\x02ab") == "bad_magic"


def test_unknown_schema_id():
    body = encode_avro(_doc())[5:]
    assert _reason(b"\x00" + struct.pack(">I", 2) + body) == "unknown_schema_id"


@pytest.mark.parametrize("doc", [
    {k: v for k, v in _doc().items() if k != "timestamp"},
    _doc(sequence="0"),
    _doc(eventId=17),
    _doc(tenant="acme"),
    _doc(timestamp="yesterday"),
    _doc(sequence=-1),
], ids=["missing-timestamp", "sequence-string", "eventId-number", "unknown-field", "bad-timestamp",
        "negative-sequence"])
def test_invalid_envelope(doc):
    assert _reason(_json(doc)) == "invalid_envelope"


def test_unknown_event_type():
    assert _reason(_json(_doc(type="agent.teleported"))) == "unknown_event_type"


def test_unsafe_integer():
    # 2^53 + 1 is not a double: no reading of the literal is exact.
    assert _reason(b'{"eventId":"r1:0","runId":"r1","type":"variable.changed","payload":{"name":"x",'
                   b'"value":9007199254740993},"timestamp":"2025-01-15T10:00:00.000Z","sequence":0}') \
        == "unsafe_integer"
    assert _reason(_json(_doc(sequence=2**60))) == "unsafe_integer"


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_number(number):
    raw = (b'{"eventId":"r1:0","runId":"r1","type":"variable.changed","payload":{"name":"x","value":'
           + number + b'},"timestamp":"2025-01-15T10:00:00.000Z","sequence":0}')
    assert _reason(raw) == "non_finite_number"


def test_invalid_payload():
    assert _reason(_json(_doc(payload={"value": 1}))) == "invalid_payload"  # variable.changed needs a name


def test_oversize():
    raw = _json(_doc(type="channel.written", payload={"channel": "c", "value": "x" * 600}))
    assert _reason(raw, max_bytes=500) == "oversize"
    assert isinstance(_run(raw, max_bytes=2000).decision, Accepted)  # the same doc under a higher limit


def test_duplicate_event_id():
    # r1:0 was committed from another source record (partition 0, offset 7); a new record reuses its eventId.
    run = _Run({"next": 1, "hash": "a" * 64}, {"r1:0": [0, "a" * 64, 0, 7]})
    assert _reason(_json(_doc(1, eventId="r1:0")), run) == "duplicate_event_id"


def test_sequence_gap():
    assert _reason(_json(_doc(2))) == "sequence_gap"  # a new run starts at 0
    assert _reason(_json(_doc(5)), _Run({"next": 3, "hash": "a" * 64})) == "sequence_gap"


def test_sequence_conflict():
    run = _Run({"next": 3, "hash": "a" * 64}, {"r1:0": [0, "b" * 64, 1, 1]})
    assert _reason(_json(_doc(1, eventId="r1:new")), run) == "sequence_conflict"


def test_dangling_causation():
    run = _Run({"next": 1, "hash": "a" * 64}, {"r1:0": [0, "a" * 64, 1, 40]})
    assert _reason(_json(_doc(1, causationId="r1:nowhere")), run) == "dangling_causation"
    # Naming an earlier event of the run is fine.
    assert isinstance(_run(_json(_doc(1, causationId="r1:0")), run).decision, Accepted)


def _closed(reason: str, at: int):
    return lambda run_id: {"reason": reason, "next": 5, "hash": "c" * 64, "at": at} if run_id == "r1" else None


@pytest.mark.parametrize(("closed_as", "code"), [("completed", "run_closed"), ("expired", "run_expired")])
def test_an_event_after_its_runs_close_request_is_refused_with_the_way_it_closed(closed_as, code):
    # Whatever the head or index say (a crash may leave them beside the marker), the marker decides.
    run = _Run({"next": 5, "hash": "c" * 64})
    for raw in (_json(_doc(5)), _json(_doc(0, eventId="r1:fresh")), _json(_doc(2, eventId="r1:2"))):
        decided = sequence(raw, run.head_of, run.lookup_of, SRC, max_bytes=MAX, closed_of=_closed(closed_as, 41))
        assert isinstance(decided.decision, Rejected)
        assert decided.decision.reason == code
        assert "r1" in decided.decision.detail and "sequence 4" in decided.decision.detail


def test_a_record_before_its_runs_close_request_was_handled_then():
    run = _Run()  # head and index deleted by the close
    decided = sequence(_json(_doc(3)), run.head_of, run.lookup_of, SRC, max_bytes=MAX,
                       closed_of=_closed("completed", SRC.offset + 1))
    assert isinstance(decided.decision, Handled)
    # A record that breaks the contract is refused for that, closed run or not.
    assert _reason(_json(_doc(3, type="no.such.type")), run) == "unknown_event_type"


def test_other_runs_are_decided_as_usual_beside_a_closed_one():
    decided = sequence(_json(_doc(0, runId="r2", eventId="r2:0")), _Run().head_of, _Run().lookup_of, SRC,
                       max_bytes=MAX, closed_of=_closed("completed", 0))
    assert isinstance(decided.decision, Accepted)


def test_an_event_of_an_erased_run_is_refused_whatever_else_holds():
    run = _Run({"next": 5, "hash": "c" * 64})
    for raw in (_json(_doc(5)), _json(_doc(0, eventId="r1:fresh"))):
        decided = sequence(raw, run.head_of, run.lookup_of, SRC, max_bytes=MAX, closed_of=_closed("completed", 41),
                           erased_of=lambda run_id: run_id == "r1")
        assert isinstance(decided.decision, Rejected)
        assert decided.decision.reason == "run_erased" and "r1" in decided.decision.detail
    other = sequence(_json(_doc(0, runId="r2", eventId="r2:0")), _Run().head_of, _Run().lookup_of, SRC,
                     max_bytes=MAX, erased_of=lambda run_id: run_id == "r1")
    assert isinstance(other.decision, Accepted)


def test_an_accepted_doc_is_chained_in_the_form_the_seal_gives_it():
    from agentlog.core.sealing import DataKey, open_event, seal_event
    from agentlog.schemas.canonical import GENESIS, chain_link

    key = DataKey("k1", bytes(range(32)))
    doc = _doc(0, type="variable.changed", payload={"name": "x", "value": "MARKER-7f3a"})
    decided = sequence(_json(doc), _Run().head_of, _Run().lookup_of, SRC, max_bytes=MAX,
                       seal=lambda d: seal_event(d, key))
    assert isinstance(decided.decision, Accepted)
    committed = decided.decision.committed
    assert b"MARKER-7f3a" not in decided.decision.doc_bytes
    assert committed["hash"] == chain_link(GENESIS, committed["doc"])[0]
    assert open_event(committed["doc"], {"k1": key}.get)["payload"] == doc["payload"]


def test_every_contract_reason_has_a_test_here():
    tested = {"decode_error", "bad_magic", "unknown_schema_id", "invalid_envelope", "unknown_event_type",
              "unsafe_integer", "non_finite_number", "invalid_payload", "oversize", "duplicate_event_id",
              "sequence_gap", "sequence_conflict", "dangling_causation", "run_closed", "run_expired", "run_erased"}
    # The worker's own reason, for an accepted event it cannot fold: tests/unit/core/test_runstate.py.
    assert tested | {"run_state_unavailable"} == REJECTION_CODES


# --- accepted, redelivered, head repair ----------------------------------------------------------


def test_first_event_is_accepted_on_the_genesis_hash():
    doc = _doc(0)
    decoded = _run(_json(doc))
    assert decoded.doc == doc and decoded.unexpected is None
    expected_hash = chain_hash("0" * 64, doc)
    assert decoded.decision == Accepted(
        committed={"doc": doc, "prevHash": "0" * 64, "hash": expected_hash,
                   "source": {"topic": "t.ingest", "partition": 1, "offset": 41, "timestampMs": 1_700_000_000_000}},
        head={"next": 1, "hash": expected_hash},
        index_entry=("r1:0", [0, expected_hash, 1, 41]),
        doc_bytes=rfc8785.dumps(doc),  # the doc's JCS bytes, reused for the log record
    )


def test_next_event_chains_on_the_head_and_reads_avro_like_json():
    first = _doc(0)
    h0 = chain_hash(GENESIS, first)
    doc = _doc(1, causationId="r1:0")
    run = _Run({"next": 1, "hash": h0}, {"r1:0": [0, h0, 1, 41]})
    for raw in (_json(doc), encode_avro(doc)):
        decision = _run(raw, run, source=Source("t.ingest", 1, 42, 5)).decision
        assert isinstance(decision, Accepted)
        assert decision.committed["prevHash"] == h0
        assert decision.committed["hash"] == chain_hash(h0, doc)
        assert decision.committed["doc"] == doc
        assert decision.head == {"next": 2, "hash": chain_hash(h0, doc)}
        assert decision.index_entry == ("r1:1", [1, chain_hash(h0, doc), 1, 42])
    assert run.asked == ["r1", "r1"]


def test_cross_host_causation_is_accepted():
    doc = _doc(0, type="agent.handoff", payload={"causationHostId": "host-b"}, causationId="elsewhere:9")
    assert isinstance(_run(_json(doc)).decision, Accepted)


def test_redelivered_record_appends_nothing_whether_its_head_is_past_it_or_behind_it():
    h1 = "c" * 64
    run = _Run({"next": 2, "hash": h1}, {"r1:1": [1, h1, 1, 41]})  # the same source: partition 1, offset 41
    assert _run(_json(_doc(1)), run).decision == Redelivered(sequence=1)
    # A crash made the index entry of sequence 1 durable but not the run record after it: the sequencer
    # folds it again (agentlog.worker.sequencer), the decision is the same.
    behind = _Run({"next": 1, "hash": "b" * 64}, {"r1:1": [1, h1, 1, 41]})
    assert _run(_json(_doc(1)), behind).decision == Redelivered(sequence=1)
    assert _run(_json(_doc(1)), _Run(None, {"r1:1": [1, h1, 1, 41]})).decision == Redelivered(sequence=1)


def test_an_error_nobody_anticipated_is_a_rejection_not_a_crash():
    def head_of(run_id):
        raise RuntimeError("table unavailable")

    decoded = sequence(_json(_doc()), head_of, lambda run_id: {}.get, SRC, max_bytes=MAX)
    assert decoded.decision.reason == "invalid_envelope"
    assert "RuntimeError" in decoded.decision.detail
    assert isinstance(decoded.unexpected, RuntimeError)


# --- the rejection record ------------------------------------------------------------------------


def test_rejection_record_carries_reason_raw_bytes_and_source():
    raw = b'{"eventId":"e-1","runId":"r1","sequence":5}'
    rec = rejection_record("sequence_gap", "expected 3", raw, SRC, {"eventId": "e-1", "runId": "r1", "sequence": 5})
    assert rec == {"reason": "sequence_gap", "detail": "expected 3", "runId": "r1", "eventId": "e-1", "sequence": 5,
                   "source": {"topic": "t.ingest", "partition": 1, "offset": 41, "timestampMs": 1_700_000_000_000},
                   "raw": base64.b64encode(raw).decode()}


def test_rejection_record_copies_only_sane_ids_and_safe_sequences():
    rec = rejection_record("invalid_envelope", "x" * 5000, b"{}", SRC,
                           {"eventId": 17, "runId": "r" * 257, "sequence": 2**60})
    assert (rec["eventId"], rec["runId"], rec["sequence"]) == (None, None, None)
    assert len(rec["detail"]) == 2000
    assert rejection_record("bad_magic", "d", b"\x07", SRC)["runId"] is None  # no doc at all
    assert rejection_record("invalid_envelope", "d", b"{}", SRC, {"sequence": True})["sequence"] is None


def test_rejection_record_truncates_an_oversize_value():
    raw = b"{" + b"x" * (300 * 1024)
    rec = rejection_record("oversize", "big", raw, SRC)
    assert base64.b64decode(rec["raw"]) == raw[:256 * 1024]
    assert (rec["rawTruncated"], rec["rawBytes"], rec["rawSha256"]) == (True, len(raw), hashlib.sha256(raw).hexdigest())
    assert RAW_MAX_BYTES == 256 * 1024  # CONTRACT.md: 256 KiB
    exact = rejection_record("oversize", "big", raw[:256 * 1024], SRC)
    assert "rawTruncated" not in exact and base64.b64decode(exact["raw"]) == raw[:256 * 1024]
