"""Canonical bytes and hashes: the only serialisation anything is ever hashed from.

Every hash in agentlog (event hash chain, state hash, LLM cache key) is
SHA-256 over RFC 8785 (JCS) bytes, so two hosts in two languages agree on
the digest of the same value. JCS is only defined for I-JSON values, hence
the explicit safety check: an integer beyond ±(2**53 - 1) or a NaN would be
silently rounded or refused by another implementation, so we refuse it first,
naming where it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from json.encoder import c_make_encoder as _c_make_encoder  # type: ignore[attr-defined]  # the C accelerator
from json.encoder import encode_basestring as _encode_basestring
from typing import Any

import orjson
import rfc8785

from agentlog.schemas.errors import EventRejected

__all__ = [
    "sized",
    "jcs_parsed",
    "jcs_parsed_and_member",
    "GENESIS",
    "MAX_SAFE_INTEGER",
    "chain_hash",
    "chain_link",
    "check_json_safe",
    "doc_hash",
    "hashes_to",
    "jcs",
    "jcs_size_bound",
    "loads_strict",
    "canonical_leaf",
    "reference_jcs",
    "sha256_hex",
    "utf16_key",
]

#: ``prevHash`` of a run's first event (sequence 0).
GENESIS = "0" * 64

#: Largest integer every JSON implementation represents exactly (IEEE-754 double).
MAX_SAFE_INTEGER = 2**53 - 1


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256, the digest format of every agentlog hash."""
    return hashlib.sha256(data).hexdigest()


def _plain_json(obj: Any) -> bool:
    """True when ``json.dumps(sort_keys=True)`` is already the JCS form of ``obj``.

    That holds for exact JSON types whose every piece Python spells as ECMAScript does:
    safe integers; floats that ``repr`` writes in plain decimal with a fraction (non-integral,
    1e-4 <= |f| < 1e16 — the shortest round-trip digits are the same in both languages, only
    ``2.0`` vs ``2`` and the exponent forms differ); object keys below U+D800 (Python sorts
    keys by code point, JCS by UTF-16 code unit; the two orders differ only where a
    supplementary character meets U+E000-U+FFFF). String escaping is the same in both (short
    forms for \\b \\t \\n \\f \\r, lowercase ``\\u00xx`` for other controls, nothing else escaped).
    """
    stack = [obj]
    pop = stack.pop
    push = stack.append
    lo, hi = -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER
    while stack:
        value = pop()
        cls = type(value)
        if cls is str or cls is bool or value is None:
            continue
        if cls is dict:
            for k, v in value.items():
                if type(k) is not str or not (k.isascii() or max(k) < "\ud800"):
                    return False
                push(v)
        elif cls is list:
            stack.extend(value)
        elif cls is int:
            if not lo <= value <= hi:
                return False
        elif cls is float:
            # NaN fails the comparison, infinities the upper bound.
            if not 1e-4 <= abs(value) < 1e16 or value.is_integer():
                return False
        else:
            return False
    return True


# One C encoder built once (``json.dumps`` builds one per call, which is a third of its cost on
# a small event): sorted keys, no whitespace, no ASCII escaping, no cycle markers (JSON values
# from a decoder have no cycles; a cyclic value still fails, as RecursionError).
_DUMPS: Callable[[Any], str]
if _c_make_encoder is not None:
    _ENCODER = _c_make_encoder(None, None, _encode_basestring, None, ":", ",", True, False, True)

    def _DUMPS(obj: Any) -> str:  # noqa: N802 - a function in the place of a constant's name
        return "".join(_ENCODER(obj, 0))
else:  # pragma: no cover - CPython always has the C accelerator
    _DUMPS = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_JSON_STRING = _encode_basestring
_LITERALS = {True: b"true", False: b"false"}


class _NotFast(Exception):
    """A value the composed fast path leaves to the reference encoder (which also reports errors)."""


def sized(data: bytes) -> bytes:
    """orjson's output in a buffer of its own length: for bytes that are kept, not dropped at once.

    orjson (3.12 on) hands back the buffer it wrote into, 4 KiB or more however short the output. A
    result that outlives the call (a table write held to its batch's commit, a sink row held to its
    insert, a hasher's memo) keeps those 4 KiB and takes a fresh page, a page fault each; copied out,
    the buffer is freed at once and the next call writes into it again. 200,000 kept 82-byte results
    (orjson 3.13.0): 2.0 µs a call and 819 MB as returned, 0.24 µs and 53 MB copied
    (tests/bench/JOURNAL.md).
    """
    return memoryview(data).tobytes()


