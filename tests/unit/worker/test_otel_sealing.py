"""The span mapper keeps no content in plaintext outside ``spans`` and ``otel-events`` (in-memory worker, no broker).

Held chunks are sealed under their partition's hour key, which a tick shreds once the batch that published the
hour's last trace is durable; a record late for a shredded hour goes out at once. Rejections (a refusal the
receiver forwards, a span the mapping refuses, an ``otel-events`` record the run sequencer cannot read) are
sealed under the key of their partition (and run), minted once: a redelivered batch seals the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import orjson

from agentlog.core.keyring import runs_to_erase
from agentlog.core.otel import plan_trace
from agentlog.core.otel_sealing import HELD_BUCKET_MS, held_key_id, open_held, refusal, seal_held
from agentlog.core.redaction import Redactor, parse_policy
from agentlog.core.sealing import ERASED, is_sealed
from agentlog.streams.keyring import Keyring
from agentlog.worker import spans as sp
from agentlog.worker.otlp import trace_records
from tests.tools import REDACTION_OFF
from tests.unit.worker.test_spans import T0, _corpus_spans, _Mapper, _offline, _planned, _records

BUCKET = int(T0 * 1000) // HELD_BUCKET_MS


class _SealingMapper(_Mapper):
    """The mapper with a policy that redacts nothing: these tests check sealing, with markers that look random
    (which the default policy masks as high-entropy tokens); what redaction does to rejections is tested in
    ``tests/unit/worker/test_sequencer_redaction.py``."""

    def __init__(self, tmp_path: Any) -> None:
        super().__init__(tmp_path, Redactor(parse_policy(REDACTION_OFF).default))


def _marked(name: str = "openai_agents.openllmetry") -> tuple[str, list[dict[str, Any]]]:
    """A corpus trace whose spans carry a marker in an attribute (content, as a prompt would be)."""
    mark = f"MARK-{uuid.uuid4().hex}"
    spans = [{**s, "attributes": {**s["attributes"], "test.content": mark}} for s in _corpus_spans(name)]
    return mark, spans


def _keyring(mapper: _Mapper) -> Keyring:
    assert mapper.wiring.keyring is not None
    return mapper.wiring.keyring


def _changelog(mapper: _Mapper) -> list[bytes]:
    """Every record the mapper's table wrote to its changelog (keys and values)."""
    changelog = mapper.held.changelog
    read = asyncio.run(mapper.worker.log.read({(changelog, 0): 0}))[(changelog, 0)]
    return [(r.key or b"") + b"\0" + (r.value or b"") for r in read]


def _keyring_records(mapper: _Mapper) -> list[tuple[str, dict[str, Any]]]:
    return [(r.key.decode(), orjson.loads(r.value)) for r in _records(mapper.worker, "keyring") if r.key and r.value]


def test_held_spans_are_sealed_in_the_table_and_its_changelog_and_go_out_as_mapped(tmp_path):
    mark, spans = _marked()
    mapper = _SealingMapper(tmp_path)
    mapper.feed([value for _, value in trace_records(spans, 900_000)[0]])
    held_key = held_key_id(0, BUCKET)
    assert [k for k, _ in _keyring_records(mapper)] == [held_key]  # minted once, before the chunk
    assert mapper.held.get(0, "\x00heldkeys\x1f0") == [BUCKET]
    assert mark.encode() not in orjson.dumps(mapper.data) and not any(mark.encode() in r for r in _changelog(mapper))
    [chunk] = [v for k, v in mapper.data.items() if k.startswith(f"{spans[0]['traceId']}\x1f\x00")]
    assert chunk["sealedUnder"] == held_key and is_sealed(chunk["spans"])

    mapper.tick(T0 + 2)
    assert _planned(mapper.out("otel-events")) == _offline(spans)


def test_a_chunk_too_long_for_one_changelog_record_is_sealed_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(sp, "seal_held", lambda *a, **k: seal_held(*a, **k, piece_chars=1000))
    _, spans = _marked()
    mapper = _SealingMapper(tmp_path)
    [(_, value)] = trace_records(spans, 900_000)[0]
    mapper.feed([value])
    pieces = [k for k in mapper.data if k.startswith(f"{spans[0]['traceId']}\x1f\x000\x1f")]
    assert len(pieces) > 3 and all(len(mapper.data[k]) <= 1000 for k in pieces)
    mapper.tick(T0 + 2)
    assert mapper.held_keys(spans[0]["traceId"]) == []  # every piece deleted with its chunk
    assert _planned(mapper.out("otel-events")) == _offline(spans)


