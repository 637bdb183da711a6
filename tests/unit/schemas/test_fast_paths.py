"""The fast canonical encoders give the reference bytes: every one is checked against ``rfc8785.dumps``.

The hash chain and state hashes are SHA-256 over RFC 8785 bytes, so a fast path that
differs by one byte on some value would silently fork every hash after it. These tests
generate JSON values aimed at the places the fast paths make assumptions: float spelling
(repr vs ECMAScript: integral floats, exponents, the 1e-4/1e16 edges, subnormals, -0.0),
key order (code point vs UTF-16: non-BMP and U+E000-U+FFFF keys), escapes and nesting.
"""

from __future__ import annotations

import math
import struct

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.schemas.canonical import (
    _NO_VALUE,
    GENESIS,
    MAX_SAFE_INTEGER,
    _compose,
    _orjson_jcs,
    _orjson_loads,
    _plain_json,
    canonical_leaf,
    chain_hash,
    jcs,
    jcs_parsed,
    jcs_parsed_and_member,
    loads_strict,
    reference_jcs,
    sha256_hex,
)
from agentlog.schemas.errors import EventRejected

_settings = settings(max_examples=400, deadline=None)

_edge_floats = st.sampled_from([
    0.0, -0.0, 1e-4, -1e-4, 0.00009999999999999999, 1e-7, 1e-6, 1.5e-7, 1e16, 9999999999999998.0,
    1e16 - 2, 1e21, 1e20, 123456789012345680000.0, 5e-324, -5e-324, 2.2250738585072014e-308,
    1.7976931348623157e308, 0.1, 0.5, 1.0, 2.0, -3.0, 1 / 3, 4.35, 0.000123, 1e-5, 12345.6789,
])
_bits_floats = st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0]).filter(math.isfinite)
_floats = st.floats(allow_nan=False, allow_infinity=False) | _edge_floats | _bits_floats
_text = st.text(alphabet=st.characters(max_codepoint=0x10FFFF, exclude_categories=["Cs"]), max_size=8)
_keys = _text | st.sampled_from(["", "a", "A", "é", "\u20ac", "\ud7ff", "\ue000", "\uffff", "\U00010000",
                                  "\U0001f600", "a\U0001f600", "a\ue000", "\x7f", "\x00"])
_scalars = (st.none() | st.booleans() | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER) | _floats | _text
            | st.sampled_from(["\x00\x1f\x7f\b\f\n\r\t\"\\/", "\u2028\u2029", "\ufeff\uffff", "\U0001F600é"]))
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_keys, inner, max_size=6),
    max_leaves=40,
)


@_settings
@given(_values)
def test_jcs_equals_reference(value):
    assert jcs(value) == rfc8785.dumps(value)


@_settings
@given(_values)
def test_composed_path_equals_reference(value):
    assert _compose(value) == rfc8785.dumps(value)


@_settings
@given(_values)
def test_plain_json_is_only_claimed_when_the_c_encoder_is_canonical(value):
    import json

    if _plain_json(value):
        assert json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() \
            == rfc8785.dumps(value)


@_settings
@given(_scalars | _keys)
def test_canonical_leaf_equals_reference(value):
    assert canonical_leaf(value) == rfc8785.dumps(value)


@settings(max_examples=2000, deadline=None)
@given(_floats)
def test_every_float_spelling_equals_reference(value):
    assert jcs(value) == rfc8785.dumps(value)
    assert jcs([value]) == rfc8785.dumps([value])
    assert jcs({"k": value, "\U0001f600": value}) == rfc8785.dumps({"k": value, "\U0001f600": value})


def test_floats_that_python_and_ecmascript_spell_differently():
    # Found by hand, not by the code under test: ECMAScript writes these without ".0" or with
    # a decimal expansion / signed exponent without zero padding.
    assert jcs(2.0) == b"2"
    assert jcs(-0.0) == b"0"
    assert jcs(1e16) == b"10000000000000000"
    assert jcs(1e21) == b"1e+21"
    assert jcs(1e-5) == b"0.00001"
    assert jcs(1e-7) == b"1e-7"
    assert jcs({"a": [1.5, 2.0, 1e-7]}) == b'{"a":[1.5,2,1e-7]}'