# orjson (C) writes every exact JSON value in JCS form except in four places, each of which
# shows in its output, so the output is checked instead of walking the value first:
# * floats: integral ones as ``2.0`` (JCS ``2``) and large/tiny ones with an exponent
#   (``1e+16``; JCS ``10000000000000000``); a fractional float in plain decimal is spelled
#   as JCS does (shortest round-trip digits in both). NaN/Infinity come out as ``null``.
# * key order: orjson sorts by code point, JCS by UTF-16 unit; they differ only where a
#   supplementary character (4 UTF-8 bytes, lead byte F0-F4) meets U+E000-U+FFFF.
# * types JSON does not have: orjson writes UUIDs, enums, tuples (…) where the reference refuses.
# So a result is taken when it has no exponent/integral-float number token and no 4-byte
# character, and reads back equal to the value (catching NaN → null and every non-JSON type);
# integers beyond ±(2**53 - 1) make orjson raise (OPT_STRICT_INTEGER), as do subclasses,
# dataclasses and datetimes (the passthrough options), lone surrogates and nesting past 254
# levels. Anything refused goes the composed/reference way below. The output is screened with
# substring tests first (C memmem; a regex scan of every byte costs more than the encoding) and
# only a hit is looked at as a number token; a false alarm (a string that happens to hold
# ``:1e+5`` or an emoji) only costs the slower path.
_ORJSON_OPTS = (orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER | orjson.OPT_PASSTHROUGH_SUBCLASS
                | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME)
