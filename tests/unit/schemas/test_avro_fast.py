"""The direct Avro writer gives fastavro's bytes for every record shape the schema admits."""

from __future__ import annotations

import io

import fastavro
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.avro import _FRAME, PARSED_SCHEMA, _record_body, decode_avro, encode_avro
from schemas.canonical import jcs

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
