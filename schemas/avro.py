"""RunEventDoc as Confluent-framed Avro: ``0x00`` + 4-byte big-endian schema id + Avro body.

The framing is what every Kafka tool (Schema Registry serdes, kcat ``-s avro``)
expects, so hosts in other languages can produce with stock serialisers once
the schema is registered under :data:`SCHEMA_ID`. The payload, whose shape
depends on the event type, is carried as JCS JSON text: the Avro record stays
one fixed schema and the payload bytes are already the canonical ones we hash.

The ``.avsc`` is package data read once at import, and parsed once.
"""

from __future__ import annotations

import io
import json
import struct
from importlib import resources
from typing import Any, Final, cast

import fastavro

from agentlog.schemas.canonical import jcs, loads_strict
from agentlog.schemas.errors import EventRejected
from agentlog.schemas.events import OPTIONAL_FIELDS, REQUIRED_FIELDS

__all__ = ["MAGIC_BYTE", "PARSED_SCHEMA", "RAW_SCHEMA", "SCHEMA_ID", "decode_avro", "encode_avro"]

#: Registry id we assign to ``schemas/avro/run_event.avsc``. Never reuse it for another schema.
SCHEMA_ID: Final[int] = 1
MAGIC_BYTE: Final[int] = 0

RAW_SCHEMA: Final[dict[str, Any]] = json.loads(
    resources.files("agentlog.schemas").joinpath("avro/run_event.avsc").read_text(encoding="utf-8")
)
PARSED_SCHEMA: Final = fastavro.parse_schema(RAW_SCHEMA)

_HEADER = struct.Struct(">bI")


def encode_avro(doc: dict[str, Any], payload_json: bytes | None = None) -> bytes:
    """Frame one RunEventDoc (already validated) for the ingest topic.

    ``payload_json``, when given, must be ``jcs(doc["payload"])`` (the SDK has it from
    validation; canonicalising the payload again would be most of the encoding cost).

    Raises:
        EventRejected: ``invalid_envelope`` when a field cannot be written with the
            record's types; ``unsafe_integer``/``non_finite_number`` from the payload.
    """
    record = {name: doc.get(name) for name in OPTIONAL_FIELDS}
    try:
        for name in REQUIRED_FIELDS:
            record[name] = doc[name]
    except KeyError as e:
        raise EventRejected("invalid_envelope", f"missing required field {e.args[0]!r}") from None
    record["payload"] = (jcs(doc["payload"]) if payload_json is None else payload_json).decode("utf-8")
    body = _record_body(record)
    if body is not None:
        return _FRAME + body
    out = io.BytesIO()
    out.write(_FRAME)
    try:
        fastavro.schemaless_writer(out, PARSED_SCHEMA, record, strict_allow_default=True)
    except (ValueError, TypeError, AttributeError, OverflowError) as e:
        raise EventRejected("invalid_envelope", f"doc does not fit the Avro record: {e}") from e
    return out.getvalue()


_FRAME = _HEADER.pack(MAGIC_BYTE, SCHEMA_ID)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_STRINGS = ("eventId", "runId", "type", "payload", "timestamp")
_ONE_BYTE = [bytes([i << 1]) for i in range(64)]
_OPTIONALS = (("nodeId", str), ("schemaVersion", int), ("engineVersion", str), ("causationId", str))


def _zigzag(n: int) -> bytes:
    if 0 <= n < 64:  # ids, types, timestamps: one byte
        return _ONE_BYTE[n]
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _record_body(record: dict[str, Any]) -> bytes | None:
    """The Avro binary of the one fixed record schema, written directly (the per-call cost of
    ``fastavro.schemaless_writer`` is half of encoding an event); ``None`` when a field is not
    exactly its schema type, so fastavro decides (and words the error). Byte-identical to
    fastavro for every record it accepts (tests/unit/schemas/test_avro_fast.py)."""
    parts: list[bytes] = []
    try:
        for name in _STRINGS:
            value = record[name]
            if type(value) is not str:
                return None
            data = value.encode("utf-8")
            parts.append(_zigzag(len(data)))
            parts.append(data)
        sequence = record["sequence"]
        if type(sequence) is not int or not _LONG_MIN <= sequence <= _LONG_MAX:
            return None
        parts.append(_zigzag(sequence))
        for name, kind in _OPTIONALS:
            value = record[name]
            if value is None:
                parts.append(b"\x00")
            elif type(value) is not kind:
                return None
            elif isinstance(value, str):
                data = value.encode("utf-8")
                parts.append(b"\x02" + _zigzag(len(data)))
                parts.append(data)
            elif _LONG_MIN <= value <= _LONG_MAX:
                parts.append(b"\x02" + _zigzag(value))
            else:
                return None
    except UnicodeEncodeError:  # a lone surrogate: fastavro reports it
        return None
    return b"".join(parts)