_UTF8_LEAD4 = (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")


def _orjson_jcs(obj: Any) -> bytes | None:
    """JCS of ``obj`` by orjson when its output is provably the JCS form (see above); else ``None``."""
    try:
        data = orjson.dumps(obj, option=_ORJSON_OPTS)
    except (orjson.JSONEncodeError, TypeError):
        return None
    if not data.isascii() and any(lead in data for lead in _UTF8_LEAD4):
        return None
    if _float_unlike_jcs(data):
        return None
    if orjson.loads(data) != obj:
        return None
    return sized(data)


_NUMBER_BODY = frozenset(b"0123456789.")
_BEFORE_VALUE = frozenset(b":,[")
_AFTER_VALUE = frozenset(b",]}")


def _number_ends_at(data: bytes, end: int) -> bool:
    """True when ``data[:end]`` ends in a number token: digits/dot run after ``:``, ``,``, ``[`` or the start."""
    j = end - 1
    while j >= 0 and data[j] in _NUMBER_BODY:
        j -= 1
    if j == end - 1:
        return False
    if j >= 0 and data[j] == 0x2D:  # '-'
        j -= 1
    return j < 0 or data[j] in _BEFORE_VALUE


def _float_unlike_jcs(data: bytes) -> bool:
    """Whether orjson's output holds a float token JCS spells otherwise: an exponent, or integral (``2.0``).

    Found with ``bytes.find`` (C) and each hit checked as a token; a string that merely contains
    ``e-`` or ``.0`` is a hit that checks false, or at worst (``":1.0]"`` inside a string) a false alarm.
    """
    for needle in (b"e+", b"e-"):
        i = data.find(needle)
        while i != -1:
            if _number_ends_at(data, i):
                return True
            i = data.find(needle, i + 1)
    i = data.find(b".0")
    while i != -1:
        after = i + 2
        if (after == len(data) or data[after] in _AFTER_VALUE) and _number_ends_at(data, i):
            return True
        i = data.find(b".0", i + 1)
    return False


def jcs(obj: Any) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of ``obj``.

    Most values are written by orjson and its output checked (:func:`_orjson_jcs`).
    Values the C ``json`` encoder already spells canonically (see :func:`_plain_json`)
    are serialised by it. Other exact JSON values are composed from canonical
    leaves (:func:`canonical_leaf`) in UTF-16 key order, which JCS is by definition.
    Anything else (tuples, subclasses, lone surrogates, unsafe numbers) goes through the
    reference ``rfc8785`` package, which also produces the errors. All give the
    reference bytes; the contract tests check them against ``rfc8785`` on generated values.

    Raises:
        EventRejected: ``unsafe_integer`` / ``non_finite_number`` naming the JSON path,
            or ``invalid_payload`` for values JSON cannot carry (lone surrogates, sets, ...).
    """
    data = _orjson_jcs(obj)
    if data is not None:
        return data
    if _plain_json(obj):
        try:
            return _DUMPS(obj).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: let the reference path report it
    else:
        try:
            return _compose(obj)
        except (_NotFast, RecursionError):
            pass
    return reference_jcs(obj)


def jcs_parsed(obj: Any) -> bytes:
    """:func:`jcs` of a value that :func:`loads_strict` returned: the same bytes, for less work.

    :func:`_orjson_jcs` reads its output back to catch values JSON does not have (tuples, NaN,
    UUIDs …). A value parsed from JSON has none: it is dicts, lists, str, int, float, bool and
    None, and orjson writes a parsed float as its shortest round-trip spelling, so the read-back
    could only agree. What can still differ from JCS is screened as in :func:`_orjson_jcs`
    (exponent or integral float tokens, 4-byte characters, which change the key order; ints past
    2**53 and lone surrogates make orjson raise); any of them goes to :func:`jcs`. The audit sink
    canonicalises every record it stores, which is why the read-back is worth saving.
    """
    try:
        data = orjson.dumps(obj, option=_ORJSON_OPTS)
    except (orjson.JSONEncodeError, TypeError):
        return jcs(obj)
    if (not data.isascii() and any(lead in data for lead in _UTF8_LEAD4)) or _float_unlike_jcs(data):
        return jcs(obj)
    return sized(data)


def jcs_parsed_and_member(obj: dict[str, Any], key: str) -> tuple[bytes, bytes]:
    """``(jcs_parsed(obj), jcs_parsed(obj[key]))`` with one screen: the audit sink's doc and payload.

    When orjson's bytes for the whole pass the screens, every part of them passes too (the
    screens look for tokens and characters, and a part's bytes are a slice of the whole's), so the
    member is written by orjson unscreened. Otherwise both take :func:`jcs`.
    """
    try:
        whole = orjson.dumps(obj, option=_ORJSON_OPTS)
        part = orjson.dumps(obj[key], option=_ORJSON_OPTS)
    except (orjson.JSONEncodeError, TypeError):
        return jcs(obj), jcs(obj[key])
    if (not whole.isascii() and any(lead in whole for lead in _UTF8_LEAD4)) or _float_unlike_jcs(whole):
        return jcs(obj), jcs(obj[key])
    return sized(whole), sized(part)


def reference_jcs(obj: Any) -> bytes:
    """:func:`jcs` through the reference ``rfc8785`` package only: the yardstick fast paths are checked against.

    Raises:
        EventRejected: as :func:`jcs`.
    """
    try:
        return rfc8785.dumps(obj)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError, TypeError, ValueError) as e:
        # Re-walk to say *where*; the walk raises the precise, path-naming error.
        check_json_safe(obj)
        raise EventRejected("invalid_payload", f"value cannot be canonicalised (RFC 8785): {e}") from e


def utf16_key(key: str) -> bytes:
    """Sort key of an object member name (RFC 8785 §3.2.3: UTF-16 code units; big-endian bytes compare the same)."""
    return key.encode("utf-16-be", "surrogatepass")


def canonical_leaf(value: Any) -> bytes:
    """JCS bytes of a scalar (or an object key), skipping the general path for the common kinds.

    RFC 8785 escapes exactly what ``json`` does with ``ensure_ascii=False`` (quote, backslash,
    and U+0000-U+001F as the short escapes or lowercase 4-hex-digit ones) and writes safe
    integers in plain decimal and non-integral floats in 1e-4..1e16 as ``repr`` does;
    everything else (other floats, unsafe integers, lone surrogates, containers) goes
    through :func:`jcs`, which also raises the contract's errors.
    """
    kind = type(value)
    if kind is str:
        try:
            return _JSON_STRING(value).encode("utf-8")
        except UnicodeEncodeError:
            return reference_jcs(value)
    if kind is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return str(value).encode("ascii")
    if kind is bool:
        return _LITERALS[value]
    if value is None:
        return b"null"
    if kind is float and 1e-4 <= abs(value) < 1e16 and not value.is_integer():
        return repr(value).encode("ascii")
    return jcs(value)


def _compose(obj: Any) -> bytes:
    """JCS of an exact JSON value, containers composed from canonical leaves; :class:`_NotFast` otherwise."""
    kind = type(obj)
    if kind is dict:
        for k in obj:
            if type(k) is not str:
                raise _NotFast
        keys = sorted(obj) if all(k.isascii() for k in obj) else sorted(obj, key=utf16_key)
        return b"{" + b",".join([_compose_leaf(k) + b":" + _compose(obj[k]) for k in keys]) + b"}"
    if kind is list:
        return b"[" + b",".join([_compose(v) for v in obj]) + b"]"
    return _compose_leaf(obj)


def _compose_leaf(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        try:
            return _JSON_STRING(value).encode("utf-8")
        except UnicodeEncodeError:
            raise _NotFast from None
    if kind is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return str(value).encode("ascii")
        raise _NotFast
    if kind is bool:
        return _LITERALS[value]
    if value is None:
        return b"null"
    if kind is float:
        if 1e-4 <= abs(value) < 1e16 and not value.is_integer():
            return repr(value).encode("ascii")
        if math.isfinite(value):
            return rfc8785.dumps(value)  # exponent forms, integral and tiny floats: the reference spelling
    raise _NotFast


def doc_hash(doc: Any) -> str:
    """``sha256_hex(jcs(doc))``: the content address of one value."""
    return sha256_hex(jcs(doc))


def chain_hash(prev_hash: str, doc: dict[str, Any]) -> str:
    """Hash of a committed event: ASCII hex of the previous hash, then the doc's JCS bytes."""
    return sha256_hex(prev_hash.encode("ascii") + jcs(doc))