def test_a_tick_shreds_the_hours_key_once_the_batch_publishing_its_last_trace_is_durable(tmp_path):
    _, spans = _marked()
    mapper = _SealingMapper(tmp_path)
    mapper.feed([value for _, value in trace_records(spans, 900_000)[0]])
    mapper.tick(T0 + 2)  # the trace goes out; its hour's key stays for the hour
    held_key, keyring = held_key_id(0, BUCKET), _keyring(mapper)
    end_ms = (BUCKET + 1) * HELD_BUCKET_MS + sp.GRACE_MS
    assert not sp.shred_due(mapper.held, 0, end_ms - 1) and sp.shred_due(mapper.held, 0, end_ms)
    mapper.tick(end_ms / 1000)
    assert keyring.erased(held_key)
    assert [(k, v.get("erasedAtMs")) for k, v in _keyring_records(mapper)] == [(held_key, None), (held_key, end_ms)]
    mapper.tick(end_ms / 1000 + 0.5)  # sees the key gone: the hour is forgotten, no more ticks for it
    assert mapper.held.get(0, "\x00heldkeys\x1f0") is None and not sp.shred_due(mapper.held, 0, end_ms + 10**9)
    # What the changelog kept of the chunk is ciphertext whose key is gone.
    sealed = [orjson.loads(r.split(b"\0", 1)[1]) for r in _changelog(mapper) if b'"sealedUnder"' in r]
    assert sealed and all(open_held([v], keyring.key_for, "") is None for v in sealed)


def test_a_record_late_for_a_shredded_hour_goes_out_at_once_and_nothing_plain_is_written(tmp_path):
    mapper = _SealingMapper(tmp_path)
    end_ms = (BUCKET + 1) * HELD_BUCKET_MS + sp.GRACE_MS
    _, first = _marked()
    mapper.feed([trace_records(first, 900_000)[0][0][1]])
    mapper.tick(T0 + 2)
    mapper.tick(end_ms / 1000)
    assert _keyring(mapper).erased(held_key_id(0, BUCKET))
    before = len(mapper.out("otel-events"))
    mark, late = _marked("langgraph.openinference")
    mapper.feed([trace_records(late, 900_000)[0][0][1]], at=T0 + 5)  # a producer's clock an hour behind
    assert len(mapper.out("otel-events")) > before  # published at once, not held
    assert not any(mark.encode() in r for r in _changelog(mapper)) and mark.encode() not in orjson.dumps(
        mapper.data)
    assert mapper.held_keys(late[0]["traceId"]) == []


def test_a_redelivered_batch_seals_the_same_bytes_and_mints_no_second_key(tmp_path):
    mark, spans = _marked()
    broken = {k: v for k, v in spans[1].items() if k != "startNs"}  # rejected alone
    value = orjson.dumps({"traceId": spans[0]["traceId"], "spans": [spans[0], broken, *spans[2:]]})
    first = _SealingMapper(tmp_path / "first")
    first.feed([value])
    # The batch again, on a worker whose keyring holds the keys the first handling minted (as a partition's next
    # owner does once the keyring topic has them) and whose table and outputs have nothing of it.
    again = _SealingMapper(tmp_path / "again")
    again.wiring.keyring = first.wiring.keyring
    again.feed([value])
    assert again.data == first.data
    assert again.out("rejections") == first.out("rejections") != []
    assert _keyring_records(again) == []  # no second key for an id the keyring has
    assert not any(mark in orjson.dumps(r).decode() for r in first.out("rejections"))


