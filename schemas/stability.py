"""Field stability (AOS PIN-009): which fields replay compares and which are volatile.

A replay re-runs the same work at another time, on another host, under a new
run id. Fields that only record *when*, *how fast*, *which trace* or *what a
human was told* cannot match and must not decide a verdict; everything else
(status, codes, retry counts, cost, variables, channels, tool results, the
order and target of side effects) is compared. The table below is the single
declaration of that split; replay strips the volatile paths and compares the
rest byte for byte (as JCS).

Paths are dotted from the doc root, ``[*]`` for every element of an array and
``[3]`` for one, like the AOS replay-assertion fixture
(``side_effects[*].timestamp``). A key that is not a plain identifier is written
as a JSON string in brackets: ``payload["a.b"]``. A path covers everything
beneath it: ``payload.error.details`` makes ``payload.error.details.x`` volatile.

Volatile payload fields are only declared at places where they are metadata.
Observable values (``variable.changed.value``, ``channel.written.value``,
``agent.toolReturned.result``) are never searched for volatile-looking keys:
a variable that holds ``{"timestamp": ...}`` is state, and a change in it is a
divergence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final

__all__ = [
    "COMMON_VOLATILE_PAYLOAD_PATHS",
    "MISSING",
    "VOLATILE_ENVELOPE_FIELDS",
    "VOLATILE_PAYLOAD_PATHS",
    "WILDCARD",
    "format_path",
    "get_path",
    "is_volatile",
    "iter_paths",
    "parse_path",
    "path_matches",
    "strip_volatile",
    "volatile_paths",
]

#: Envelope fields a replay cannot reproduce: ``timestamp`` (wall clock), ``eventId``
#: (freshly minted), ``runId`` (a replay is a new run), ``causationId`` (a raw event id:
#: replay compares it through the original↔replay event-id mapping instead).
VOLATILE_ENVELOPE_FIELDS: Final[tuple[str, ...]] = ("timestamp", "eventId", "causationId", "runId")

#: Volatile in every payload: clocks, latency, trace context, request ids, human text,
#: raw provider/HTTP bodies, and the AOS StructuredOutcome's volatile fields.
COMMON_VOLATILE_PAYLOAD_PATHS: Final[tuple[str, ...]] = (
    "payload.timestamp",
    "payload.startedAt",
    "payload.completedAt",
    "payload.createdAt",
    "payload.endedAt",
    "payload.latency",
    "payload.latencyMs",
    "payload.latency_ms",
    "payload.latencyMillis",
    "payload.durationMs",
    "payload.duration_ms",
    "payload.traceId",
    "payload.spanId",
    "payload.trace_id",
    "payload.span_id",
    "payload.traceparent",
    "payload.tracestate",
    "payload.requestId",
    "payload.request_id",
    "payload.message",
    "payload.rawResponse",
    "payload.raw_response",
    "payload.response_body",
    "payload.responseBody",
    "payload.error.message",
    "payload.error.details",
    "payload.details.response_body",
    "payload.observability.trace_id",
    "payload.observability.span_id",
    "payload.observability.traceId",
    "payload.observability.spanId",
    "payload.side_effects[*].timestamp",
    "payload.sideEffects[*].timestamp",
)

#: Extra volatile paths per event type (on top of the envelope and common ones).
VOLATILE_PAYLOAD_PATHS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        # LLM calls: the request is compared through its cacheKey; transport bits and the raw body vary.
        "agent.invocation.started": (
            "payload.request.requestId",
            "payload.request.traceId",
            "payload.request.timeout",
            "payload.request.timeoutMs",
        ),
        "agent.invocation.completed": (
            "payload.envelope.rawResponse",
            "payload.envelope.raw_response",
            "payload.usage.latencyMs",
            "payload.usage.costEstimateUsd",
        ),
        # Refusal text is the provider's prose; the fact of refusal and its cacheKey are compared.
        "envelope.refusal": ("payload.refusalText", "payload.reason"),
        "agent.toolReturned": ("payload.raw",),
        # Upstream: "costEstimateUsd MAY be omitted on replay"; tokens and costCents are compared.
        "provider.usage": ("payload.costEstimateUsd",),
        "replay.divergedAtRefusal": ("payload.refusalReason", "payload.originalEventId"),
        "replay.diverged": ("payload.originalEventId",),
        "log.appended": ("payload",),
        "agent.reasoning.delta": ("payload",),
        "output.chunk": ("payload.chunkedAt",),
    }
)


class _Wildcard:
    __slots__ = ()

    def __repr__(self) -> str:
        return "WILDCARD"


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: The ``[*]`` path segment.
WILDCARD: Final = _Wildcard()
#: Returned by :func:`get_path` when nothing is at the path and no default was given.
MISSING: Final = _Missing()

Segment = str | int | _Wildcard

_TOKEN = re.compile(r'\.?([A-Za-z_$][\w$\-]*)|\[(\*|\d+|"(?:[^"\\]|\\.)*")\]')
_PLAIN_KEY = re.compile(r"[A-Za-z_$][\w$\-]*\Z")


@lru_cache(maxsize=4096)
def parse_path(path: str) -> tuple[Segment, ...]:
    """``'payload.items[*].id'`` → ``('payload', 'items', WILDCARD, 'id')``.

    Raises:
        ValueError: for text that is not a path in this syntax.
    """
    segments: list[Segment] = []
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if m is None or (pos == 0 and path.startswith(".")):
            raise ValueError(f"bad path {path!r} at offset {pos}")
        key, index = m.groups()
        if key is not None:
            segments.append(key)
        elif index == "*":
            segments.append(WILDCARD)
        elif index.startswith('"'):
            segments.append(json.loads(index))
        else:
            segments.append(int(index))
        pos = m.end()
    return tuple(segments)


def format_path(segments: tuple[Segment, ...] | list[Segment]) -> str:
    """Inverse of :func:`parse_path`."""
    out: list[str] = []
    for seg in segments:
        if isinstance(seg, _Wildcard):
            out.append("[*]")
        elif isinstance(seg, int):
            out.append(f"[{seg}]")
        elif _PLAIN_KEY.match(seg):
            out.append(f".{seg}" if out else seg)
        else:
            out.append(f"[{json.dumps(seg, ensure_ascii=False)}]")
    return "".join(out)


def _walk(obj: Any, segments: tuple[Segment, ...]) -> Iterator[Any]:
    if not segments:
        yield obj
        return
    head, rest = segments[0], segments[1:]
    if head is WILDCARD:
        if isinstance(obj, list):
            for item in obj:
                yield from _walk(item, rest)
    elif isinstance(head, int):
        if isinstance(obj, list) and 0 <= head < len(obj):
            yield from _walk(obj[head], rest)
    elif isinstance(obj, dict) and head in obj:
        yield from _walk(obj[head], rest)


def get_path(obj: Any, path: str, default: Any = MISSING) -> Any:
    """The value at ``path``; with ``[*]`` a list of the values found (possibly empty).

    Returns ``default`` when a path without wildcards leads nowhere.
    """
    segments = parse_path(path)
    found = list(_walk(obj, segments))
    if any(seg is WILDCARD for seg in segments):
        return found
    return found[0] if found else default


def iter_paths(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of ``obj`` as ``(concrete path, value)``, in document order.

    Scalars and empty containers are leaves, so two values with the same leaves
    are equal. Paths use concrete indexes (``items[0]``), never ``[*]``.
    """
    start: tuple[Segment, ...] = parse_path(prefix) if prefix else ()
    stack: list[tuple[tuple[Segment, ...], Any]] = [(start, obj)]
    while stack:
        segments, value = stack.pop()
        if isinstance(value, dict) and value:
            stack.extend((segments + (k,), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list) and value:
            stack.extend((segments + (i,), v) for i, v in reversed(list(enumerate(value))))
        else:
            yield format_path(segments), value


def path_matches(pattern: str, path: str) -> bool:
    """True when concrete ``path`` is at or beneath ``pattern`` (``[*]`` matches any index)."""
    pat, concrete = parse_path(pattern), parse_path(path)
    if len(concrete) < len(pat):
        return False
    for p, c in zip(pat, concrete, strict=False):
        if p is WILDCARD:
            if not isinstance(c, int) and c is not WILDCARD:
                return False
        elif p != c or type(p) is not type(c):
            return False
    return True


@lru_cache(maxsize=512)
def volatile_paths(event_type: str) -> tuple[str, ...]:
    """Every volatile path of an event of ``event_type``, envelope fields first."""
    return (
        VOLATILE_ENVELOPE_FIELDS
        + COMMON_VOLATILE_PAYLOAD_PATHS
        + VOLATILE_PAYLOAD_PATHS.get(event_type, ())
    )


def is_volatile(event_type: str, path: str) -> bool:
    """True when a change at ``path`` (concrete or with ``[*]``) must not count as divergence."""
    return any(path_matches(pattern, path) for pattern in volatile_paths(event_type))


def _without(obj: Any, segments: tuple[Segment, ...]) -> Any:
    """``obj`` minus what ``segments`` points at; untouched branches are shared, never mutated."""
    head, rest = segments[0], segments[1:]
    if isinstance(head, (_Wildcard, int)):
        if not isinstance(obj, list):
            return obj
        indexes: range | list[int] = (
            range(len(obj)) if isinstance(head, _Wildcard) else [head] if 0 <= head < len(obj) else []
        )
        if not rest:
            return [v for i, v in enumerate(obj) if i not in indexes]
        items = list(obj)
        for i in indexes:
            items[i] = _without(items[i], rest)
        return items
    if not isinstance(obj, dict) or head not in obj:
        return obj
    fields = dict(obj)
    if rest:
        fields[head] = _without(obj[head], rest)
    else:
        del fields[head]
    return fields


def strip_volatile(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without its volatile fields: what replay compares (as JCS) with the original.

    Never mutates ``doc``; unchanged sub-objects are shared with it.
    """
    out: dict[str, Any] = doc
    for pattern in volatile_paths(str(doc.get("type", ""))):
        out = _without(out, parse_path(pattern))
    return out
