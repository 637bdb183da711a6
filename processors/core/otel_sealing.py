"""What the OpenTelemetry path seals before it keeps anything, and under which keys (SPEC §12).

The ``spans`` and ``otel-events`` topics hold a host's plaintext for three days, as ``ingest`` does, and an erase
truncates them; nothing else on the OTel path may. Two things used to:

* **Refusals.** The OTLP receiver runs on every worker and writes no single key, so it mints none: what it refuses
  (a body that is no trace export, a span without valid ids or too big for a record) goes on ``spans`` as a
  *refusal* record (:func:`refusal`), keyed by its trace where it has one, and the span mapper, the one writer of
  that partition, files it on ``rejections`` with ``raw`` and ``detail`` sealed
  (:func:`refusal_rejection`; the key is :func:`agentlog.core.sequencing.rejection_sealing`'s).
* **Held spans.** The span mapper holds a trace's spans in its ``otel-held`` table until the trace is published;
  each held chunk is sealed (:func:`seal_held`) under a short-lived key of its ``spans`` partition and hour
  (:func:`held_key_id`), which the mapper shreds once nothing in that hour can still be held
  (:func:`shreddable`). The table's changelog and local files then keep only ciphertext whose key is gone.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from agentlog.core.sealing import ERASED, DataKey, open_value, seal_value
from agentlog.core.sequencing import RAW_MAX_BYTES
from agentlog.schemas.canonical import sized
from agentlog.schemas.content import SEALED
from agentlog.schemas.records import RecordSource, Rejection, rejection

__all__ = ["HELD_BUCKET_MS", "HELD_PIECE_CHARS", "HELD_PREFIX", "REFUSAL_REASONS", "held_bucket", "held_key_id",
           "held_pieces", "open_held", "refusal", "refusal_rejection", "seal_held", "shreddable"]

#: Why the receiver refuses: a body that is not a trace export (``decode_error``), a span without valid trace and
#: span ids (``invalid_envelope``), a span too big for a ``spans`` record (``oversize``).
REFUSAL_REASONS = frozenset({"decode_error", "invalid_envelope", "oversize"})

#: A rejection's detail is kept to this many characters (as :func:`agentlog.core.sequencing.rejection_record`'s).
_DETAIL_MAX = 2000


def refusal(reason: str, detail: str, raw: bytes, trace_id: str | None = None) -> bytes:
    """A ``spans`` record forwarding what the OTLP receiver refused to the span mapper, which files it.

    ``raw`` is kept as its first :data:`~agentlog.core.sequencing.RAW_MAX_BYTES` (base64), with the full length and
    digest where it was cut, as a rejection keeps an oversize value; ``traceId`` where the receiver read one.
    """
    kept = raw[:RAW_MAX_BYTES]
    record: dict[str, Any] = {"refused": reason, "detail": detail[:_DETAIL_MAX],
                              "raw": base64.b64encode(kept).decode("ascii")}
    if len(kept) < len(raw):
        record["rawBytes"] = len(raw)
        record["rawSha256"] = hashlib.sha256(raw).hexdigest()
    if trace_id:
        record["traceId"] = trace_id
    return sized(orjson.dumps(record))


def refusal_rejection(record: Mapping[str, Any], source: RecordSource) -> Rejection:
    """The rejection a refusal record (:func:`refusal`, parsed) is filed as, at the position it was read from.

    It names no run (a refused body or span was never mapped to one), so its key is its ``spans`` partition's.

    Raises:
        ValueError: ``record`` is not a refusal the receiver writes.
    """
    reason, detail, raw = record.get("refused"), record.get("detail"), record.get("raw")
    if reason not in REFUSAL_REASONS or not isinstance(detail, str) or not isinstance(raw, str):
        raise ValueError(f'a refusal is {{"refused": one of {sorted(REFUSAL_REASONS)}, "detail", "raw"}}')
    try:
        kept = base64.b64decode(raw, validate=True)
    except binascii.Error as e:
        raise ValueError(f"a refusal's raw is not base64: {e}") from e
    size, digest = record.get("rawBytes"), record.get("rawSha256")
    if len(kept) > RAW_MAX_BYTES or (size is None) != (digest is None) or (size is not None and not (
            type(size) is int and size > len(kept) and isinstance(digest, str) and len(digest) == 64)):
        raise ValueError("a refusal's raw is at most RAW_MAX_BYTES, cut ones with rawBytes and rawSha256")
    return rejection(reason=str(reason), detail=detail[:_DETAIL_MAX], run_id=None, event_id=None, sequence=None,
                     source=source, raw=raw, raw_bytes=size, raw_sha256=digest)


#: The keyring ids of held spans' keys start with this (:func:`held_key_id`).
HELD_PREFIX = "held/"

#: Held spans are sealed under one key per ``spans`` partition and hour of arrival: a key lives about two hours (its
#: hour, then until every trace held in it has gone out), and a busy partition mints 24 a day.
HELD_BUCKET_MS = 3_600_000

#: A sealed chunk longer than this is stored in pieces of this many characters, one table key each: sealing grows
#: a chunk by a third (base64), and a changelog record must stay under Kafka's 1 MB record limit.
HELD_PIECE_CHARS = 512 * 1024


def held_key_id(partition: int, bucket: int) -> str:
    """The keyring id of the key that seals what ``spans`` partition ``partition`` holds in hour ``bucket``."""
    return f"{HELD_PREFIX}~spans/{partition}/{bucket}"


def held_bucket(first_ms: int, arrived_ms: int) -> int:
    """The hour whose key seals a chunk of a held trace: that of the trace's first held spans (``first_ms``), or of
    the chunk's own arrival if later (Kafka times of records from two producers need not be in order).

    The trace is due :data:`~agentlog.worker.spans.GRACE_MS` after ``first_ms`` at the latest, so it is out before
    the hour is :func:`shreddable`.
    """
    return max(first_ms, arrived_ms) // HELD_BUCKET_MS


def shreddable(bucket: int, now_ms: int, *, grace_ms: int) -> bool:
    """Whether hour ``bucket``'s key can go at ``now_ms``: every trace held in it started before the hour ended,
    so it was due ``grace_ms`` after that at the latest (and a tick publishes what is due before it shreds)."""
    return (bucket + 1) * HELD_BUCKET_MS + grace_ms <= now_ms


def seal_held(spans: Sequence[Mapping[str, Any]], key: DataKey, sealed_under: str, place: str, *,
              piece_chars: int = HELD_PIECE_CHARS) -> list[Any]:
    """The table values holding ``spans`` sealed under ``key`` (keyring id ``sealed_under``), bound to ``place``
    (the chunk's table key): the chunk's value, then its further pieces (strings) when the token is long."""
    token = seal_value(list(spans), key, sealed_under, place, ("spans",))[SEALED]
    pieces = [token[i:i + piece_chars] for i in range(0, len(token), piece_chars)]
    head: dict[str, Any] = {"sealedUnder": sealed_under, "spans": {SEALED: pieces[0]}}
    if len(pieces) > 1:
        head["pieces"] = len(pieces)
    return [head, *pieces[1:]]


def held_pieces(chunk: Any) -> int:
    """How many table values a held chunk's value says it takes (1 for a whole one, and for a plaintext list)."""
    if isinstance(chunk, dict) and type(chunk.get("pieces")) is int:
        return max(1, int(chunk["pieces"]))
    return 1


def open_held(values: Sequence[Any], key_for: Callable[[str], DataKey | None],
              place: str) -> list[dict[str, Any]] | None:
    """The spans :func:`seal_held` sealed (``values``: the chunk's value and its pieces); None once the key is gone.

    A plain list is a chunk held before chunks were sealed, and is its spans.

    Raises:
        ValueError: a piece is missing or is not a string, or the chunk is neither form.
        agentlog.core.sealing.SealError: the token does not open under its key (altered).
        agentlog.core.keyring.KeyringError: the keyring never held the key.
    """
    head = values[0] if values else None
    if isinstance(head, list):
        return head
    if not (isinstance(head, dict) and isinstance(head.get("sealedUnder"), str) and isinstance(head.get("spans"), dict)
            and isinstance(head["spans"].get(SEALED), str)):
        raise ValueError("a held chunk is a list of spans or {sealedUnder, spans: sealed}")
    rest = list(values[1:held_pieces(head)])
    if len(rest) != held_pieces(head) - 1 or not all(isinstance(p, str) for p in rest):
        raise ValueError(f"a held chunk in {held_pieces(head)} pieces has {len(rest) + 1} readable")
    token = {SEALED: head["spans"][SEALED] + "".join(rest)}
    spans = open_value(token, key_for, head["sealedUnder"], place, ("spans",))
    if spans == ERASED:
        return None
    if not isinstance(spans, list):
        raise ValueError("a held chunk does not hold a list of spans")
    return spans
