"""The LLM cache key (OpenWOP RFC 0041 §A; recipe v2 = RFC 0150 §C).

``key = sha256(JCS(projection(request)))``, lowercase hex. The projection keeps
exactly what can change what the model returns and nothing that only describes
the transport (request/trace ids, tenant, run id, timeouts, retry counters), so
a replay of the same call finds the same key on any host. No Unicode
normalisation is applied beyond JCS: a decomposed and a composed "é" are two
different requests.

Recipe v2 (``openwop-semantic-request-v2``)::

    {"recipe": ..., "provider": ..., "model": ...,
     "request": {messages, tools?, temperature?, topP?, topK?, maxOutputTokens?,
                 seed?, stop?, responseFormat?, safetySettings?},
     "providerOptions"?: {...}}

Absent optionals are omitted (``null`` counts as absent), ``tools`` are sorted by
``name`` in UTF-16 code units (``getWeather`` before ``get_weather``), message
order is kept. Only an explicit ``providerOptions`` object is carried (as is);
every other top-level field is dropped. That is upstream's
``projectSemanticRequestV2`` exactly: a TypeScript host and ours must compute the
same key for the same request, so a host that wants an option such as
``max_tokens`` to change the key names it in ``providerOptions``
(``vendor.<provider>.<option>``) itself.

Recipe v1 (the retired seed recipe older hosts still compute): ``{provider,
model, messages, tools?, temperature?, topP?, topK?, responseFormat?}`` with no
recipe stamp; absent fields omitted, tools sorted the same way. A v1 request
that says ``responseSchema`` (the seed's name) is read as ``responseFormat``.
"""

from __future__ import annotations

from typing import Any

from agentlog.schemas.canonical import jcs, sha256_hex
from agentlog.schemas.errors import CacheKeyError

__all__ = [
    "RECIPE_IDS",
    "TRANSPORT_FIELDS",
    "cache_key",
    "canonical_request",
    "project_request",
    "recipe_id",
]

RECIPE_IDS: dict[str, str] = {
    "v1": "openwop-llm-cache-key-v1",
    "v2": "openwop-semantic-request-v2",
}
_SHORT_NAMES: dict[str, str] = {**{k: k for k in RECIPE_IDS}, **{v: k for k, v in RECIPE_IDS.items()}}

#: Fields that never change the completion, so never change the key (RFC 0150 §C "transport-only").
TRANSPORT_FIELDS: frozenset[str] = frozenset(
    {
        "requestId", "request_id", "correlationId", "correlation_id", "idempotencyKey",
        "invocationId", "logicalInvocationId", "attempt",
        "traceId", "trace_id", "spanId", "span_id", "traceparent", "tracestate", "traceContext",
        "tenant", "tenantId", "tenant_id", "workspaceId",
        "runId", "run_id", "nodeId", "node_id",
        "timeout", "timeoutMs", "timeout_ms", "deadline",
        "retries", "retryCount", "retry_count", "maxRetries", "max_retries",
        "headers", "apiKey", "api_key", "credentials", "credentialHandle",
        "stream", "metadata", "user", "host", "hostId",
        "recipe", "cacheKey",
    }
)  # fmt: skip

_V2_NUMBERS = ("temperature", "topP", "topK", "maxOutputTokens", "seed")
_V2_OBJECTS = ("responseFormat", "safetySettings")


def recipe_id(recipe: str) -> str:
    """Full recipe id for ``"v1"``/``"v2"`` or an id already in full."""
    try:
        return RECIPE_IDS[_SHORT_NAMES[recipe]]
    except KeyError:
        raise CacheKeyError(f"unknown cache-key recipe {recipe!r}; use one of {sorted(RECIPE_IDS)}") from None