def test_key_order_is_utf16_on_every_path():
    value = {"\ue000": 1, "\U00010000": 2, "b": 0.5, "a": [1.0]}
    expected = rfc8785.dumps(value)
    assert expected.index("\U00010000".encode()) < expected.index("\ue000".encode())
    assert jcs(value) == _compose(value) == expected
    assert not _plain_json(value)


def test_non_ascii_bmp_keys_stay_on_the_c_encoder():
    value = {"é": 1, "z": 2, "\u20ac": [0.25]}
    assert _plain_json(value)
    assert jcs(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("bad, code", [
    ({"a": float("nan")}, "non_finite_number"),
    ([float("inf")], "non_finite_number"),
    ({"a": 2**53}, "unsafe_integer"),
    ({"a": [1.5, -(2**60)]}, "unsafe_integer"),
    ({"a": "\ud800"}, None),
    ({"\udc00": 1.5}, None),
    ({1: 2}, "invalid_payload"),
    ({"a": {1, 2}}, "invalid_payload"),
])
def test_errors_are_the_reference_errors(bad, code):
    with pytest.raises(EventRejected) as got:
        jcs(bad)
    with pytest.raises(EventRejected) as ref:
        reference_jcs(bad)
    assert got.value.code == ref.value.code
    if code is not None:
        assert got.value.code == code


def test_tuples_and_subclasses_take_the_reference_path():
    import enum

    class Color(str, enum.Enum):  # noqa: UP042 - the str mixin is what this test encodes
        RED = "red"

    for value in [(1, 2.5), {"a": (1,)}, {"c": Color.RED}, [True, 1]]:
        assert jcs(value) == rfc8785.dumps(value)


@_settings
@given(st.dictionaries(_keys, _values, max_size=5), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_chain_hash_equals_reference(payload, prev):
    doc = {"eventId": "e", "runId": "r", "type": "variable.changed", "payload": payload, "sequence": 0,
           "timestamp": "2025-01-01T00:00:00.000Z"}
    for p in (GENESIS, prev):
        assert chain_hash(p, doc) == sha256_hex(p.encode("ascii") + rfc8785.dumps(doc))


# --- orjson: the encoder whose output is screened, and the decoder that writes back -----------


@settings(max_examples=600, deadline=None)
@given(_values)
def test_orjson_path_is_taken_only_when_it_is_the_reference(value):
    got = _orjson_jcs(value)
    if got is not None:
        assert got == rfc8785.dumps(value)


@settings(max_examples=2000, deadline=None)
@given(_floats)
def test_orjson_path_float_spellings(value):
    for wrapped in (value, [value], {"k": value}, {"a": [1, value], "b": "x"}):
        got = _orjson_jcs(wrapped)
        assert got is None or got == rfc8785.dumps(wrapped)


def test_orjson_path_takes_ordinary_events_and_refuses_what_it_cannot_spell():
    doc = {"eventId": "0196f0c0-0000-7000-8000-00000000002a", "runId": "r-1", "type": "variable.changed",
           "payload": {"name": "v", "value": {"score": 0.25, "note": "é\n\"", "n": None, "ok": True}},
           "sequence": 42, "timestamp": "2025-01-01T00:00:00.045Z"}
    assert _orjson_jcs(doc) == rfc8785.dumps(doc)  # the common case is fast (no fallback)
    import enum
    import uuid

    class Plain(enum.Enum):
        A = "a"

    for value in [2.0, -0.0, {"a": 1e16}, [1e-7], {"\ue000": 1, "\U00010000": 2}, {"a": float("nan")},
                  {"a": uuid.UUID(int=1)}, {"a": Plain.A}, (1, 2), {"a": 2**53}, {"a": "\ud800"}]:
        assert _orjson_jcs(value) is None, value


@settings(max_examples=600, deadline=None)
@given(_values)
def test_loads_strict_reads_jcs_text_as_the_reference_decoder_does(value):
    text = rfc8785.dumps(value)
    got = loads_strict(text)
    # The reference (stdlib) path sees the same text once it is no longer compact.
    slow = loads_strict(b" " + text)
    assert _orjson_loads(b" " + text) is _NO_VALUE
    assert got == slow == value and jcs(got) == jcs(slow) == text
    assert [type(x) for x in _leaves(got)] == [type(x) for x in _leaves(slow)]
    assert loads_strict(text.decode("utf-8")) == value


def _leaves(value):
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in _leaves(value[k])]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@pytest.mark.parametrize("data", [b'{"a":1,"a":2}', b'{"a":{"b":1,"b":1}}', b'[{"x":null,"x":null}]',
                                  b'{"a":1,"b":2,"a":1}'])
def test_compact_duplicate_keys_are_refused_on_the_fast_path_too(data):
    assert _orjson_loads(data) is _NO_VALUE
    with pytest.raises(EventRejected) as info:
        loads_strict(data)
    assert info.value.code == "decode_error"


@pytest.mark.parametrize("data, unlike", [
    (b'{"a":2.0}', True), (b"[1,-0.0]", True), (b"1e+16", True), (b'{"a":[5e-324]}', True), (b"10.0", True),
    (b'{"a":1.05}', False), (b'{"v":"1.4.0"}', False), (b'{"t":"one-time e+"}', False), (b'{"a":0.5}', False),
    (b'{"id":"0196f0c9e-7000"}', False), (b'{"a":"x:1.0]"}', True),  # the last: a string, a false alarm only
])
def test_float_screen_finds_number_tokens_only(data, unlike):
    from agentlog.schemas.canonical import _float_unlike_jcs

    assert _float_unlike_jcs(data) is unlike


@_settings
@given(st.dictionaries(_keys, _values, max_size=5), st.sampled_from([b"", GENESIS.encode()]))
def test_hashes_to_agrees_with_the_reference_hash(value, prefix):
    from agentlog.schemas.canonical import hashes_to

    reference = sha256_hex(prefix + rfc8785.dumps(value))
    assert not hashes_to(None, value, prefix)
    assert not hashes_to("0" * 64, value, prefix)
    if hashes_to(reference, value, prefix):  # a True is always right; a False only sends the caller the exact way
        assert sha256_hex(prefix + jcs(value)) == reference
    if not any(isinstance(v, float) for v in _leaves(value)) and not _has_wide_keys(value):
        assert hashes_to(reference, value, prefix)  # and with no floats or non-BMP keys it is the usual answer


def _has_wide_keys(value):
    if isinstance(value, dict):
        return any(max(k, default="a") > "\uffff" for k in value) or any(_has_wide_keys(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_wide_keys(v) for v in value)
    return False


def _parsed(value):
    """``value`` as the audit sink holds it: parsed back from its JCS text (None: not representable)."""
    try:
        text = reference_jcs(value)
    except EventRejected:
        return None
    return loads_strict(text), text


@settings(max_examples=600, deadline=None)
@given(_values)
def test_jcs_of_a_parsed_value_equals_reference(value):
    parsed = _parsed(value)
    if parsed is not None:
        assert jcs_parsed(parsed[0]) == parsed[1]


@settings(max_examples=600, deadline=None)
@given(_values, _values)
def test_jcs_of_a_parsed_doc_and_its_payload_equal_reference(payload, other):
    parsed = _parsed({"payload": payload, "runId": "r", "other": other})
    if parsed is not None:
        doc, text = parsed
        assert jcs_parsed_and_member(doc, "payload") == (text, reference_jcs(doc["payload"]))


def test_parsed_values_that_orjson_spells_otherwise_take_the_reference_path():
    """Non-BMP keys sort otherwise in orjson (UTF-8) than in JCS (UTF-16): the screen must send them on."""
    doc, text = _parsed({"payload": {"\U0001F600": 1, "\uE000": [1e21, 1e-7, -0.0]}})
    assert orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) != text
    assert jcs_parsed(doc) == text
    assert jcs_parsed_and_member(doc, "payload") == (text, reference_jcs(doc["payload"]))
