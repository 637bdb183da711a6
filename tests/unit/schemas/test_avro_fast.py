"""The direct Avro writer gives fastavro's bytes for every record shape the schema admits."""

from __future__ import annotations

import io

import fastavro
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.schemas.avro import _FRAME, PARSED_SCHEMA, _read_body, _record_body, decode_avro, encode_avro
from agentlog.schemas.canonical import jcs

_text = st.text(alphabet=st.characters(max_codepoint=0x10FFFF, exclude_categories=["Cs"]), max_size=70)
_long = st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, -1, 1, 63, 64, -64, -65, 127, 128, 2**31, 2**63 - 1, -(2**63)])
_docs = st.fixed_dictionaries(
    {"eventId": _text, "runId": _text, "type": _text, "payload": st.text(max_size=300), "timestamp": _text,
     "sequence": _long},
    optional={"nodeId": _text, "schemaVersion": _long, "engineVersion": _text, "causationId": _text},
)


def _fastavro(record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, PARSED_SCHEMA, record, strict_allow_default=True)
    return out.getvalue()


@settings(max_examples=500, deadline=None)
@given(_docs)
def test_direct_writer_equals_fastavro(doc):
    record = {name: doc.get(name) for name in ("nodeId", "schemaVersion", "engineVersion", "causationId")}
    record.update({k: doc[k] for k in ("eventId", "runId", "type", "payload", "timestamp", "sequence")})
    assert _record_body(record) == _fastavro(record)


@settings(max_examples=200, deadline=None)
@given(_docs, st.dictionaries(st.text(max_size=5), st.integers(-5, 5) | st.floats(0.001, 1e6) | st.text(max_size=5),
                              max_size=5))
def test_encode_avro_round_trips_and_frames_like_fastavro(doc, payload):
    doc = {**doc, "payload": payload}
    data = encode_avro(doc)
    record = {name: doc.get(name) for name in ("nodeId", "schemaVersion", "engineVersion", "causationId")}
    record.update({k: doc[k] for k in ("eventId", "runId", "type", "timestamp", "sequence")})
    record["payload"] = jcs(payload).decode()
    assert data == _FRAME + _fastavro(record)
    assert decode_avro(data) == doc


def test_wrong_types_fall_back_to_fastavro():
    base = {"eventId": "e", "runId": "r", "type": "t", "payload": "{}", "timestamp": "x", "sequence": 1,
            "nodeId": None, "schemaVersion": None, "engineVersion": None, "causationId": None}
    for field, value in [("sequence", True), ("sequence", 2**63), ("schemaVersion", "1"), ("nodeId", 5),
                         ("eventId", "\ud800")]:
        assert _record_body({**base, field: value}) is None


def _fastavro_read(data: bytes) -> dict | None:
    """What fastavro reads from a framed body (None: it refuses it, or leaves trailing bytes)."""
    body = io.BytesIO(data)
    body.seek(len(_FRAME))
    try:
        record = fastavro.schemaless_reader(body, PARSED_SCHEMA, None)
    except Exception:
        return None
    return record if body.tell() == len(data) else None


def _as_record(doc: dict, payload: str) -> dict:
    record = {name: doc.get(name) for name in ("nodeId", "schemaVersion", "engineVersion", "causationId")}
    record.update({k: doc[k] for k in ("eventId", "runId", "type", "timestamp", "sequence")})
    record["payload"] = payload
    return record


@settings(max_examples=500, deadline=None)
@given(_docs)
def test_direct_reader_equals_fastavro(doc):
    """``_read_body`` reads every body the writer makes as fastavro does."""
    record = {name: doc.get(name) for name in ("nodeId", "schemaVersion", "engineVersion", "causationId")}
    record.update({k: doc[k] for k in ("eventId", "runId", "type", "payload", "timestamp", "sequence")})
    data = _FRAME + _fastavro(record)
    fast = _read_body(data)
    assert fast is not None
    read, payload = fast
    assert _as_record(read, payload) == _fastavro_read(data)
    assert list(read) == [k for k in ("eventId", "runId", "type", "payload", "timestamp", "sequence", "nodeId",
                                      "schemaVersion", "engineVersion", "causationId") if k in read]


@settings(max_examples=500, deadline=None)
@given(_docs, st.data())
def test_direct_reader_never_reads_what_fastavro_reads_otherwise(doc, data):
    """Truncated, extended or corrupted bodies: the direct reader gives fastavro's record or leaves it to fastavro."""
    record = {name: doc.get(name) for name in ("nodeId", "schemaVersion", "engineVersion", "causationId")}
    record.update({k: doc[k] for k in ("eventId", "runId", "type", "payload", "timestamp", "sequence")})
    body = bytearray(_FRAME + _fastavro(record))
    how = data.draw(st.sampled_from(["cut", "extend", "flip"]))
    if how == "cut":
        del body[data.draw(st.integers(len(_FRAME), len(body) - 1)):]
    elif how == "extend":
        body += data.draw(st.binary(min_size=1, max_size=4))
    else:
        at = data.draw(st.integers(len(_FRAME), len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    fast = _read_body(bytes(body))
    if fast is not None:
        assert _as_record(*fast) == _fastavro_read(bytes(body))
