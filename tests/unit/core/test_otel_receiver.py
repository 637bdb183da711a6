"""The answers the OTLP/HTTP and OTLP/gRPC specs ask for, on a real aiohttp server and a real grpc.aio server.

Kafka is represented by the ``send`` callable the worker hands the receiver (the producer's
delivery futures); here it is a list of futures the test resolves or leaves hanging, which is
what "acknowledged" and "not acknowledged" look like from the receiver's side. What the receiver
refuses goes through ``refuse``: a refusal record for the ``spans`` topic, which the span mapper files
sealed (``tests/unit/worker/test_otel_sealing.py``). The real broker path is covered by
``tests/integration/otel``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import logging
import sys

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agentlog.worker.otlp import Receiver
from agentlog.worker.spans import serve_otlp
from tests.tools import free_port


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
        self.refusals: list[tuple[str | None, dict]] = []  # (key, refusal record)

    async def send(self, key: str, value: bytes):
        self.sent.append((key, value))
        fut = asyncio.get_running_loop().create_future()
        if self.acks:
            fut.set_result(None)
        return fut

    async def reject(self, key: str | None, value: bytes):
        self.refusals.append((key, json.loads(value)))
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
    assert [k for k, _ in kafka.sent] == ["0102030405060708090a0b0c0d0e0f10"]  # one record: the trace's spans
    assert [span["spanId"] for span in json.loads(kafka.sent[0][1])["spans"]] == ["01" * 8, "02" * 8]
    assert [(key, r["refused"]) for key, r in kafka.refusals] == [(None, "invalid_envelope")]


def test_no_ack_is_503_with_retry_after():
    status, headers, _ = _post(_Kafka(acks=False), _request(b"\x01" * 8).SerializeToString(), PROTO)
    assert status == 503 and int(headers["Retry-After"]) > 0


def test_garbage_is_400_and_recorded():
    kafka = _Kafka(acks=True)
    status, _, raw = _post(kafka, b"\x0a\xff\xff garbage", PROTO)
    assert status == 400 and json.loads(raw)["code"] == "otlp_undecodable"
    assert kafka.sent == [] and [(key, r["refused"]) for key, r in kafka.refusals] == [(None, "decode_error")]


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
    [(key, refused)] = kafka.refusals  # on the span's trace, with the span's bytes
    assert (key, refused["refused"], refused["traceId"]) == ("0102030405060708090a0b0c0d0e0f10", "oversize", key)
    assert json.loads(base64.b64decode(refused["raw"]))["attributes"]["gen_ai.input.messages"] == "x" * 5000


# --- the token: with web_token set, no export without it (and nothing of a refused one is written) -------------

TOKEN = "otlp-t0ken"


def _post_with_token(kafka: _Kafka, headers: dict[str, str]):
    async def go():
        receiver = Receiver(kafka.send, kafka.reject, ack_timeout_s=0.3, max_body_bytes=1 << 20, token=TOKEN)
        async with TestClient(TestServer(receiver.app())) as client:
            resp = await client.post("/v1/traces", data=_request(b"\x01" * 8).SerializeToString(), headers=headers)
            return resp.status, dict(resp.headers), await resp.text()
    return asyncio.run(go())


def test_without_the_token_an_export_is_401_and_writes_nothing():
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        kafka = _Kafka(acks=True)
        status, resp_headers, text = _post_with_token(kafka, {**PROTO, **headers})
        assert status == 401 and resp_headers["WWW-Authenticate"].startswith("Bearer")
        assert json.loads(text)["code"] == "unauthorized" and TOKEN not in text
        assert kafka.sent == [] and kafka.refusals == []
    kafka = _Kafka(acks=True)
    # The form OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20<token>" sends (scheme in any case).
    assert _post_with_token(kafka, {**PROTO, "Authorization": f"bearer {TOKEN}"})[0] == 200
    assert len(kafka.sent) == 1


# --- OTLP/gRPC: the same Receiver behind TraceService/Export --------------------------------------------------

def _grpc_export(kafka: _Kafka, request: ExportTraceServiceRequest | bytes, *, token: str = "",
                 metadata: tuple[tuple[str, str], ...] = (), compression=None):
    """One Export over a real grpc.aio server on loopback: (status code name, response or None, details)."""
    grpc = pytest.importorskip("grpc")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    from agentlog.worker import otlp_grpc

    async def go():
        receiver = Receiver(kafka.send, kafka.reject, ack_timeout_s=0.3, max_body_bytes=1 << 20, token=token)
        port = free_port()
        server = await otlp_grpc.start(receiver, "127.0.0.1", port)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                if isinstance(request, bytes):  # a message the generated stub could not have serialized
                    call = channel.unary_unary(f"/{otlp_grpc.SERVICE}/Export")
                    answer = ExportTraceServiceResponse.FromString
                else:
                    call, answer = TraceServiceStub(channel).Export, (lambda r: r)
                try:
                    response = await call(request, metadata=metadata, timeout=10, compression=compression)
                except grpc.aio.AioRpcError as e:
                    return e.code().name, None, e.details()
                return "OK", answer(response), ""
        finally:
            await server.stop(None)
    return asyncio.run(go())


def test_grpc_acknowledged_spans_are_ok_with_partial_success():
    grpc = pytest.importorskip("grpc")
    kafka = _Kafka(acks=True)
    code, response, _ = _grpc_export(kafka, _request(b"\x01" * 8, b"\x00" * 8, b"\x02" * 8),
                                     compression=grpc.Compression.Gzip)
    assert code == "OK"
    assert response.partial_success.rejected_spans == 1 and "'s1'" in response.partial_success.error_message
    assert [k for k, _ in kafka.sent] == ["0102030405060708090a0b0c0d0e0f10"]  # one record: the trace's spans
    assert [span["spanId"] for span in json.loads(kafka.sent[0][1])["spans"]] == ["01" * 8, "02" * 8]
    assert [(key, r["refused"]) for key, r in kafka.refusals] == [(None, "invalid_envelope")]


def test_grpc_no_ack_is_unavailable_which_exporters_retry():
    code, _, details = _grpc_export(_Kafka(acks=False), _request(b"\x01" * 8))
    assert code == "UNAVAILABLE" and "otlp_unavailable" in details


def _unavailable_trailers() -> tuple[str, list[tuple[str, bytes]]]:
    """The code and trailing metadata of an Export Kafka does not acknowledge, as a real gRPC client gets them."""
    grpc = pytest.importorskip("grpc")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    from agentlog.worker import otlp_grpc

    async def go():
        kafka = _Kafka(acks=False)
        receiver = Receiver(kafka.send, kafka.reject, ack_timeout_s=0.3, max_body_bytes=1 << 20)
        port = free_port()
        server = await otlp_grpc.start(receiver, "127.0.0.1", port)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                try:
                    await TraceServiceStub(channel).Export(_request(b"\x01" * 8), timeout=10)
                except grpc.aio.AioRpcError as e:
                    return e.code().name, list(e.trailing_metadata() or ())
                raise AssertionError("an Export Kafka did not acknowledge was answered OK")
        finally:
            await server.stop(None)
    return asyncio.run(go())


def test_grpc_unavailable_carries_a_retry_info_with_the_retry_after_delay():
    """OTLP: a retryable answer may say how long to wait, as a google.rpc.RetryInfo in the status details."""
    pytest.importorskip("grpc_status")
    from google.rpc import error_details_pb2, status_pb2

    from agentlog.worker.otlp import RETRY_AFTER_S

    code, trailers = _unavailable_trailers()
    assert code == "UNAVAILABLE"
    details = [v for k, v in trailers if k == "grpc-status-details-bin"]
    assert len(details) == 1
    status = status_pb2.Status.FromString(details[0])
    assert status.code == 14 and "otlp_unavailable" in status.message  # 14: UNAVAILABLE
    [detail] = status.details
    retry = error_details_pb2.RetryInfo()
    assert detail.Unpack(retry)
    assert retry.retry_delay.ToSeconds() == RETRY_AFTER_S
    # The Python exporter reads the same RetryInfo from a trailer of its own.
    assert [v for k, v in trailers if k == "google.rpc.retryinfo-bin"] == [retry.SerializeToString()]


def test_the_python_otlp_exporter_waits_the_retry_info_delay_then_delivers(monkeypatch, caplog):
    """The real OTLPSpanExporter backs off for the RetryInfo's delay (not its own jittered 1 s) and retries."""
    pytest.importorskip("grpc_status")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentlog.worker import otlp_grpc

    # 2 s: beyond the exporter's own first backoff (1 s ± 20 %), so the log shows whose delay it waited.
    monkeypatch.setattr(otlp_grpc, "RETRY_AFTER_S", 2)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("retried"):
        pass
    spans = memory.get_finished_spans()

    class _AckSecond(_Kafka):
        """Kafka that does not acknowledge the first request's span and acknowledges the retry's."""

        async def send(self, key: str, value: bytes):
            self.acks = bool(self.sent)
            return await super().send(key, value)

    kafka = _AckSecond(acks=False)

    async def go():
        receiver = Receiver(kafka.send, kafka.reject, ack_timeout_s=0.3, max_body_bytes=1 << 20)
        port = free_port()
        server = await otlp_grpc.start(receiver, "127.0.0.1", port)
        try:
            exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=30)
            try:
                return await asyncio.to_thread(exporter.export, spans)
            finally:
                exporter.shutdown()
        finally:
            await server.stop(None)

    with caplog.at_level(logging.WARNING, logger="opentelemetry.exporter.otlp.proto.grpc.exporter"):
        assert asyncio.run(go()) == SpanExportResult.SUCCESS
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 1 and "retrying in 2.00s" in retries[0], retries
    assert len(kafka.sent) == 2  # the first attempt's span, then the retry's


