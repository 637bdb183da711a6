"""The door every event passes: envelope, JSON safety, size, typed payload.

It runs once per ingested event (tens of thousands a second), so the envelope
is checked with plain Python against the rules of openwop's
``run-event.schema.json`` rather than with a JSON-Schema engine, and pydantic
is used only for the payloads of the types we interpret (models built at import).
The contract tests prove these checks agree with the upstream schema.

Order of checks, and so which reason a doc with several faults gets:
envelope shape (``invalid_envelope``) → event type (``unknown_event_type``) →
JSON safety (``unsafe_integer`` / ``non_finite_number``) → size (``oversize``)
→ payload (``invalid_payload``).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from agentlog.schemas.canonical import check_json_safe, jcs, jcs_parsed, jcs_size_bound
from agentlog.schemas.content import REDACTIONS
from agentlog.schemas.errors import EventRejected
from agentlog.schemas.events import ENVELOPE_FIELDS, ID_MAX_LENGTH, REQUIRED_FIELDS, RUN_EVENT_TYPES
from agentlog.schemas.payloads import NULLABLE_PAYLOAD_TYPES, PAYLOAD_MODELS

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EventRejected",
    "REJECTION_CODES",
    "RUN_EVENT_TYPES",
    "is_rfc3339",
    "validate_doc",
    "validate_minted",
    "validate_parsed",
    "validate_payload",
]

#: Largest accepted ``len(jcs(doc))``: Kafka's default ``max.message.bytes`` is 1 MiB.
DEFAULT_MAX_BYTES = 1_048_576

#: Stable rejection reason codes (CONTRACT.md "Rejection"); the first nine come from here, the last
#: (``run_state_unavailable``) from the worker's fold (:func:`agentlog.core.runstate.fold_next`).
REJECTION_CODES: frozenset[str] = frozenset(
    {
        "decode_error",
        "bad_magic",
        "unknown_schema_id",
        "invalid_envelope",
        "unknown_event_type",
        "unsafe_integer",
        "non_finite_number",
        "invalid_payload",
        "oversize",
        "duplicate_event_id",
        "sequence_gap",
        "sequence_conflict",
        "dangling_causation",
        "run_closed",
        "run_expired",
        "run_state_unavailable",
        "run_erased",
    }
)

# RFC 3339 §5.6 date-time (what JSON Schema's "date-time" format means): the shape here,
# the ranges (month, day of month, hour, ...) by ``datetime.fromisoformat`` (C, fast).
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:(\d{2})(?:\.\d+)?(?:[Zz]|[+-]\d{2}:([0-5]\d))",
    re.ASCII,
)


def is_rfc3339(value: str) -> bool:
    """True when ``value`` is an RFC 3339 date-time with in-range fields (leap second allowed)."""
    m = _RFC3339.fullmatch(value)
    if m is None:
        return False
    if m.group(1) == "60":  # leap second: fromisoformat has no :60, the rest must still be valid
        value = value[: m.start(1)] + "59" + value[m.end(1) :]
    try:
        datetime.fromisoformat(value.upper())
    except ValueError:
        return False
    return True


def _bad(detail: str) -> EventRejected:
    return EventRejected("invalid_envelope", detail)


def _check_id(doc: dict[str, Any], name: str) -> None:
    value = doc[name]
    if type(value) is not str:
        raise _bad(f"{name} must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= ID_MAX_LENGTH:
        raise _bad(f"{name} must be 1..{ID_MAX_LENGTH} characters, got {len(value)}")


def _check_envelope(doc: Any) -> None:
    if type(doc) is not dict:
        raise _bad(f"a RunEventDoc is a JSON object, got {type(doc).__name__}")
    if not doc.keys() <= ENVELOPE_FIELDS:
        extra = sorted(str(k) for k in doc.keys() - ENVELOPE_FIELDS)
        raise _bad(f"unknown envelope field(s) {extra}; store-side data travels beside the doc")
    for name in REQUIRED_FIELDS:
        if name not in doc:
            raise _bad(f"missing required field {name!r}")
    _check_id(doc, "eventId")
    _check_id(doc, "runId")
    if type(doc["type"]) is not str:
        raise _bad(f"type must be a string, got {type(doc['type']).__name__}")
    timestamp = doc["timestamp"]
    if type(timestamp) is not str or not is_rfc3339(timestamp):
        raise _bad(f"timestamp must be an RFC 3339 date-time string, got {timestamp!r:.60}")
    sequence = doc["sequence"]
    if type(sequence) is not int or sequence < 0:
        raise _bad(f"sequence must be an integer >= 0, got {sequence!r:.40}")
    if "nodeId" in doc:
        _check_id(doc, "nodeId")
    if "causationId" in doc:
        _check_id(doc, "causationId")
    if "schemaVersion" in doc:
        version = doc["schemaVersion"]
        if type(version) is not int or version < 0:
            raise _bad(f"schemaVersion must be an integer >= 0, got {version!r:.40}")
    if "engineVersion" in doc and type(doc["engineVersion"]) is not str:
        raise _bad(f"engineVersion must be a string, got {type(doc['engineVersion']).__name__}")


def _summarise(e: ValidationError) -> str:
    errors = e.errors(include_url=False, include_input=False)
    first = errors[0]
    where = ".".join(str(p) for p in ("payload", *first["loc"]))
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def validate_payload(event_type: str, payload: Any) -> BaseModel | None:
    """Check ``payload`` against the model of ``event_type``; ``None`` for opaque types.

    Raises:
        EventRejected: ``invalid_payload`` with pydantic's first error on one line.
    """
    model = PAYLOAD_MODELS.get(event_type)
    if model is None:
        return None
    if payload is None and event_type in NULLABLE_PAYLOAD_TYPES:
        payload = {}
    elif isinstance(payload, dict) and REDACTIONS in payload:  # the sequencer's record (an export published again)
        payload = {k: v for k, v in payload.items() if k != REDACTIONS}
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise EventRejected("invalid_payload", f"{event_type}: {_summarise(e)}") from e


def validate_doc(doc: dict[str, Any], *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Accept one RunEventDoc or say exactly why not.

    Returns:
        ``doc`` itself, unchanged (never normalised, so its hash is the producer's).

    Raises:
        EventRejected: with one of ``invalid_envelope``, ``unknown_event_type``,
            ``unsafe_integer``, ``non_finite_number``, ``oversize``, ``invalid_payload``.
    """
    _check_envelope(doc)
    event_type = _known_type(doc)
    bound = jcs_size_bound(doc)
    if bound is None:
        check_json_safe(doc)  # raises, naming the path (or passes on exotic-but-safe types)
    if bound is None or bound > max_bytes:
        size = len(jcs(doc))
        if size > max_bytes:
            raise EventRejected("oversize", f"canonical doc is {size} bytes, limit {max_bytes}")
    validate_payload(event_type, doc["payload"])
    return doc