def _utf16_key(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like UTF-16 code units (what JS sorts by).
    return name.encode("utf-16-be", "surrogatepass")


def _sorted_tools(tools: Any) -> list[Any]:
    if not isinstance(tools, list):
        raise CacheKeyError(f"tools must be an array, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise CacheKeyError(f"tools[{i}] must be an object with a string 'name'")
    return sorted(tools, key=lambda t: _utf16_key(t["name"]))


def _present(request: dict[str, Any], name: str) -> bool:
    return request.get(name) is not None


def _number(request: dict[str, Any], name: str) -> int | float:
    value = request[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CacheKeyError(f"{name} must be a number, got {type(value).__name__}")
    return value


def _object(request: dict[str, Any], name: str) -> dict[str, Any]:
    value = request[name]
    if not isinstance(value, dict):
        raise CacheKeyError(f"{name} must be an object, got {type(value).__name__}")
    return value


def _base(request: Any) -> tuple[str, str, list[Any]]:
    if not isinstance(request, dict):
        raise CacheKeyError(f"an LLM request is a JSON object, got {type(request).__name__}")
    provider, model, messages = request.get("provider"), request.get("model"), request.get("messages")
    if not isinstance(provider, str) or not provider:
        raise CacheKeyError("request.provider must be a non-empty string")
    if not isinstance(model, str) or not model:
        raise CacheKeyError("request.model must be a non-empty string")
    if not isinstance(messages, list):
        raise CacheKeyError("request.messages must be an array")
    return provider, model, messages


def _project_v1(request: dict[str, Any]) -> dict[str, Any]:
    provider, model, messages = _base(request)
    out: dict[str, Any] = {"provider": provider, "model": model, "messages": messages}
    if _present(request, "tools") and request["tools"]:
        out["tools"] = _sorted_tools(request["tools"])
    for name in ("temperature", "topP", "topK"):
        if _present(request, name):
            out[name] = _number(request, name)
    fmt_field = "responseFormat" if _present(request, "responseFormat") else "responseSchema"
    if _present(request, fmt_field):
        out["responseFormat"] = _object(request, fmt_field)
    return out


def _project_v2(request: dict[str, Any]) -> dict[str, Any]:
    provider, model, messages = _base(request)
    body: dict[str, Any] = {"messages": messages}
    if _present(request, "tools") and request["tools"]:
        body["tools"] = _sorted_tools(request["tools"])
    for name in _V2_NUMBERS:
        if _present(request, name):
            body[name] = _number(request, name)
    if _present(request, "stop"):
        stop = request["stop"]
        # Upstream carries only an array (a bare string would be dropped there, giving another
        # key), so a string is refused rather than keyed differently from a TypeScript host.
        if not isinstance(stop, list):
            raise CacheKeyError(f"stop must be an array of strings, got {type(stop).__name__}")
        body["stop"] = stop
    for name in _V2_OBJECTS:
        if _present(request, name):
            body[name] = _object(request, name)

    out: dict[str, Any] = {"recipe": RECIPE_IDS["v2"], "provider": provider, "model": model, "request": body}
    if _present(request, "providerOptions"):
        out["providerOptions"] = _object(request, "providerOptions")
    return out


def project_request(request: dict[str, Any], recipe: str = "v2") -> dict[str, Any]:
    """The object that is canonicalised and hashed (the key's preimage, before JCS)."""
    short = _SHORT_NAMES.get(recipe)
    if short == "v1":
        return _project_v1(request)
    if short == "v2":
        return _project_v2(request)
    recipe_id(recipe)  # raises the helpful error
    raise AssertionError("unreachable")


def canonical_request(request: dict[str, Any], recipe: str = "v2") -> bytes:
    """JCS bytes of the projection: the exact preimage of :func:`cache_key`."""
    return jcs(project_request(request, recipe))


def cache_key(request: dict[str, Any], recipe: str = "v2") -> str:
    """Lowercase hex SHA-256 of :func:`canonical_request`.

    Raises:
        CacheKeyError: ``invalid_cache_request`` when provider/model/messages are missing
            or a known field has the wrong type; ``unsafe_integer``/``non_finite_number``
            (EventRejected) for values JCS cannot carry.
    """
    return sha256_hex(canonical_request(request, recipe))