def _read_body(data: bytes) -> tuple[dict[str, Any], str] | None:
    """The doc (payload still JSON text, in its place) read directly from the one fixed record schema.

    The inverse of :func:`_record_body`: ``fastavro.schemaless_reader``'s per-call cost would be most
    of decoding an event in the worker. ``None`` for anything it does not read plainly (truncated,
    trailing bytes, a union index other than 0/1, a varint past 64 bits, bad UTF-8, a negative
    length): fastavro then decides and words the error. Gives fastavro's
    dict for every body fastavro reads (tests/unit/schemas/test_avro_fast.py).
    """
    pos = _HEADER.size
    end = len(data)
    values: list[Any] = []
    try:
        for kind in _READ_KINDS:
            if kind == 2:  # a union: index 0 is null, 1 the value
                branch = data[pos]
                pos += 1
                if branch == 0:
                    values.append(None)
                    continue
                if branch != 2:  # zigzag(1)
                    return None
                kind = _READ_UNION_KINDS[len(values)]
            b = data[pos]
            pos += 1
            n = b & 0x7F
            shift = 7
            while b & 0x80:
                if shift > 63:
                    return None
                b = data[pos]
                pos += 1
                n |= (b & 0x7F) << shift
                shift += 7
            n = (n >> 1) ^ -(n & 1)
            if kind == 1:  # long
                if not _LONG_MIN <= n <= _LONG_MAX:
                    return None
                values.append(n)
                continue
            if n < 0 or pos + n > end:
                return None
            values.append(data[pos:pos + n].decode("utf-8"))
            pos += n
    except (IndexError, UnicodeDecodeError):
        return None
    if pos != end:
        return None
    event_id, run_id, event_type, payload, timestamp, sequence, node_id, schema_version, engine_version, \
        causation_id = values
    doc: dict[str, Any] = {"eventId": event_id, "runId": run_id, "type": event_type, "payload": None,
                           "timestamp": timestamp, "sequence": sequence}
    if node_id is not None:
        doc["nodeId"] = node_id
    if schema_version is not None:
        doc["schemaVersion"] = schema_version
    if engine_version is not None:
        doc["engineVersion"] = engine_version
    if causation_id is not None:
        doc["causationId"] = causation_id
    return doc, payload


# How :func:`_read_body` reads each field of the record, in order: 0 string, 1 long, 2 a [null, T] union
# (T from _READ_UNION_KINDS by the field's position).
_READ_KINDS = (0, 0, 0, 0, 0, 1, 2, 2, 2, 2)
_READ_UNION_KINDS = {6: 0, 7: 1, 8: 0, 9: 0}


def decode_avro(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The RunEventDoc in a framed Avro value; absent optionals stay absent.

    Raises:
        EventRejected: ``bad_magic`` (first byte not 0), ``unknown_schema_id``,
            ``decode_error`` (truncated or trailing bytes, payload not strict JSON).
    """
    data = bytes(data)
    if not data:
        raise EventRejected("decode_error", "empty value")
    if data[0] != MAGIC_BYTE:
        raise EventRejected("bad_magic", f"Avro value must start with 0x00, got 0x{data[0]:02x}")
    if len(data) < _HEADER.size:
        raise EventRejected("decode_error", f"truncated Confluent header ({len(data)} bytes)")
    _, schema_id = _HEADER.unpack_from(data)
    if schema_id != SCHEMA_ID:
        raise EventRejected("unknown_schema_id", f"schema id {schema_id} is not registered (expected {SCHEMA_ID})")
    fast = _read_body(data)
    if fast is not None:
        read, payload = fast
        read["payload"] = loads_strict(payload)
        return read
    body = io.BytesIO(data)
    body.seek(_HEADER.size)
    try:
        record = cast(dict[str, Any], fastavro.schemaless_reader(body, PARSED_SCHEMA, None))
    except (EOFError, ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise EventRejected("decode_error", f"Avro body is truncated or corrupt: {e!r}") from e
    if body.tell() != len(data):
        raise EventRejected("decode_error", f"{len(data) - body.tell()} trailing bytes after the Avro record")
    doc: dict[str, Any] = {name: record[name] for name in REQUIRED_FIELDS}
    doc["payload"] = loads_strict(record["payload"])
    for name in OPTIONAL_FIELDS:
        if record[name] is not None:
            doc[name] = record[name]
    return doc
