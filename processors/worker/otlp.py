"""The OTLP trace receiver: ``POST /v1/traces`` on ``$AGENTLOG_WEB_HOST:$AGENTLOG_OTLP_PORT``, and its core.

The worker's web server serves one port (the console/metrics), and OTLP exporters expect
their own (4318 by default), so this is a small aiohttp server of its own, started
with the worker on the interface of the worker's other endpoints (``web_host``); OTLP/gRPC
(:mod:`agentlog.worker.otlp_grpc`) serves the same :meth:`Receiver.export` one port below; both are
started by :func:`agentlog.worker.spans.serve_otlp`.
With ``web_token`` set a request needs ``Authorization: Bearer <token>`` (the exporters'
``OTEL_EXPORTER_OTLP_HEADERS``), on loopback too, as every endpoint of the worker does
(:mod:`agentlog.worker.access`). What it promises, per the OTLP/HTTP spec:

* 200 only once every accepted span is acknowledged by Kafka (acks=all) on the
  ``spans`` topic; the body is an ``ExportTraceServiceResponse`` whose
  ``partial_success`` counts and names the spans it refused (no trace/span id);
* 400 for a body that is not an OTLP trace request (protobuf or JSON, optionally
  gzip) — the exporter does not retry those;
* 401 without the token, before the body is read: nothing of the request is written;
* 503 + ``Retry-After`` when Kafka does not acknowledge in time, so the exporter
  retries; a retried request maps to the same event ids (duplicates, not new events).

Every refused span and every undecodable body also lands on the rejections topic
with a reason: nothing is lost without a record. The receiver runs on every worker and is the one
writer of no key, so it seals nothing itself: it forwards what it refuses on ``spans``, keyed by its
trace where it has one (:func:`agentlog.core.otel_sealing.refusal`), and the span mapper of that
partition files it with its bytes and detail sealed. Decoding is ``opentelemetry-proto``'s
generated code; the JSON form differs from protobuf's JSON mapping only in that ids
are hex, which :func:`decode_request` converts before parsing.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import math
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from agentlog.core.otel_sealing import refusal
from agentlog.metrics import METRICS
from agentlog.schemas.canonical import sized
from agentlog.schemas.errors import AgentlogError
from agentlog.worker.access import bearer, same_token

log = logging.getLogger("agentlog.otlp")

_SAFE = 2**53 - 1
#: What a 503's Retry-After (and OTLP/gRPC's RetryInfo) asks the exporter to wait before it retries.
RETRY_AFTER_S = 5
#: Said to a request without the token (the token itself is never echoed).
UNAUTHORIZED = ("this worker requires AGENTLOG_WEB_TOKEN: send 'Authorization: Bearer <token>' "
                "(OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>)")


class OtlpError(AgentlogError):
    """An OTLP request could not be accepted; ``otlp_undecodable`` means fix the exporter's encoding."""

    code = "otlp_error"


