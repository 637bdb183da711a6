"""The OTLP/HTTP trace receiver: ``POST /v1/traces`` on ``127.0.0.1:$AGENTLOG_OTLP_PORT``.

Faust's web server serves one port (the console/metrics), and OTLP exporters expect
their own (4318 by default), so this is a small aiohttp server of its own, started
with the worker. What it promises, per the OTLP/HTTP spec:

* 200 only once every accepted span is acknowledged by Kafka (acks=all) on the
  ``spans`` topic; the body is an ``ExportTraceServiceResponse`` whose
  ``partial_success`` counts and names the spans it refused (no trace/span id);
* 400 for a body that is not an OTLP trace request (protobuf or JSON, optionally
  gzip) — the exporter does not retry those;
* 503 + ``Retry-After`` when Kafka does not acknowledge in time, so the exporter
  retries; a retried request maps to the same event ids (duplicates, not new events).

Every refused span and every undecodable body also lands on the rejections topic
with a reason: nothing is lost without a record. Decoding is ``opentelemetry-proto``'s
generated code; the JSON form differs from protobuf's JSON mapping only in that ids
are hex, which :func:`decode_request` converts before parsing.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import logging
import math
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from processors.metrics import METRICS
from schemas.canonical import jcs
from schemas.errors import AgentlogError
from schemas.records import record_source, rejection

log = logging.getLogger("agentlog.otlp")

_SAFE = 2**53 - 1
#: Rejections of OTLP input name this pseudo-topic as their source (they never were a Kafka record).
SOURCE_TOPIC = "otlp:/v1/traces"


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
    """The request's spans as the dicts :mod:`processors.core.otel` maps, and descriptions of refused ones."""
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


Send = Callable[[str, bytes], Awaitable[Awaitable[Any]]]
Reject = Callable[[bytes], Awaitable[Awaitable[Any]]]


class Receiver:
    """The ``/v1/traces`` handler. ``send(traceId, value)`` publishes one span record to the spans
    topic and returns its delivery future; ``reject(value)`` does the same for a rejection record."""

    def __init__(self, send: Send, reject: Reject, *, ack_timeout_s: float, max_body_bytes: int,
                 max_span_bytes: int = 900_000) -> None:
        self._send = send
        self._reject = reject
        self._ack_timeout_s = ack_timeout_s
        self.max_body_bytes = max_body_bytes
        # Below Kafka's default 1 MB record limit: a bigger span would fail every retry with 503
        # forever, so it is refused (partial_success + rejection) instead.
        self.max_span_bytes = max_span_bytes

    def app(self) -> web.Application:
        application = web.Application(client_max_size=self.max_body_bytes)
        application.router.add_post("/v1/traces", self.traces)
        return application

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        content_type = request.headers.get("Content-Type", "application/x-protobuf")
        as_json = content_type.split(";")[0].strip().lower() == "application/json"
        try:
            # aiohttp's parser already undid Content-Encoding (gzip/deflate) for request.read().
            export = decode_request(body, content_type)
        except OtlpError as e:
            METRICS.inc("agentlog_otlp_requests_total", outcome="undecodable")
            await self._record_rejection("decode_error", str(e), body)
            return web.Response(status=400, text=json.dumps({"code": e.code, "message": str(e)}),
                                content_type="application/json")
        spans, refused = span_dicts(export)
        records: list[tuple[str, bytes]] = []
        oversize: list[tuple[str, bytes]] = []
        for span in spans:
            value = jcs(span)
            if len(value) <= self.max_span_bytes:
                records.append((span["traceId"], value))
            else:
                oversize.append((f"span {span['name']!r} (trace {span['traceId']}, span {span['spanId']}): "
                                 f"{len(value)} bytes, over the {self.max_span_bytes}-byte limit", value))
        refused += [why for why, _ in oversize]
        try:
            futures = [await self._send(trace_id, value) for trace_id, value in records]
            futures += [await self._reject(_rejection_bytes("invalid_envelope", why, b""))
                        for why in refused[: len(refused) - len(oversize)]]
            futures += [await self._reject(_rejection_bytes("oversize", why, value)) for why, value in oversize]
            await asyncio.wait_for(asyncio.gather(*futures), self._ack_timeout_s)
        except Exception as e:  # noqa: BLE001 - any send failure means "not durable": the exporter must retry
            log.warning("OTLP request not acknowledged by Kafka (%s: %s); answering 503", type(e).__name__, e)
            METRICS.inc("agentlog_otlp_requests_total", outcome="unavailable")
            return web.Response(status=503, headers={"Retry-After": "5"},
                                text='{"code":"otlp_unavailable","message":"Kafka did not acknowledge; retry"}',
                                content_type="application/json")
        METRICS.inc("agentlog_otlp_requests_total", outcome="accepted")
        METRICS.inc("agentlog_otlp_spans_total", len(records), outcome="accepted")
        if refused:
            METRICS.inc("agentlog_otlp_spans_total", len(refused), outcome="rejected")
        response = ExportTraceServiceResponse()
        if refused:
            response.partial_success.rejected_spans = len(refused)
            response.partial_success.error_message = "; ".join(refused)[:4000]
        if as_json:
            return web.Response(status=200, text=json_format.MessageToJson(response), content_type="application/json")
        return web.Response(status=200, body=response.SerializeToString(), content_type="application/x-protobuf")

    async def _record_rejection(self, reason: str, detail: str, raw: bytes) -> None:
        try:
            fut = await self._reject(_rejection_bytes(reason, detail, raw))
            await asyncio.wait_for(fut, self._ack_timeout_s)
        except Exception as e:  # noqa: BLE001 - the client already gets the error; never fail the answer
            log.warning("could not record an OTLP rejection (%s: %s)", type(e).__name__, e)


def _rejection_bytes(reason: str, detail: str, raw: bytes) -> bytes:
    kept = raw[: 256 * 1024]
    extra: dict[str, Any] = {}
    if len(kept) < len(raw):
        extra = {"raw_bytes": len(raw), "raw_sha256": hashlib.sha256(raw).hexdigest()}
    return jcs(rejection(reason=reason, detail=detail[:2000], run_id=None, event_id=None, sequence=None,
                         source=record_source(topic=SOURCE_TOPIC, partition=-1, offset=-1, timestamp_ms=0),
                         raw=base64.b64encode(kept).decode("ascii"), **extra))