def validate_parsed(doc: dict[str, Any], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """:func:`validate_doc` for a doc the strict decoder returned, giving its JCS bytes for the chain hash.

    The same checks in the same order, with the same codes. The size is the exact canonical size:
    the sequencer needs the doc's JCS bytes anyway (its chain hash, then the committed record), so
    they are computed here, once, by :func:`agentlog.schemas.canonical.jcs_parsed` (whose precondition
    ``agentlog.streams.codec.decode_ingest`` meets: dicts, lists, str, int, finite float, bool, None), instead
    of a Python walk for a size bound and a second, read-back-checked canonicalisation. A value that
    cannot be canonicalised raises what :func:`check_json_safe` raises.

    Raises:
        EventRejected: as :func:`validate_doc`.
    """
    _check_envelope(doc)
    event_type = _known_type(doc)
    data = jcs_parsed(doc)
    if len(data) > max_bytes:
        raise EventRejected("oversize", f"canonical doc is {len(data)} bytes, limit {max_bytes}")
    validate_payload(event_type, doc["payload"])
    return data


def _known_type(doc: dict[str, Any]) -> str:
    """The doc's ``type``, once it is an OpenWOP RunEventType (every validator checks it in this place)."""
    event_type: str = doc["type"]
    if event_type not in RUN_EVENT_TYPES:
        raise EventRejected("unknown_event_type", f"type {event_type!r:.80} is not an OpenWOP RunEventType")
    return event_type


def _check_caller_parts(doc: dict[str, Any]) -> None:
    """:func:`_check_envelope` for the fields a caller of the SDK supplies (the rest it minted)."""
    if not doc.keys() <= ENVELOPE_FIELDS:
        extra = sorted(str(k) for k in doc.keys() - ENVELOPE_FIELDS)
        raise _bad(f"unknown envelope field(s) {extra}; store-side data travels beside the doc")
    if type(doc["type"]) is not str:
        raise _bad(f"type must be a string, got {type(doc['type']).__name__}")
    if "nodeId" in doc:
        _check_id(doc, "nodeId")
    if "causationId" in doc:
        _check_id(doc, "causationId")


# Bytes a RunEventDoc's JCS adds around its payload and its string fields: braces, member names,
# quotes, separators and a 16-digit sequence, well rounded up.
_ENVELOPE_OVERHEAD = 256


def validate_minted(doc: dict[str, Any], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """:func:`validate_doc` for a doc the SDK assembled itself; returns its payload's JCS bytes.

    The publisher mints ``eventId`` (UUIDv7), ``timestamp`` (RFC 3339) and ``sequence``
    (a counter >= 0) and checks ``runId`` and ``engineVersion`` once per run handle, so per
    event only what the caller passed is checked: the type, ``nodeId``, ``causationId`` and
    the payload. The payload is canonicalised once here: its JCS bytes give the size (exactly,
    when the cheap bound is over the limit) and are what the Avro record carries, so the SDK
    never walks a payload twice. Same reasons, in the same order, as :func:`validate_doc`.

    Raises:
        EventRejected: as :func:`validate_doc`.
    """
    _check_caller_parts(doc)
    event_type = _known_type(doc)
    try:
        payload_bytes = jcs(doc["payload"])
    except EventRejected:
        check_json_safe(doc)  # the same error validate_doc gives, its path from the doc's root
        raise
    bound = len(payload_bytes) + _ENVELOPE_OVERHEAD + 6 * sum(len(v) for v in doc.values() if type(v) is str)
    if bound > max_bytes:
        size = len(jcs(doc))
        if size > max_bytes:
            raise EventRejected("oversize", f"canonical doc is {size} bytes, limit {max_bytes}")
    validate_payload(event_type, doc["payload"])
    return payload_bytes