def decode_request(body: bytes, content_type: str, content_encoding: str = "") -> ExportTraceServiceRequest:
    """Parse an OTLP/HTTP trace request body (protobuf or JSON, identity or gzip).

    Raises:
        OtlpError: ``otlp_undecodable`` for anything that is not a trace export request.
    """
    try:
        if content_encoding.lower() == "gzip":
            body = gzip.decompress(body)
        elif content_encoding.lower() == "deflate":
            body = zlib.decompress(body)
        request = ExportTraceServiceRequest()
        if content_type.split(";")[0].strip().lower() == "application/json":
            json_format.ParseDict(_hex_ids_to_base64(json.loads(body)), request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
    except (OSError, EOFError, zlib.error, ValueError, DecodeError, json_format.ParseError, TypeError) as e:
        raise OtlpError(f"not an OTLP trace export request ({type(e).__name__}: {e})"[:500],
                        code="otlp_undecodable") from e
    return request


def _hex_ids_to_base64(doc: Any) -> Any:
    """OTLP/JSON writes trace/span ids as hex; protobuf's JSON mapping reads bytes as base64."""
    if not isinstance(doc, dict):
        raise ValueError("an OTLP JSON body is an object")
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for span in ss.get("spans") or []:
                for holder in [span, *(span.get("links") or [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        value = holder.get(key)
                        if isinstance(value, str) and value:
                            holder[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
    return doc


def _value(v: AnyValue) -> Any:
    """An attribute value as JSON (unsafe integers and non-finite floats as strings: JCS refuses them)."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value if abs(v.int_value) <= _SAFE else str(v.int_value)
    if kind == "double_value":
        return v.double_value if math.isfinite(v.double_value) else str(v.double_value)
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def span_dicts(request: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The request's spans as the dicts :mod:`agentlog.core.otel` maps, and descriptions of refused ones."""
    spans: list[dict[str, Any]] = []
    refused: list[str] = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
                if len(span.trace_id) != 16 or len(span.span_id) != 8 or not any(span.trace_id) \
                        or not any(span.span_id):
                    refused.append(f"span {span.name!r} (trace {trace_id or '-'}, span {span_id or '-'}): "
                                   "trace id must be 16 bytes and span id 8 bytes, not all zero")
                    continue
                attributes = {kv.key: _value(kv.value) for kv in span.attributes}
                spans.append({
                    "traceId": trace_id, "spanId": span_id, "parentSpanId": span.parent_span_id.hex(),
                    "name": span.name, "kind": int(span.kind),
                    "startNs": str(span.start_time_unix_nano), "endNs": str(span.end_time_unix_nano),
                    "attributes": attributes,
                    "status": {"code": int(span.status.code), "message": span.status.message},
                    # Span events carry messages in two GenAI forms (the operation-details event,
                    # one event per message); the mapping reads them.
                    **({"events": [{"name": e.name, "timeNs": str(e.time_unix_nano),
                                    "attributes": {kv.key: _value(kv.value) for kv in e.attributes}}
                                   for e in span.events]} if span.events else {}),
                    "resource": resource, "scope": ss.scope.name,
                })
    return spans, refused


#: ``{"traceId":"<32 hex>","spans":[`` … ``]}`` around a ``spans`` record's spans.
_RECORD_HEAD, _RECORD_TAIL = b'{"traceId":"%s","spans":[', b"]}"
_RECORD_OVERHEAD = len(_RECORD_HEAD % (b"0" * 32)) + len(_RECORD_TAIL)


def trace_records(spans: list[dict[str, Any]],
                  max_bytes: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """The ``spans`` records of a request's spans, ``(traceId, value)`` each, and ``(why, bytes)`` of refused spans.

    A record holds spans of one trace, ``{"traceId", "spans": [span, ...]}``, in request order,
    at most ``max_bytes`` (below Kafka's record limit): a request's spans of one trace are one
    record in the usual case, so the span mapper handles, holds and forgets them together. A
    span that does not fit in a record alone is refused. The bytes are orjson's: the mapper reads
    them back as dicts and nothing is hashed from them, so they need not be canonical.
    """
    by_trace: dict[str, list[bytes]] = {}
    oversize: list[tuple[str, bytes]] = []
    for span in spans:
        value = sized(orjson.dumps(span))
        if len(value) + _RECORD_OVERHEAD > max_bytes:
            oversize.append((f"span {span['name']!r} (trace {span['traceId']}, span {span['spanId']}): "
                             f"{len(value)} bytes, over the {max_bytes}-byte limit", value))
        else:
            by_trace.setdefault(span["traceId"], []).append(value)
    records: list[tuple[str, bytes]] = []
    for trace_id, values in by_trace.items():
        head = _RECORD_HEAD % trace_id.encode("ascii")
        chunk: list[bytes] = []
        size = _RECORD_OVERHEAD
        for value in values:
            grows = len(value) + (1 if chunk else 0)  # a comma before every span but the first
            if chunk and size + grows > max_bytes:
                records.append((trace_id, head + b",".join(chunk) + _RECORD_TAIL))
                chunk, size, grows = [], _RECORD_OVERHEAD, len(value)
            chunk.append(value)
            size += grows
        records.append((trace_id, head + b",".join(chunk) + _RECORD_TAIL))
    return records, oversize


Send = Callable[[str, bytes], Awaitable[Awaitable[Any]]]
Refuse = Callable[[str | None, bytes], Awaitable[Awaitable[Any]]]


class Receiver:
    """What both OTLP transports do with a request: check the token, map its spans, send them, wait for Kafka.

    ``send(traceId, value)`` publishes one record of a trace's spans (:func:`trace_records`) to the
    spans topic and returns its delivery future; ``refuse(traceId | None, value)`` does the same for a
    refusal record (:func:`agentlog.core.otel_sealing.refusal`), which the span mapper files. ``token``: the
    worker's ``web_token`` (empty: no token asked, which :func:`agentlog.streams.settings.check_web_access` allows
    on loopback only). :meth:`app` is the OTLP/HTTP
    server; :mod:`agentlog.worker.otlp_grpc` serves the same :meth:`export` over gRPC.
    """

    def __init__(self, send: Send, refuse: Refuse, *, ack_timeout_s: float, max_body_bytes: int,
                 max_span_bytes: int = 900_000, token: str = "") -> None:
        self._send = send
        self._refuse = refuse
        self._ack_timeout_s = ack_timeout_s
        self._token = token
        self.max_body_bytes = max_body_bytes
        # Below Kafka's default 1 MB record limit: a bigger span would fail every retry with 503
        # forever, so it is refused (partial_success + rejection) instead.
        self.max_span_bytes = max_span_bytes

    def authorized(self, authorization: str) -> bool:
        """Whether a request whose ``Authorization`` header (gRPC: metadata) is this may export.

        A refused request is counted and nothing of it is written, not even a refusal record:
        whoever lacks the token must not be able to fill a topic.
        """
        given = bearer(authorization)
        if not self._token or (given is not None and same_token(given, self._token)):
            return True
        METRICS.inc("agentlog_otlp_requests_total", outcome="unauthorized")
        return False

    def app(self) -> web.Application:
        application = web.Application(client_max_size=self.max_body_bytes)
        application.router.add_post("/v1/traces", self.traces)
        return application

    async def traces(self, request: web.Request) -> web.Response:
        """``POST /v1/traces``: OTLP/HTTP's answers to :meth:`export`'s outcomes."""
        if not self.authorized(request.headers.get("Authorization", "")):  # before the body is read
            return web.json_response({"code": "unauthorized", "message": UNAUTHORIZED}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="agentlog"'})
        body = await request.read()
        content_type = request.headers.get("Content-Type", "application/x-protobuf")
        as_json = content_type.split(";")[0].strip().lower() == "application/json"
        try:
            # aiohttp's parser already undid Content-Encoding (gzip/deflate) for request.read().
            export = decode_request(body, content_type)
        except OtlpError as e:
            await self.undecodable(e, body)
            return web.Response(status=400, text=json.dumps({"code": e.code, "message": str(e)}),
                                content_type="application/json")
        try:
            response = await self.export(export)
        except OtlpError as e:
            return web.Response(status=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                                text=json.dumps({"code": e.code, "message": str(e)}), content_type="application/json")
        if as_json:
            return web.Response(status=200, text=json_format.MessageToJson(response), content_type="application/json")
        return web.Response(status=200, body=response.SerializeToString(), content_type="application/x-protobuf")

    async def undecodable(self, error: OtlpError, body: bytes) -> None:
        """Count a request that is not an OTLP trace export and forward it to be recorded on the rejections topic."""
        METRICS.inc("agentlog_otlp_requests_total", outcome="undecodable")
        try:
            fut = await self._refuse(None, refusal("decode_error", str(error), body))
            await asyncio.wait_for(fut, self._ack_timeout_s)
        except Exception as e:  # noqa: BLE001 - the client already gets the error; never fail the answer
            log.warning("could not record an OTLP rejection (%s: %s)", type(e).__name__, e)

    async def export(self, export: ExportTraceServiceRequest) -> ExportTraceServiceResponse:
        """Send the request's spans to the spans topic; the answer once Kafka has acknowledged every one.

        Refused spans (no valid ids, too big for a record) go to the rejections topic (through the span
        mapper) and are named in the answer's ``partial_success``.

        Raises:
            OtlpError: ``otlp_unavailable`` when Kafka did not acknowledge within the timeout: the
                exporter must retry (the same spans map to the same event ids, so a retry adds nothing).
        """
        spans, refused = span_dicts(export)
        records, too_big = trace_records(spans, self.max_span_bytes)
        oversize = [(str(orjson.loads(value)["traceId"]), why, value) for why, value in too_big]
        refused += [why for _, why, _ in oversize]
        try:
            futures = [await self._send(trace_id, value) for trace_id, value in records]
            futures += [await self._refuse(None, refusal("invalid_envelope", why, b""))
                        for why in refused[: len(refused) - len(oversize)]]
            futures += [await self._refuse(trace_id, refusal("oversize", why, value, trace_id))
                        for trace_id, why, value in oversize]
            await asyncio.wait_for(asyncio.gather(*futures), self._ack_timeout_s)
        except Exception as e:  # noqa: BLE001 - any send failure means "not durable": the exporter must retry
            log.warning("OTLP request not acknowledged by Kafka (%s: %s); asking the exporter to retry",
                        type(e).__name__, e)
            METRICS.inc("agentlog_otlp_requests_total", outcome="unavailable")
            raise OtlpError("Kafka did not acknowledge; retry", code="otlp_unavailable") from e
        METRICS.inc("agentlog_otlp_requests_total", outcome="accepted")
        METRICS.inc("agentlog_otlp_spans_total", len(spans) - len(oversize), outcome="accepted")
        if refused:
            METRICS.inc("agentlog_otlp_spans_total", len(refused), outcome="rejected")
        response = ExportTraceServiceResponse()
        if refused:
            response.partial_success.rejected_spans = len(refused)
            response.partial_success.error_message = "; ".join(refused)[:4000]
        return response
