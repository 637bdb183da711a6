"""The sequencer's validation (``validate_parsed``) decides as ``validate_doc`` does and gives the reference JCS bytes.

``validate_parsed`` computes the doc's canonical bytes while checking its size, so
the chain hash and the committed record reuse them: they must be ``rfc8785.dumps(doc)`` byte for
byte, and every doc must get the same answer (accepted, or the same rejection code) as ``validate_doc``.
"""

from __future__ import annotations

import json

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.schemas.canonical import MAX_SAFE_INTEGER, loads_strict
from agentlog.schemas.errors import EventRejected
from agentlog.schemas.validate import validate_doc, validate_parsed
from tests.unit.schemas.test_fast_paths import _keys, _values

_types = st.sampled_from(["variable.changed", "channel.written", "run.started", "node.started", "custom.opaque",
                          "not.a.type"])
_payloads = (_values | st.dictionaries(_keys, _values, max_size=6)
             | st.fixed_dictionaries({"name": st.text(max_size=4), "value": _values})
             | st.fixed_dictionaries({"big": st.integers(MAX_SAFE_INTEGER - 2, 2**63)}))
_docs = st.fixed_dictionaries(
    # Mostly valid envelopes (so the payload and size checks are reached), some not.
    {"eventId": st.sampled_from(["e"] * 12 + ["", "x" * 300]), "runId": st.just("r"), "type": _types,
     "payload": _payloads, "timestamp": st.sampled_from(["2025-01-01T00:00:00Z"] * 12 + ["yesterday"]),
     "sequence": st.sampled_from([0] * 12 + [7, -1])},
    optional={"causationId": st.just("c"), "nodeId": st.sampled_from(["n"] * 12 + [""])},
)


def _outcome(check, doc, max_bytes):
    try:
        return "ok", check(doc, max_bytes=max_bytes)
    except EventRejected as e:
        return e.code, None


@settings(max_examples=400, deadline=None)
@given(_docs, st.sampled_from([80, 300, 1_048_576]))
def test_same_decision_as_validate_doc_and_the_reference_bytes(doc, max_bytes):
    # What the sequencer gets: a doc from the strict decoder (exactly JSON's types).
    doc = loads_strict(json.dumps(doc, ensure_ascii=False, allow_nan=False))
    code, data = _outcome(validate_parsed, doc, max_bytes)
    assert code == _outcome(validate_doc, doc, max_bytes)[0]
    if code == "ok":
        assert data == rfc8785.dumps(doc)
