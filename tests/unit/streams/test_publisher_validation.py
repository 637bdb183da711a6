"""The SDK's per-event validation says what ``validate_doc`` says, for docs a run handle minted.

``validate_minted`` skips the envelope fields the handle made itself and canonicalises the
payload once; these tests hold it to the full check on the same docs, accepted or not.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import EventRejected
from agentlog.schemas.events import RUN_EVENT_TYPE_LIST
from agentlog.schemas.validate import validate_doc, validate_minted
from agentlog.streams.publisher import Run
from tests.unit.schemas.strategies import contract_settings, json_values, payloads

_RUN = Run(None, "run-v", engine_version="1.0")  # type: ignore[arg-type]  # build() needs no publisher


def _outcome(check, doc, max_bytes):
    try:
        return "ok", check(doc, max_bytes=max_bytes)
    except EventRejected as e:
        return e.code, str(e)


def _same(doc, max_bytes=1_048_576):
    full, minted = _outcome(validate_doc, doc, max_bytes), _outcome(validate_minted, doc, max_bytes)
    assert full[0] == minted[0]
    if full[0] == "ok":
        assert minted[1] == jcs(doc["payload"])
    else:
        assert full[1] == minted[1]


@contract_settings
@given(st.sampled_from(RUN_EVENT_TYPE_LIST).flatmap(lambda t: st.tuples(st.just(t), payloads(t))),
       st.none() | st.text(min_size=0, max_size=130), st.none() | st.text(min_size=0, max_size=130))
def test_minted_docs_get_the_full_checks_answer(type_and_payload, node_id, caused_by):
    event_type, payload = type_and_payload
    _same(_RUN.build(event_type, payload, sequence=3, node_id=node_id, caused_by=caused_by))


@contract_settings
@given(st.sampled_from(RUN_EVENT_TYPE_LIST), json_values)
def test_any_payload_gets_the_same_answer(event_type, payload):
    _same(_RUN.build(event_type, payload, sequence=0))


@pytest.mark.parametrize("payload, code", [
    ({"a": [1, 2**53]}, "unsafe_integer"),
    ({"a": {"b": float("nan")}}, "non_finite_number"),
    ({"a": {1, 2}}, "invalid_payload"),
    ({"x": "y" * 5000}, "oversize"),
])
def test_refusals_name_the_same_reason_and_path(payload, code):
    doc = _RUN.build("variable.changed", {"name": "v", "value": payload}, sequence=1)
    with pytest.raises(EventRejected) as full:
        validate_doc(doc, max_bytes=4096)
    with pytest.raises(EventRejected) as minted:
        validate_minted(doc, max_bytes=4096)
    assert full.value.code == minted.value.code == code
    assert str(full.value) == str(minted.value)


def test_unknown_type_and_bad_ids_are_still_refused():
    for doc, code in [(_RUN.build("no.such.type", {}, sequence=0), "unknown_event_type"),
                      (_RUN.build("variable.changed", {"name": "v", "value": 1}, sequence=0, node_id="n" * 129),
                       "invalid_envelope"),
                      ({**_RUN.build("variable.changed", {}, sequence=0), "extra": 1}, "invalid_envelope")]:
        with pytest.raises(EventRejected) as info:
            validate_minted(doc)
        assert info.value.code == code