def hashes_to(recorded: str | None, obj: Any, prefix: bytes = b"") -> bool:
    """Whether ``sha256_hex(prefix + jcs(obj)) == recorded``, for checking a hash someone recorded.

    orjson's sorted-key bytes are hashed as they are, without the screening :func:`jcs` does:
    if they hash to the recorded JCS hash they *are* those JCS bytes (SHA-256), and a value
    they spell faithfully has the same JCS. A ``False`` proves nothing (orjson may spell a
    float unlike JCS): the caller then computes the exact hash. For values read from strict
    JSON and folded from them (no NaN, which orjson would write as ``null``).
    """
    if recorded is None:
        return False
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER)
    except (orjson.JSONEncodeError, TypeError):
        return False
    return hashlib.sha256(prefix + data).hexdigest() == recorded


def chain_link(prev_hash: str, doc: dict[str, Any], data: bytes | None = None) -> tuple[str, bytes]:
    """:func:`chain_hash` and the doc's JCS bytes it was computed from (``data``, when the caller has them).

    The sequencer reuses the bytes for the committed record (:func:`agentlog.streams.codec.encode_committed`),
    so a doc is canonicalised once on its way into the log, not once per use; it computes them while
    validating (:func:`agentlog.schemas.validate.validate_parsed`) and passes them in.
    """
    if data is None:
        data = jcs(doc)
    return sha256_hex(prev_hash.encode("ascii") + data), data


# Upper bounds on JCS output: a character costs at most 6 bytes (``\\u001f``), a number
# at most 25 (``-2.2250738585072014e-308``), ``false`` 5.
_MAX_CHAR_BYTES = 6
_MAX_NUMBER_BYTES = 25


def jcs_size_bound(obj: Any) -> int | None:
    """An upper bound on ``len(jcs(obj))``, or ``None`` when ``obj`` is not plainly JSON-safe.

    One pass, no allocation per value: lets the per-event size check skip the
    (much slower) exact canonicalisation for every event that is clearly small.
    ``None`` also covers tuples, subclasses and other types the slow path judges.
    """
    stack = [obj]
    pop = stack.pop
    push = stack.append
    lo, hi = -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER
    isfinite = math.isfinite
    size = 0
    while stack:
        value = pop()
        cls = type(value)
        if cls is str:
            size += 2 + _MAX_CHAR_BYTES * len(value)
        elif cls is dict:
            size += 2 + len(value)  # braces, and ':' / ',' per member
            for k, v in value.items():
                if type(k) is not str:
                    return None
                size += 2 + _MAX_CHAR_BYTES * len(k)
                push(v)
        elif cls is list:
            size += 2 + len(value)
            stack.extend(value)
        elif cls is bool or value is None:
            size += 5
        elif cls is int:
            if not lo <= value <= hi:
                return None
            size += _MAX_NUMBER_BYTES
        elif cls is float:
            if not isfinite(value):
                return None
            size += _MAX_NUMBER_BYTES
        else:
            return None
    return size


