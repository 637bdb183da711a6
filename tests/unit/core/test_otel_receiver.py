"""The ``/v1/traces`` answers the OTLP/HTTP spec asks for, on a real aiohttp server.

Kafka is represented by the ``send`` callable the worker hands the receiver (the producer's
delivery futures); here it is a list of futures the test resolves or leaves hanging, which is
what "acknowledged" and "not acknowledged" look like from the receiver's side. The real
broker path is covered by ``tests/integration/otel``.
"""

from __future__ import annotations

import asyncio
import gzip
import json

from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from processors.worker.otlp import Receiver


def _request(*span_ids: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for i, sid in enumerate(span_ids):
        span = spans.add()
        span.trace_id, span.span_id, span.name = bytes(range(1, 17)), sid, f"s{i}"
        span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    return request


class _Kafka:
    def __init__(self, acks: bool) -> None:
        self.acks = acks
        self.sent: list[tuple[str, bytes]] = []
        self.rejections: list[dict] = []

    async def send(self, key: str, value: bytes):
        self.sent.append((key, value))
        fut = asyncio.get_running_loop().create_future()
        if self.acks:
            fut.set_result(None)
        return fut

    async def reject(self, value: bytes):
        self.rejections.append(json.loads(value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def _post(kafka: _Kafka, body: bytes, headers: dict[str, str], max_span_bytes: int = 900_000):
    async def go():
        receiver = Receiver(kafka.send, kafka.reject, ack_timeout_s=0.3, max_body_bytes=1 << 20,
                            max_span_bytes=max_span_bytes)
        async with TestClient(TestServer(receiver.app())) as client:
            resp = await client.post("/v1/traces", data=body, headers=headers)
            return resp.status, dict(resp.headers), await resp.read()
    return asyncio.run(go())


PROTO = {"Content-Type": "application/x-protobuf"}


def test_acknowledged_spans_get_200_and_partial_success_names_the_refused():
    kafka = _Kafka(acks=True)
    body = _request(b"\x01" * 8, b"\x00" * 8, b"\x02" * 8).SerializeToString()
    status, _, raw = _post(kafka, gzip.compress(body), {**PROTO, "Content-Encoding": "gzip"})
    assert status == 200
    response = ExportTraceServiceResponse.FromString(raw)
    assert response.partial_success.rejected_spans == 1
    assert "'s1'" in response.partial_success.error_message
    assert [k for k, _ in kafka.sent] == ["0102030405060708090a0b0c0d0e0f10"] * 2
    assert [r["reason"] for r in kafka.rejections] == ["invalid_envelope"]


def test_no_ack_is_503_with_retry_after():
    status, headers, _ = _post(_Kafka(acks=False), _request(b"\x01" * 8).SerializeToString(), PROTO)
    assert status == 503 and int(headers["Retry-After"]) > 0


def test_garbage_is_400_and_recorded():
    kafka = _Kafka(acks=True)
    status, _, raw = _post(kafka, b"\x0a\xff\xff garbage", PROTO)
    assert status == 400 and json.loads(raw)["code"] == "otlp_undecodable"
    assert kafka.sent == [] and [r["reason"] for r in kafka.rejections] == ["decode_error"]


def test_json_request_gets_a_json_answer():
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0101010101010101", "name": "x",
        "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]}).encode()
    kafka = _Kafka(acks=True)
    status, headers, raw = _post(kafka, body, {"Content-Type": "application/json"})
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(raw) == {} and len(kafka.sent) == 1


def test_a_span_too_big_for_kafka_is_refused_not_retried_forever():
    request = _request(b"\x01" * 8, b"\x02" * 8)
    big = request.resource_spans[0].scope_spans[0].spans[1].attributes.add()
    big.key, big.value.string_value = "gen_ai.input.messages", "x" * 5000
    kafka = _Kafka(acks=True)
    status, _, raw = _post(kafka, request.SerializeToString(), PROTO, max_span_bytes=2000)
    assert status == 200
    response = ExportTraceServiceResponse.FromString(raw)
    assert response.partial_success.rejected_spans == 1 and "'s1'" in response.partial_success.error_message
    assert len(kafka.sent) == 1
    assert [r["reason"] for r in kafka.rejections] == ["oversize"]
