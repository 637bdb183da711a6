"""What the OTel path seals and under which keys, as pure functions (no worker, no broker).

The worker's side (the span mapper sealing, filing and shredding on the memory ports) is
``tests/unit/worker/test_otel_sealing.py``.
"""

from __future__ import annotations

import base64
import hashlib
import os

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.core.otel import due
from agentlog.core.otel_sealing import (
    HELD_BUCKET_MS,
    held_bucket,
    held_key_id,
    held_pieces,
    open_held,
    refusal,
    refusal_rejection,
    seal_held,
    shreddable,
)
from agentlog.core.sealing import DataKey, SealError
from agentlog.core.sequencing import RAW_MAX_BYTES, Source, rejection_record, rejection_sealing
from agentlog.schemas.records import record_source

SPANS_AT = record_source(topic="p.spans", partition=3, offset=41, timestamp_ms=7)
GRACE_MS = 30_000


def _key() -> DataKey:
    return DataKey(os.urandom(8).hex(), os.urandom(32))


# --- refusals: the receiver forwards, the span mapper files ------------------------------------------------------


def test_a_refusal_carries_what_was_refused_and_files_as_a_rejection_at_its_spans_position():
    raw = b'{"name": "chat", "attributes": {"gen_ai.input.messages": "hello"}}'
    record = orjson.loads(refusal("oversize", "span 'chat': too big", raw, "ab" * 16))
    assert record == {"refused": "oversize", "detail": "span 'chat': too big",
                      "raw": base64.b64encode(raw).decode(), "traceId": "ab" * 16}
    filed = refusal_rejection(record, SPANS_AT)
    assert filed == {"reason": "oversize", "detail": "span 'chat': too big", "runId": None, "eventId": None,
                     "sequence": None, "source": SPANS_AT, "raw": record["raw"]}
    assert rejection_sealing(filed) == ("rejections/~p.spans/3", "p.spans:3:41")


def test_a_refused_body_over_the_raw_limit_is_cut_with_its_length_and_digest():
    body = os.urandom(RAW_MAX_BYTES + 10)
    record = orjson.loads(refusal("decode_error", "not a trace export", body))
    assert "traceId" not in record
    assert base64.b64decode(record["raw"]) == body[:RAW_MAX_BYTES]
    filed = refusal_rejection(record, SPANS_AT)
    assert (filed["rawTruncated"], filed["rawBytes"], filed["rawSha256"]) == (
        True, len(body), hashlib.sha256(body).hexdigest())


@pytest.mark.parametrize("record", [
    {"refused": "sequence_gap", "detail": "", "raw": ""},            # not a reason the receiver gives
    {"refused": "oversize", "detail": 3, "raw": ""},
    {"refused": "oversize", "detail": "", "raw": "not base64!"},
    {"refused": "oversize", "detail": "", "raw": "", "rawBytes": 9},  # a length without its digest
    {"refused": "oversize", "detail": "", "raw": base64.b64encode(b"x" * (RAW_MAX_BYTES + 1)).decode()},
])
def test_what_is_not_a_refusal_the_receiver_writes_is_refused(record):
    with pytest.raises(ValueError):
        refusal_rejection(record, SPANS_AT)


# --- which key a rejection is sealed under: one writer each, the same for every reader ---------------------------


def test_the_sequencers_rejections_are_sealed_by_run_and_the_otel_agents_by_partition_and_run():
    ingest = rejection_record("invalid_payload", "", b"{}", Source("p.ingest", 2, 9, 0), {"runId": "r1"})
    assert rejection_sealing(ingest) == ("rejections/r1", "p.ingest:2:9")
    assert rejection_sealing({**ingest, "runId": None}) == ("rejections/~p.ingest/2", "p.ingest:2:9")
    # A run's spans come through several partitions of spans (one per trace) and of otel-events (one per run,
    # but the ingest sequencer writes rejections/<run>): each agent seals under its own partition's entry.
    for topic in ("p.spans", "a.b.otel-events"):
        mapped = {**ingest, "source": {"topic": topic, "partition": 4, "offset": 12, "timestampMs": 0}}
        assert rejection_sealing(mapped) == (f"rejections/~{topic}/4/r1", f"{topic}:4:12")
        assert rejection_sealing({**mapped, "runId": None}) == (f"rejections/~{topic}/4", f"{topic}:4:12")


# --- held spans: sealed per partition and hour, the hour's key shredded once nothing in it can be held ----------


def test_a_held_key_is_named_by_partition_and_hour():
    assert held_key_id(5, 493_000) == "held/~spans/5/493000"
    assert held_bucket(3 * HELD_BUCKET_MS + 5, 3 * HELD_BUCKET_MS + 9) == 3
    assert held_bucket(4 * HELD_BUCKET_MS + 5, 3 * HELD_BUCKET_MS + 9) == 4  # a chunk stamped before its trace's first
    assert not shreddable(3, 4 * HELD_BUCKET_MS + GRACE_MS - 1, grace_ms=GRACE_MS)
    assert shreddable(3, 4 * HELD_BUCKET_MS + GRACE_MS, grace_ms=GRACE_MS)


@given(first=st.integers(0, 10 * HELD_BUCKET_MS), late=st.integers(-HELD_BUCKET_MS, HELD_BUCKET_MS),
       now=st.integers(0, 12 * HELD_BUCKET_MS), settle=st.integers(0, GRACE_MS))
def test_a_trace_is_due_at_every_tick_that_can_shred_the_key_of_any_of_its_chunks(first, late, now, settle):
    arrived = max(0, first + late)  # another producer's clock: before or after the trace's first spans
    entry = {"pending": ["s1"], "firstMs": first, "lastMs": max(first, arrived), "rootSeen": False}
    if shreddable(held_bucket(first, arrived), now, grace_ms=GRACE_MS):
        assert due(entry, now, settle_ms=settle, grace_ms=GRACE_MS, max_spans=10_000)


def test_held_spans_open_again_under_their_key_and_place_only():
    key, spans = _key(), [{"spanId": "01" * 8, "attributes": {"gen_ai.input.messages": "hello"}}]
    [head] = seal_held(spans, key, "held/~spans/0/7", "t\x1f\x005")
    assert head["sealedUnder"] == "held/~spans/0/7" and b"hello" not in orjson.dumps(head)
    assert held_pieces(head) == 1
    assert open_held([head], {key.key_id: key}.get, "t\x1f\x005") == spans
    assert open_held([head], lambda _: None, "t\x1f\x005") is None  # shredded
    with pytest.raises(SealError):
        open_held([head], {key.key_id: key}.get, "t\x1f\x006")  # copied to another chunk
    assert open_held([spans], {}.get, "t\x1f\x005") == spans  # a chunk held before chunks were sealed


def test_a_long_sealed_chunk_is_stored_in_pieces_that_open_only_together():
    key = _key()
    spans = [{"spanId": f"{i:016x}", "attributes": {"gen_ai.output.messages": "y" * 900}} for i in range(40)]
    values = seal_held(spans, key, "held/~spans/0/7", "c", piece_chars=10_000)
    head, *rest = values
    assert held_pieces(head) == len(values) > 2 and all(isinstance(p, str) and len(p) <= 10_000 for p in rest)
    assert len(head["spans"]["$sealed"]) <= 10_000
    assert open_held(values, {key.key_id: key}.get, "c") == spans
    with pytest.raises(ValueError):
        open_held(values[:-1], {key.key_id: key}.get, "c")
    with pytest.raises(ValueError):
        open_held([head, *rest[:-1], None], {key.key_id: key}.get, "c")
