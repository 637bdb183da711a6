"""A corpus of bad ingest records, raw bytes straight to the topic, mixed with good events.

Every bad record must come out as exactly one rejection with the reason CONTRACT.md names and
its source (partition, offset); a legal-but-wrong handoff event is committed and flagged with
its violation code; every good event is committed; the worker is alive at the end and still
commits a good event produced after the whole corpus. Lost and duplicated records are counted
by source position over the log and the rejections (``tests/faults/accounting.py``).

The hand-written corpus fixes one record per reason code. Hypothesis adds generated garbage
(random binary, framed Avro with random bodies or unknown schema ids, '{'-prefixed junk) and
mutated docs (a required field dropped or wrong-typed, an unknown envelope field, an unsafe
integer in the payload); those are produced together and checked once.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import re
import struct
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import MessageSizeTooLargeError
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agentlog.schemas.avro import encode_avro
from agentlog.schemas.canonical import jcs
from agentlog.streams.admin import ensure_topics
from agentlog.streams.reader import read_rejections, read_run, read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from tests.faults.accounting import Landing, landing
from tests.faults.gen import synthetic_run
from tests.integration.replay.helpers import HandLog
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.timeout(900)]

REASONS = {"decode_error", "bad_magic", "unknown_schema_id", "invalid_envelope", "unknown_event_type",
           "unsafe_integer", "non_finite_number", "invalid_payload", "oversize", "duplicate_event_id",
           "sequence_gap", "sequence_conflict", "dangling_causation"}
BIG_LIMIT = 4 * 1024 * 1024  # ingest topic max.message.bytes, so a > 1 MiB doc reaches the sequencer


@dataclass
class Item:
    label: str
    key: str | None
    value: bytes | None
    expect: set[str]  # allowed rejection reasons; empty = must be accepted
    violation: str | None = None
    event_id: str | None = None
    run_id: str | None = None
    partition: int = -1
    offset: int = -1


def _json(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _hand_corpus(tag: str) -> tuple[list[Item], dict[str, list[dict]]]:
    """Good runs interleaved with one bad record per reason, in an order that makes each bad."""
    good_s = synthetic_run(f"bad-{tag}-s", 12, __import__("random").Random(3))
    parent = realistic_run(f"bad-{tag}-p", mode="check")
    s_id, p_id = good_s[0]["runId"], parent[0]["runId"]
    items: list[Item] = []

    def good(doc: dict, *, avro: bool) -> None:
        items.append(Item(f"good {doc['runId']}#{doc['sequence']}", doc["runId"],
                          encode_avro(doc) if avro else jcs(doc), set(), event_id=doc["eventId"],
                          run_id=doc["runId"]))

    def bad(label: str, key: str | None, value: bytes | None, reason: str) -> None:
        items.append(Item(label, key, value, {reason}, run_id=key))

    for i, doc in enumerate(good_s[:6]):
        good(doc, avro=i % 2 == 0)
    template = good_s[6]
    bad("not JSON", s_id, b"hello, world", "decode_error")
    bad("JSON syntax error", s_id, b'{"eventId": "x", ', "decode_error")
    bad("empty value", s_id, b"", "decode_error")
    bad("tombstone (null value)", s_id, None, "decode_error")
    bad("JSON array", None, b"[1, 2, 3]", "decode_error")
    bad("truncated Avro", s_id, encode_avro(template)[:-7], "decode_error")
    bad("wrong magic byte", s_id, b"\x07" + encode_avro(template)[1:], "bad_magic")
    bad("unknown schema id", s_id, b"\x00" + struct.pack(">I", 4242) + encode_avro(template)[5:],
        "unknown_schema_id")
    bad("sequence as a string", s_id, _json({**template, "sequence": "6"}), "invalid_envelope")
    bad("eventId as a number", s_id, _json({**template, "eventId": 17}), "invalid_envelope")
    bad("missing timestamp", s_id, _json({k: v for k, v in template.items() if k != "timestamp"}),
        "invalid_envelope")
    bad("unknown envelope field", s_id, _json({**template, "tenant": "acme"}), "invalid_envelope")
    bad("bad timestamp", s_id, _json({**template, "timestamp": "yesterday"}), "invalid_envelope")
    bad("huge int 2^60 in payload", s_id,
        _json({**template, "type": "variable.changed", "payload": {"name": "n", "value": 2 ** 60}}),
        "unsafe_integer")
    bad("huge int 2^60 as sequence", s_id, _json({**template, "sequence": 2 ** 60}), "unsafe_integer")
    bad("NaN literal", s_id,
        _json({**template, "type": "variable.changed", "payload": {"name": "n", "value": 0}})
        .replace(b'"value":0', b'"value":NaN'), "non_finite_number")
    bad("Infinity literal", s_id,
        _json({**template, "type": "variable.changed", "payload": {"name": "n", "value": 0}})
        .replace(b'"value":0', b'"value":Infinity'), "non_finite_number")
    bad("unknown event type", s_id, _json({**template, "type": "agent.teleported"}), "unknown_event_type")
    bad("payload breaks its model", s_id,
        _json({**template, "type": "variable.changed", "payload": {"value": 1}}), "invalid_payload")
    bad("oversize (> 1 MiB)", s_id,
        _json({**template, "type": "channel.written", "payload": {"channel": "big", "value": "x" * 1_100_000}}),
        "oversize")
    bad("sequence gap", s_id, _json({**template, "eventId": f"{s_id}:gap", "sequence": 9}), "sequence_gap")
    bad("duplicate eventId", s_id, _json({**good_s[2]}), "duplicate_event_id")
    bad("duplicate eventId, new sequence", s_id, _json({**good_s[3], "sequence": 6}), "duplicate_event_id")
    bad("sequence conflict", s_id, _json({**template, "eventId": f"{s_id}:conflict", "sequence": 1}),
        "sequence_conflict")
    bad("dangling causation", s_id, _json({**template, "causationId": f"{s_id}:nowhere"}), "dangling_causation")
    for i, doc in enumerate(good_s[6:]):
        good(doc, avro=i % 2 == 1)

    # Handoff: legal envelopes, illegal machines -> committed and flagged.
    for i, doc in enumerate(parent):
        good(doc, avro=i % 3 == 0)
    began = next(d for d in parent if d["type"] == "core.workflowChain.event")
    seq = len(parent)

    def chain(label: str, payload: dict, cause: str, code: str) -> None:
        nonlocal seq
        doc = {"eventId": f"{p_id}:bad{seq}", "runId": p_id, "type": "core.workflowChain.event",
               "payload": {"parentRunId": p_id, **payload}, "timestamp": "2025-01-15T10:01:00.000Z",
               "sequence": seq, "causationId": cause}
        items.append(Item(label, p_id, jcs(doc), set(), violation=code, event_id=doc["eventId"], run_id=p_id))
        parent.append(doc)
        seq += 1

    chain("illegal transition (child.completed after harvest)",
          {"phase": "child.completed", "workerId": "worker-a", "childRunId": f"{p_id}.child-a"},
          began["eventId"], "illegal_transition")
    chain("unknown dispatch", {"phase": "child.failed", "workerId": "worker-zz"}, began["eventId"],
          "unknown_dispatch")
    bad("unknown chain phase (payload model)", p_id,
        _json({"eventId": f"{p_id}:phase", "runId": p_id, "type": "core.workflowChain.event",
               "payload": {"phase": "dispatch.teleported", "workerId": "worker-a", "parentRunId": p_id},
               "timestamp": "2025-01-15T10:01:00.000Z", "sequence": seq}), "invalid_payload")
    return items, {s_id: good_s, p_id: parent}


def _hypothesis_corpus(tag: str) -> list[Item]:
    items: list[Item] = []
    counter = iter(range(10**6))
    template = synthetic_run(f"hyp-{tag}", 3, __import__("random").Random(5))[1]

    def fresh(doc: dict) -> dict:
        n = next(counter)
        return {**copy.deepcopy(doc), "runId": f"hyp-{tag}-{n}", "eventId": f"hyp-{tag}-{n}:e", "sequence": 0}

    garbage = st.one_of(
        st.binary(min_size=1, max_size=200).filter(lambda b: b[0] not in b"\x00{ \t\r\n")
        .map(lambda b: ("random binary", b, {"decode_error", "bad_magic"})),
        st.tuples(st.integers(0, 2**32 - 1).filter(lambda i: i != 1), st.binary(max_size=100))
        .map(lambda t: ("unknown schema id", b"\x00" + struct.pack(">I", t[0]) + t[1], {"unknown_schema_id"})),
        st.binary(max_size=120)
        .map(lambda b: ("framed Avro, random body", b"\x00\x00\x00\x00\x01" + b,
                        {"decode_error", "invalid_envelope", "unknown_event_type", "invalid_payload",
                         "unsafe_integer"})),
        st.text(max_size=80)
        .map(lambda t: ("'{' junk", b"{" + t.encode(), {"decode_error", "invalid_envelope", "non_finite_number",
                                                        "unsafe_integer"})),
    )
    required = ["eventId", "runId", "type", "payload", "timestamp", "sequence"]
    wrong = st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
                      st.floats(allow_nan=False, allow_infinity=False))
    mutated = st.one_of(
        st.sampled_from(required).map(lambda f: ("drop " + f, ("drop", f, None), {"invalid_envelope"})),
        st.tuples(st.sampled_from(["eventId", "runId", "type", "timestamp", "sequence", "nodeId"]), wrong)
        .filter(lambda t: not (t[0] == "sequence" and type(t[1]) is int and t[1] >= 0))
        .map(lambda t: ("wrong type " + t[0], ("set", t[0], t[1]), {"invalid_envelope"})),
        st.text(min_size=1, max_size=12).filter(lambda k: k not in {
            *required, "nodeId", "schemaVersion", "engineVersion", "causationId"})
        .map(lambda k: ("unknown field", ("set", k, 1), {"invalid_envelope"})),
        # Odd integers above 2^53 are not doubles, so no reading of the literal is safe. (A literal
        # such as 2^53 itself is exactly a double's JCS spelling and reads as that double: accepted.)
        st.integers(min_value=0, max_value=2**60)
        .map(lambda k: ("unsafe int payload", ("payload", "value", 2**53 + 2 * k + 1), {"unsafe_integer"})),
    )

    @hsettings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(garbage)
    def collect_garbage(g):
        label, value, expect = g
        items.append(Item("hyp " + label, None, value, expect))

    @hsettings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutated)
    def collect_mutated(m):
        label, (op, name, value), expect = m
        doc = fresh(template)
        if op == "drop":
            doc.pop(name)
        elif op == "set":
            doc[name] = value
        else:
            doc["payload"] = {**doc["payload"], name: value}
        key = doc.get("runId") if isinstance(doc.get("runId"), str) else None
        items.append(Item("hyp " + label, key, _json(doc), expect, run_id=key))

    collect_garbage()
    collect_mutated()
    return items


async def _send_past_the_old_limit(producer: AIOKafkaProducer, topic: str, key: bytes | None, value: bytes) -> Any:
    """Send one record; one over the topic's old ``max.message.bytes`` is sent again for up to 30 s.

    The broker applies the limit :func:`_raise_ingest_limit` sets a moment after the request returns
    (seen on a broker that had just started: the 1.1 MB record refused as too large).
    """
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            return await producer.send_and_wait(topic, key=key, value=value)
        except MessageSizeTooLargeError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _raise_ingest_limit(settings) -> None:
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name(settings, "ingest"),
                                                  configs={"max.message.bytes": str(BIG_LIMIT)})])
    finally:
        await admin.close()


#: What the default redaction policy leaves of a span it masks (a generated value can look like a phone number).
_MASKED = re.compile(rb"\[REDACTED:[^\]]+\]")


def _stored_form_of(raw: bytes, value: bytes, redactions: list[dict] | None, *, truncated: bool) -> bool:
    """Whether a rejection's ``raw`` is ``value`` (its start, when truncated) as the worker stores it: unchanged, or,
    when the rejection lists ``redactions`` of its raw bytes, with each masked span in their place."""
    if not any(entry["path"] == "raw" for entry in redactions or ()):
        return value.startswith(raw) if truncated else raw == value
    pattern = b".+?".join(re.escape(piece) for piece in _MASKED.split(raw))
    return (re.match if truncated else re.fullmatch)(pattern, value, re.DOTALL) is not None


def test_bad_input_corpus_is_rejected_with_reasons_and_the_worker_survives(settings, ledger):
    tag = uuid.uuid4().hex[:6]
    asyncio.run(ensure_topics(settings))
    asyncio.run(_raise_ingest_limit(settings))
    hand, good_runs = _hand_corpus(tag)
    generated = _hypothesis_corpus(tag)
    corpus = hand + generated
    worker = WorkerProcess(settings, sink=False, log_name="bad-input-worker").start()

    sent: list[tuple[int, int]] = []  # (partition, offset) of every record produced to ingest

    async def scenario():
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all",
                                    max_request_size=BIG_LIMIT)
        await producer.start()
        try:
            topic = topic_name(settings, "ingest")
            for item in corpus:
                meta = await _send_past_the_old_limit(producer, topic, item.key.encode() if item.key else None,
                                                      item.value)
                item.partition, item.offset = meta.partition, meta.offset
                sent.append((meta.partition, meta.offset))
        finally:
            await producer.stop()
        # The last word: a good event produced after the whole corpus must be committed.
        s_id = next(iter(good_runs))
        last = {**good_runs[s_id][-1], "eventId": f"{s_id}:final", "sequence": len(good_runs[s_id]),
                "type": "variable.changed", "payload": {"name": "final", "value": True}}
        last.pop("causationId", None)
        good_runs[s_id].append(last)
        async with HandLog(settings) as hand:  # a JCS JSON record, as a non-SDK host writes it
            meta = await hand.send("ingest", s_id, last)
        sent.append((meta.partition, meta.offset))

        async def final_committed():
            run = await read_run(settings, s_id)
            return run if run and run[-1]["doc"]["eventId"] == last["eventId"] else None

        await wait_until(final_committed, timeout=180, what="final good event committed", worker=worker)
        expected_rejections = sum(1 for i in corpus if i.expect)

        async def rejections():
            found = await read_rejections(settings)
            return found if len({(r["source"]["partition"], r["source"]["offset"]) for r in found}) \
                >= expected_rejections else None

        try:
            found = await wait_until(rejections, timeout=60, what="every rejection", worker=worker)
        except AssertionError:  # fall through to the per-record comparison, which names what is missing
            found = await read_rejections(settings)
        want = {(i.event_id, i.violation) for i in corpus if i.violation}

        async def all_violations():
            # The run-state processor folds the log after the sequencer wrote it: wait for it too.
            vs = [v async for _, _, _, v in read_topic(settings, "violations")]
            return vs if want <= {(v["eventId"], v["code"]) for v in vs} else None

        try:
            violations = await wait_until(all_violations, timeout=60, what="every violation", worker=worker)
        except AssertionError:  # fall through to the comparison below, which names what is missing
            violations = [v async for _, _, _, v in read_topic(settings, "violations")]
        logs = {run_id: await read_run(settings, run_id) for run_id in good_runs}

        async def landed() -> Landing:
            log = [rec async for _, _, _, rec in read_topic(settings, "log")]
            rejected = await read_rejections(settings)
            return landing(sent, log, rejected, topic_name(settings, "ingest"))

        async def nothing_missing() -> Landing | None:
            counted = await landed()
            return counted if counted.lost == 0 else None

        try:  # give a lagging partition a moment; what is still missing after that is lost
            counted = await wait_until(nothing_missing, timeout=60, what="every record landed", worker=worker)
        except AssertionError:
            counted = await landed()
        return found, violations, logs, counted

    try:
        found, violations, logs, counted = asyncio.run(scenario())
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()

    # Counted before any other check, so the summary has this test's numbers even when one fails.
    reason_at = {(r["source"]["partition"], r["source"]["offset"]): r["reason"] for r in found}
    ledger.record("bad_input", sent=len(sent), accepted=counted.committed, rejected=dict(Counter(reason_at.values())),
                  violations=Counter(c for _, c in {(v["eventId"], v["code"]) for v in violations}), lost=counted.lost,
                  duplicated=counted.duplicated, hand_written=len(hand), hypothesis_generated=len(generated),
                  **counted.to_extra())
    assert (counted.lost, counted.duplicated, counted.unaccounted) == (0, 0, 0), counted

    by_source: dict[tuple[int, int], list[dict]] = {}
    for r in found:
        by_source.setdefault((r["source"]["partition"], r["source"]["offset"]), []).append(r)
    ingest = topic_name(settings, "ingest")
    wrong = []
    reasons: Counter[str] = Counter()
    for item in corpus:
        got = by_source.get((item.partition, item.offset), [])
        if item.expect:
            reasons_here = {r["reason"] for r in got}
            if len(reasons_here) != 1 or not reasons_here <= item.expect:
                wrong.append((item.label, item.expect, reasons_here))
                continue
            r = got[0]
            assert r["source"]["topic"] == ingest
            assert r["reason"] in REASONS
            value = item.value or b""
            truncated = bool(r.get("rawTruncated"))
            if truncated:
                assert r["rawBytes"] == len(value) and r["rawSha256"] == hashlib.sha256(value).hexdigest()
            assert _stored_form_of(base64.b64decode(r["raw"]), value, r.get("redactions"), truncated=truncated), \
                (item.label, r["raw"], r.get("redactions"))
            reasons[r["reason"]] += 1
        else:
            if got:
                wrong.append((item.label, "accepted", {r["reason"] for r in got}))
    assert wrong == [], "\n".join(map(str, wrong))

    for run_id, docs in good_runs.items():
        assert logs[run_id].conflicts == []
        assert [c["doc"] for c in logs[run_id]] == docs, run_id
    want_violations = {(i.event_id, i.violation) for i in corpus if i.violation}
    got_violations = {(v["eventId"], v["code"]) for v in violations}
    assert want_violations <= got_violations, (want_violations, got_violations)
    # No violation for an event we did not mean to be illegal.
    assert {e for e, _ in got_violations} <= {i.event_id for i in corpus if i.violation}
    hand_reasons = {r for i in hand for r in i.expect}
    assert hand_reasons == REASONS, REASONS - hand_reasons
    assert counted.committed == sum(len(docs) for docs in good_runs.values())
    assert counted.rejected == sum(reasons.values())