def check_json_safe(obj: Any, path: str = "$") -> None:
    """Refuse values that do not survive a trip through every JSON implementation.

    Iterative (no recursion limit on deep payloads). ``bool`` is accepted as a
    boolean, never as an integer.

    Raises:
        EventRejected: ``unsafe_integer``, ``non_finite_number`` or
            ``invalid_payload`` (non-JSON type, non-string key), naming the path.
    """
    if jcs_size_bound(obj) is not None:
        return
    stack: list[tuple[Any, str]] = [(obj, path)]
    pop = stack.pop
    push = stack.append
    while stack:
        value, where = pop()
        if isinstance(value, (bool, str)) or value is None:
            continue
        if isinstance(value, int):
            if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                continue
            raise EventRejected(
                "unsafe_integer",
                f"integer at {where} is outside ±(2^53-1); send it as a string",
            )
        if isinstance(value, float):
            if math.isfinite(value):
                continue
            raise EventRejected(
                "non_finite_number", f"number at {where} is {value!r}; JSON has no NaN/Infinity"
            )
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise EventRejected("invalid_payload", f"object key {k!r} at {where} is not a string")
                push((v, f"{where}.{k}"))
            continue
        if isinstance(value, list | tuple):
            for i, v in enumerate(value):
                push((v, f"{where}[{i}]"))
            continue
        raise EventRejected("invalid_payload", f"value at {where} has non-JSON type {type(value).__name__}")


def _reject_constant(name: str) -> Any:
    raise EventRejected("non_finite_number", f"JSON literal {name} is not allowed (NaN/Infinity)")


def _float_finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise EventRejected("non_finite_number", f"number {text} overflows to {value}")
    return value


_LONG_DIGITS = re.compile(r"\d{16}")


def _number_from_int_literal(text: str) -> int | float:
    # JSON has one number type. JCS (and JavaScript) write a large integral double such
    # as 6.442739046447045e16 as the digits "64427390464470450"; reading those back as a
    # Python int would turn a value we accepted into an "unsafe integer". Beyond the safe
    # range, a literal that is exactly the JCS spelling of a double is read as that
    # double; any other stays an int and is refused later as unsafe.
    value = int(text)
    if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    try:
        as_float = float(value)
        spelled = rfc8785.dumps(as_float)
    except (OverflowError, rfc8785.CanonicalizationError):
        return value
    return as_float if spelled == text.encode("ascii") else value


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise EventRejected("decode_error", f"duplicate object key {k!r}")
            seen.add(k)
    return out


_NO_VALUE = object()


def _orjson_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value of ``data`` by orjson when writing it back gives ``data`` again; else ``_NO_VALUE``.

    orjson keeps the last of duplicate keys, so its result alone proves nothing. But a
    dict has unique keys, so text that orjson writes back byte for byte (insertion order is
    kept) has none either; equal text also means every number and string reads as the
    reference decoder reads it (a float's shortest round-trip spelling is that float). That
    is what the log and every other internal topic hold (compact JCS), and SDK payloads.
    Integers beyond ±(2**53 - 1) make the write-back raise (the reference path decides
    what they mean), and anything else that differs (whitespace, exponents, escapes of
    other spellings, NaN, invalid UTF-8) is left to the reference path, which also words the error.
    """
    try:
        value = orjson.loads(data)
        back = orjson.dumps(value, option=orjson.OPT_STRICT_INTEGER)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return _NO_VALUE
    if isinstance(data, str):
        return value if back == data.encode("utf-8", "surrogatepass") else _NO_VALUE
    return value if back == data else _NO_VALUE


def loads_strict(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON the way the contract reads it: no NaN/Infinity, no duplicate keys, UTF-8.

    An integer literal beyond ±(2**53 - 1) that is the JCS spelling of a double (how
    JCS and JavaScript write an integral float like ``1e17``) is read as that float, so JCS text always
    reads back to a value with the same JCS bytes; any other such literal stays an int
    and is refused as ``unsafe_integer`` by :func:`check_json_safe`.

    Raises:
        EventRejected: ``decode_error`` (not JSON, not UTF-8, duplicate key) or
            ``non_finite_number`` (NaN/Infinity literal, or a number that overflows).
    """
    value = _orjson_loads(data)
    if value is not _NO_VALUE:
        return value
    try:
        if not isinstance(data, str):
            data = bytes(data).decode("utf-8")
        return json.loads(
            data,
            parse_constant=_reject_constant,
            parse_float=_float_finite,
            # Only a run of 16+ digits can be beyond 2**53 - 1: skip the per-int hook otherwise.
            parse_int=_number_from_int_literal if _LONG_DIGITS.search(data) else None,
            object_pairs_hook=_unique_pairs,
        )
    except EventRejected:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise EventRejected("decode_error", f"not valid UTF-8 JSON: {e}") from e
