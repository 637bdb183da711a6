"""Canonical bytes, hashes and strict JSON parsing."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.schemas.canonical import (
    GENESIS,
    MAX_SAFE_INTEGER,
    chain_hash,
    check_json_safe,
    doc_hash,
    jcs,
    loads_strict,
    sha256_hex,
)
from agentlog.schemas.errors import ContractError, EventRejected
from tests.unit.schemas.strategies import contract_settings, json_values, valid_docs


def _shuffled(value):
    """The same JSON value with every object's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        random.shuffle(items)
        return {k: _shuffled(v) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v) for v in value]
    return value


def test_jcs_known_bytes():
    # RFC 8785 §3.2.3-style: sorted keys, no whitespace, shortest numbers, raw UTF-8.
    assert jcs({"b": [1.0, 1e21, -0.0], "a": "é\n"}) == '{"a":"é\\n","b":[1,1e+21,0]}'.encode()


def test_chain_hash_is_prev_hex_then_jcs():
    doc = {"eventId": "e", "sequence": 0}
    expected = hashlib.sha256(GENESIS.encode("ascii") + b'{"eventId":"e","sequence":0}').hexdigest()
    assert chain_hash(GENESIS, doc) == expected
    assert GENESIS == "0" * 64
    assert doc_hash(doc) == hashlib.sha256(b'{"eventId":"e","sequence":0}').hexdigest()
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@contract_settings
@given(json_values, st.randoms())
def test_canonical_form_ignores_key_order(value, rnd):
    random.seed(rnd.random())
    assert jcs(_shuffled(value)) == jcs(value)


@contract_settings
@given(valid_docs())
def test_json_round_trip_identity(doc):
    text = json.dumps(doc, ensure_ascii=False)
    back = loads_strict(text.encode("utf-8"))
    assert back == doc
    assert jcs(back) == jcs(doc)
    assert jcs(loads_strict(jcs(doc))) == jcs(doc)


@pytest.mark.parametrize(
    ("value", "code", "path"),
    [
        ({"a": [1, {"b": MAX_SAFE_INTEGER + 1}]}, "unsafe_integer", "$.a[1].b"),
        ({"a": -MAX_SAFE_INTEGER - 1}, "unsafe_integer", "$.a"),
        ({"x": float("nan")}, "non_finite_number", "$.x"),
        ([float("inf")], "non_finite_number", "$[0]"),
        ({"x": -float("inf")}, "non_finite_number", "$.x"),
        ({"x": {1, 2}}, "invalid_payload", "$.x"),
        ({1: "a"}, "invalid_payload", "$"),
    ],
)
def test_unsafe_values_are_named(value, code, path):
    with pytest.raises(EventRejected) as info:
        check_json_safe(value)
    assert info.value.code == code
    assert path in info.value.detail
    assert isinstance(info.value, ContractError)
    with pytest.raises(EventRejected) as info:
        jcs(value)
    assert info.value.code == code


def test_safe_edges_and_bools_pass():
    check_json_safe({"a": MAX_SAFE_INTEGER, "b": -MAX_SAFE_INTEGER, "c": True, "d": 1.5, "e": None})


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'{"a": NaN}', "non_finite_number"),
        (b'{"a": Infinity}', "non_finite_number"),
        (b'[-Infinity]', "non_finite_number"),
        (b"1e400", "non_finite_number"),
        (b'{"a": 1, "a": 2}', "decode_error"),
        (b'{"a": {"b": 1, "b": 1}}', "decode_error"),
        (b"{", "decode_error"),
        (b"\xff\xfe", "decode_error"),
        (b"", "decode_error"),
    ],
)
def test_loads_strict_rejects(data, code):
    with pytest.raises(EventRejected) as info:
        loads_strict(data)
    assert info.value.code == code


def test_loads_strict_accepts_str_and_bytes():
    assert loads_strict('{"a":[1,2.5,"é"]}') == {"a": [1, 2.5, "é"]}
    assert loads_strict(bytearray(b"null")) is None


def test_integral_doubles_beyond_2_53_read_back_as_doubles():
    # JCS spells 1e17 as digits; reading it back must not turn it into an unsafe int.
    assert jcs(1e17) == b"100000000000000000"
    back = loads_strict(jcs({"x": 1e17}))
    assert back == {"x": 1e17} and isinstance(back["x"], float)
    check_json_safe(back)
    # Shortest round-trip digits, not the exact binary value: still the same double.
    assert loads_strict(jcs(6.442739046447045e16)) == 6.442739046447045e16
    # A literal that is not how JCS spells a double stays an int, and is refused.
    for literal in (b"9007199254740993", b"1152921504606846976", b"-99999999999999999999999"):
        odd = loads_strict(b'{"x": ' + literal + b"}")
        assert odd["x"] == int(literal)
        with pytest.raises(EventRejected) as info:
            check_json_safe(odd)
        assert info.value.code == "unsafe_integer"


@contract_settings
@given(json_values | st.text(alphabet=st.characters(max_codepoint=0x1FFFF, exclude_categories=["Cs"])))
def test_size_bound_is_an_upper_bound(value):
    from agentlog.schemas.canonical import jcs_size_bound

    bound = jcs_size_bound(value)
    assert bound is not None and bound >= len(jcs(value))


def test_size_bound_worst_cases():
    from agentlog.schemas.canonical import jcs_size_bound

    for value in ["\x1f" * 10, "\U0001F600" * 10, -2.2250738585072014e-308, 5e-324, -MAX_SAFE_INTEGER, [[]], {"": {}}]:
        assert jcs_size_bound(value) >= len(jcs(value)), value
    assert jcs_size_bound({"a": float("nan")}) is None
    assert jcs_size_bound((1, 2)) is None


_any_text = st.text(alphabet=st.characters(max_codepoint=0x10FFFF, exclude_categories=["Cs"]), max_size=12)
_wide_json = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False) | _any_text
    | st.sampled_from(["\x00\x1f\x7f\b\f\n\r\t\"\\/", "\u2028\u2029", "\ufeff\uffff", "\U0001F600"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_any_text | st.sampled_from(["\ue000", "\U00010000", "a", "\x7f"]), inner, max_size=5),
    max_leaves=25,
)


@contract_settings
@given(_wide_json)
def test_jcs_is_byte_identical_to_reference_rfc8785(value):
    import rfc8785

    assert jcs(value) == rfc8785.dumps(value)


def test_jcs_key_order_is_utf16_code_units():
    # U+E000 sorts after U+10000 in UTF-16 (0xD800...) but before it by code point.
    assert jcs({"\ue000": 1, "\U00010000": 2}) == '{"\U00010000":2,"\ue000":1}'.encode()


def test_jcs_refuses_lone_surrogates():
    with pytest.raises(EventRejected):
        jcs({"a": "\ud800"})


_fast_path_json = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER) | _any_text
    | st.sampled_from(["\x00\x1f\x7f\b\f\n\r\t\"\\/", "\u2028\u2029", "\ufeff\uffff", "\U0001F600é"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=6), inner, max_size=5),
    max_leaves=25,
)


@settings(contract_settings, max_examples=500)
@given(_fast_path_json)
def test_fast_path_values_match_reference(value):
    import rfc8785

    from agentlog.schemas.canonical import _plain_json

    assert _plain_json(value)
    assert jcs(value) == rfc8785.dumps(value)
