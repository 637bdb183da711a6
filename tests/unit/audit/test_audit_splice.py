"""The sink's doc text, assembled around the payload's, is the reference JCS of the doc."""

from __future__ import annotations

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.audit.rows import _payload_and_doc
from tests.unit.schemas.test_fast_paths import _keys, _values

_tricky = st.sampled_from(['"payload":0', 'x"payload":0', '\\"payload\\":0', "payload", '"payload":'])
_docs = st.fixed_dictionaries(
    {"eventId": st.text(max_size=8) | _tricky, "runId": _tricky | st.text(max_size=8), "type": st.text(max_size=8),
     "timestamp": st.text(max_size=8), "sequence": st.integers(0, 2**53 - 1),
     "payload": _values | st.dictionaries(_keys | _tricky, _values, max_size=4)},
    optional={"nodeId": _tricky, "causationId": st.text(max_size=8), "schemaVersion": st.integers(0, 9),
              "engineVersion": st.text(max_size=4)},
)


@settings(max_examples=400, deadline=None)
@given(_docs)
def test_payload_and_doc_are_reference_jcs(doc):
    payload, whole = _payload_and_doc(doc)
    assert whole.encode() == rfc8785.dumps(doc)
    assert payload == ("" if doc["payload"] is None else rfc8785.dumps(doc["payload"]).decode())


def test_docs_without_payload_or_with_null_payload():
    for doc in ({"eventId": "e", "runId": '"payload":0'}, {"eventId": "e", "payload": None}):
        assert _payload_and_doc(doc)[1].encode() == rfc8785.dumps(doc)
