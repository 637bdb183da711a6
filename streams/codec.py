"""Wire codec: bytes on a topic <-> dicts.

The ingest topic carries two encodings side by side (SPEC §3): Confluent-framed
Avro from the SDK and plain JSON from any other client (``kcat``, other
languages). The first byte tells them apart, so one consumer reads both.
Internal topics always carry JCS JSON, which is byte-stable: a re-emitted
record is byte-identical to the first, and readers can compare duplicates by bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from agentlog.schemas.avro import decode_avro, encode_avro
from agentlog.schemas.canonical import MAX_SAFE_INTEGER, canonical_leaf, jcs, loads_strict
from agentlog.schemas.errors import EventRejected

__all__ = ["decode_ingest", "encode_committed", "encode_json", "encode_avro", "encode_record", "decode_record"]

_WHITESPACE = b" \t\r\n"
_AVRO_MAGIC = 0x00


def decode_ingest(value: bytes | None) -> dict[str, Any]:
    """Decode one ingest record value (Avro or JSON) into a RunEventDoc dict, without validating it.

    Raises ``EventRejected`` with code ``bad_magic`` for binary values that are neither,
    ``decode_error`` for text that is not a JSON object or for truncated Avro.
    """
    if not value:
        raise EventRejected("decode_error", "empty record value")
    first = value[0]
    if first == _AVRO_MAGIC:
        return decode_avro(value)
    stripped = value.lstrip(_WHITESPACE)
    if stripped[:1] == b"{":
        doc = loads_strict(stripped)
        if not isinstance(doc, dict):  # pragma: no cover - '{' always parses to an object
            raise EventRejected("decode_error", "JSON value is not an object")
        return doc
    if 0x20 <= first < 0x7F or first in _WHITESPACE:
        raise EventRejected(
            "decode_error",
            f"text value does not start with '{{' (starts with {value[:16]!r}); expected a JSON object",
        )
    raise EventRejected("bad_magic", f"first byte 0x{first:02x} is neither the Avro magic byte 0x00 nor '{{'")


def encode_json(doc: dict[str, Any]) -> bytes:
    """A RunEventDoc as JCS JSON bytes: the form non-SDK hosts publish."""
    return jcs(doc)


def encode_record(obj: Mapping[str, Any]) -> bytes:
    """An internal-topic record (CommittedEvent, Transition, …) as JCS JSON bytes."""
    return jcs(obj)


def encode_committed(doc_bytes: bytes, prev_hash: str, hash: str, source: Mapping[str, Any],
                     state_hash: str) -> bytes:
    """A CommittedEvent's JCS bytes, around the doc's JCS bytes already computed for its chain hash.

    JCS is compositional: an object is its members' canonical bytes in key order, and the
    record's keys (``doc`` < ``hash`` < ``prevHash`` < ``source`` < ``stateHash``) and its hex
    hashes need no escaping, so this equals ``encode_record(committed_event(...))`` byte for
    byte (unit-tested against the reference ``rfc8785``) without walking the doc again.
    """
    if not (_HEX64.fullmatch(prev_hash) and _HEX64.fullmatch(hash) and _HEX64.fullmatch(state_hash)):
        raise ValueError("encode_committed takes 64-hex hashes only")
    return (b'{"doc":' + doc_bytes + b',"hash":"' + hash.encode("ascii") + b'","prevHash":"'
            + prev_hash.encode("ascii") + b'","source":' + _source_bytes(source) + b',"stateHash":"'
            + state_hash.encode("ascii") + b'"}')


_HEX64 = re.compile(r"[0-9a-f]{64}")
_SOURCE_KEYS = frozenset({"offset", "partition", "timestampMs", "topic"})


def _source_bytes(source: Mapping[str, Any]) -> bytes:
    """JCS of a record's ``source`` ({topic, partition, offset, timestampMs}), written directly when it has that shape.

    Its members in JCS order (``offset`` < ``partition`` < ``timestampMs`` < ``topic``), safe
    integers in decimal and the topic by :func:`canonical_leaf`; anything else goes through
    :func:`jcs`. It runs once per committed record, so it skips the check of orjson's output that
    a general :func:`jcs` makes.
    """
    offset, partition, ts, topic = (source.get("offset"), source.get("partition"), source.get("timestampMs"),
                                    source.get("topic"))
    if (source.keys() != _SOURCE_KEYS or type(topic) is not str or type(offset) is not int
            or type(partition) is not int or type(ts) is not int
            or not (0 <= offset <= MAX_SAFE_INTEGER and 0 <= partition <= MAX_SAFE_INTEGER
                    and -MAX_SAFE_INTEGER <= ts <= MAX_SAFE_INTEGER)):
        return jcs(source)
    return (b'{"offset":' + str(offset).encode("ascii") + b',"partition":' + str(partition).encode("ascii")
            + b',"timestampMs":' + str(ts).encode("ascii") + b',"topic":' + canonical_leaf(topic) + b"}")


def decode_record(value: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode_record`; strict (no NaN, no duplicate keys)."""
    # Internal topics hold only what encode_record wrote: a JSON object.
    return cast(dict[str, Any], loads_strict(value))