def test_grpc_garbage_is_invalid_argument_and_recorded():
    kafka = _Kafka(acks=True)
    code, _, details = _grpc_export(kafka, b"\x0a\xff\xff garbage")
    assert code == "INVALID_ARGUMENT" and "otlp_undecodable" in details
    assert kafka.sent == [] and [(key, r["refused"]) for key, r in kafka.refusals] == [(None, "decode_error")]


def test_grpc_without_the_token_is_unauthenticated_and_writes_nothing():
    for metadata in ((), (("authorization", "Bearer wrong"),)):
        kafka = _Kafka(acks=True)
        code, _, details = _grpc_export(kafka, _request(b"\x01" * 8), token=TOKEN, metadata=metadata)
        assert code == "UNAUTHENTICATED" and TOKEN not in details
        assert kafka.sent == [] and kafka.refusals == []
    kafka = _Kafka(acks=True)
    code, _, _ = _grpc_export(kafka, _request(b"\x01" * 8), token=TOKEN,
                              metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert code == "OK" and len(kafka.sent) == 1


def test_without_grpcio_the_receiver_says_so_once_and_serves_http(monkeypatch, caplog):
    import agentlog.worker

    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError, as without grpcio
    monkeypatch.delitem(sys.modules, "agentlog.worker.otlp_grpc", raising=False)
    monkeypatch.delattr(agentlog.worker, "otlp_grpc", raising=False)
    kafka = _Kafka(acks=True)
    port = free_port()

    async def go():
        receiver = Receiver(kafka.send, kafka.reject, ack_timeout_s=0.3, max_body_bytes=1 << 20)
        task = asyncio.create_task(serve_otlp(receiver, "127.0.0.1", port))
        try:
            async with ClientSession() as http:
                for _ in range(100):
                    try:
                        async with http.post(f"http://127.0.0.1:{port}/v1/traces", headers=PROTO,
                                             data=_request(b"\x01" * 8).SerializeToString()) as resp:
                            return resp.status
                    except OSError:
                        await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    with caplog.at_level(logging.WARNING, logger="agentlog.otlp"):
        assert asyncio.run(go()) == 200
    off = [r.getMessage() for r in caplog.records if "OTLP/gRPC is off" in r.getMessage()]
    assert len(off) == 1 and "agentlog[grpc]" in off[0]