def test_a_refusal_the_receiver_forwards_is_filed_sealed_under_its_spans_partition(tmp_path):
    mark = f"MARK-{uuid.uuid4().hex}"
    body = b"\x00not a trace export " + mark.encode()
    mapper = _SealingMapper(tmp_path)
    mapper.feed([sp.TICK, refusal("decode_error", f"not an OTLP trace export request ({mark})", body)])
    [stored] = mapper.out("rejections")
    assert mark not in orjson.dumps(stored).decode()
    assert stored["source"] == {"topic": mapper.topic, "partition": 0, "offset": 1, "timestampMs": int(T0 * 1000)}
    [opened] = mapper.rejections()
    assert (opened["reason"], opened["runId"]) == ("decode_error", None) and mark in opened["detail"]
    assert opened["raw"] == base64.b64encode(body).decode()
    assert [k for k, _ in _keyring_records(mapper)] == [f"rejections/~{mapper.topic}/0"]
    mapper.feed([orjson.dumps({"refused": "sequence_gap", "detail": "", "raw": ""})])  # not one it writes
    assert [r["reason"] for r in mapper.rejections()] == ["decode_error", "decode_error"]


def _broken_span_trace(user: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    spans = _corpus_spans("langgraph.openinference")
    broken = next(s for s in spans if s["attributes"].get("openinference.span.kind") == "LLM")
    broken["attributes"]["llm.token_count.prompt"] = "twenty"
    broken["attributes"]["user.id"] = user
    return spans, broken


def test_a_span_the_mapping_refuses_is_sealed_under_its_partition_and_run_which_erasing_reaches(tmp_path):
    user = f"u-{uuid.uuid4().hex[:6]}@example.com"
    spans, broken = _broken_span_trace(user)
    mapper = _SealingMapper(tmp_path)
    mapper.feed([trace_records(spans, 900_000)[0][0][1]])
    mapper.tick(T0 + sp.SETTLE_MS / 1000 + 0.5)
    [opened] = mapper.rejections()
    run = opened["runId"]
    assert run is not None and orjson.loads(base64.b64decode(opened["raw"]))["spanId"] == broken["spanId"]
    key_id = f"rejections/~{mapper.topic}/0/{run}"
    keyring = _keyring(mapper)
    record = keyring.record(key_id)
    assert record is not None and record.parent_run_id == run and record.subject in keyring.tags(user)
    # Erasing the span's subject reaches the key; so does erasing the run, or its subject, through the parent
    # link once the sequencer has the run's own key record.
    assert key_id in runs_to_erase(keyring.records(), subject=keyring.tags(user))
    keyring.mint(run, "the-runs-subject", None)
    assert key_id in runs_to_erase(keyring.records(), run=run)
    assert key_id in runs_to_erase(keyring.records(), subject=keyring.tags("the-runs-subject"))


def test_a_span_of_an_erased_run_is_filed_erased(tmp_path):
    spans, broken = _broken_span_trace("someone")
    mapper = _SealingMapper(tmp_path)
    run = plan_trace(spans[0]["traceId"], {s["spanId"]: s for s in spans}, published={}).published[
        broken["spanId"]]["run"]
    keyring = _keyring(mapper)
    _, record = keyring.mint(run, "someone", None)
    keyring.put(record.erase(1))
    mapper.feed([trace_records(spans, 900_000)[0][0][1]])
    mapper.tick(T0 + sp.SETTLE_MS / 1000 + 0.5)
    [stored] = mapper.out("rejections")
    assert (stored["runId"], stored["raw"], stored["detail"]) == (run, ERASED, ERASED)


def test_an_otel_events_record_the_run_sequencer_cannot_read_is_sealed_under_its_partition_and_run(tmp_path):
    mapper = _SealingMapper(tmp_path)
    topic = mapper.worker.topic("otel-events")
    mark = f"MARK-{uuid.uuid4().hex}"
    asyncio.run(mapper.worker.feed("otel-sequencer", [mark.encode()], keys=[b"conv-9"]))
    [(key, stored)] = [(r.key, orjson.loads(r.value or b"")) for r in _records(mapper.worker, "rejections")]
    assert key == b"conv-9" and mark not in orjson.dumps(stored).decode()
    assert [k for k, _ in _keyring_records(mapper)] == [f"rejections/~{topic}/0/conv-9"]
    opened = _keyring(mapper).open_rejection(stored)
    assert mark in base64.b64decode(opened["raw"]).decode()
