"""OTLP/gRPC: the ``TraceService/Export`` method beside OTLP/HTTP, on ``web_host:(otlp_port - 1)``.

Several languages' exporters default to gRPC. This serves the method with ``grpc.aio`` on the
worker's loop and hands each request to the one :class:`agentlog.worker.otlp.Receiver` the HTTP
server uses: the same token rule (the ``authorization`` metadata key), the same decoding
(:func:`agentlog.worker.otlp.decode_request`), the same spans topic and the same answers in
gRPC's words:

* OK with an ``ExportTraceServiceResponse`` whose ``partial_success`` names refused spans, once Kafka
  has acknowledged every accepted one;
* UNAUTHENTICATED without the token (nothing is read or written);
* INVALID_ARGUMENT for a message that is not a trace export request (recorded on the rejections topic);
* UNAVAILABLE when Kafka does not acknowledge in time, which OTLP exporters retry, with a
  ``google.rpc.RetryInfo`` whose ``retry_delay`` is the 503's ``Retry-After``
  (:data:`agentlog.worker.otlp.RETRY_AFTER_S`): the OTLP spec's way to make exporters wait that long.

Where the RetryInfo goes: the status details (the ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailer), where OTLP's spec puts it and the Go and Java exporters read it,
and also alone in the ``google.rpc.retryinfo-bin`` trailer, the one key the Python exporter reads.

The method is registered by hand, not through ``trace_service_pb2_grpc``'s
``add_TraceServiceServicer_to_server``: that one parses the message with its own deserializer before
any code of ours runs, so a malformed one would be answered INTERNAL (which exporters do not
retry either) with no rejection record, and parsed before the token is checked.
The service's name comes from the generated descriptor; clients use the generated stub.

Why ``otlp_port - 1``: the default OTLP ports are 4318 for HTTP and 4317 for gRPC, so the default
``otlp_port`` serves both where every exporter looks, and one setting still moves the pair. Needs the
``grpc`` extra (``pip install 'agentlog[grpc]'``); without ``grpcio`` the worker serves HTTP only.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from grpc import aio
from grpc_status import rpc_status
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from agentlog.worker.otlp import RETRY_AFTER_S, UNAUTHORIZED, OtlpError, Receiver, decode_request

log = logging.getLogger("agentlog.otlp")

#: ``/<package>.TraceService/Export``: the generated descriptor's name for the service.
SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
#: The trailer the Python OTLP exporter reads a RetryInfo from (``<message full name>-bin``).
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


def grpc_port(otlp_port: int) -> int:
    """The gRPC port beside OTLP/HTTP's ``otlp_port`` (4317 beside 4318); 0 when there is none."""
    return otlp_port - 1 if otlp_port > 1 else 0


def _handler(receiver: Receiver) -> grpc.GenericRpcHandler:
    async def export(raw: bytes, context: aio.ServicerContext) -> bytes:
        metadata = {key: value for key, value in (context.invocation_metadata() or ())}
        if not receiver.authorized(str(metadata.get("authorization", ""))):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
        try:
            request = decode_request(raw, "application/x-protobuf")  # grpc already undid gzip
        except OtlpError as e:
            await receiver.undecodable(e, raw)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{e.code}: {e}")
        try:
            response = await receiver.export(request)
        except OtlpError as e:
            await _retry_later(context, grpc.StatusCode.UNAVAILABLE, f"{e.code}: {e}", RETRY_AFTER_S)
        return bytes(response.SerializeToString())

    # No request_deserializer: the handler gets the message's bytes, as the HTTP handler gets the body's.
    return grpc.method_handlers_generic_handler(SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export)})


async def _retry_later(context: aio.ServicerContext, code: grpc.StatusCode, message: str, delay_s: int) -> None:
    """Abort with ``code`` (UNAVAILABLE or RESOURCE_EXHAUSTED), asking the exporter to retry in ``delay_s``.

    OTLP exporters retry both codes; RESOURCE_EXHAUSTED only when a RetryInfo says recovery is possible.
    """
    retry = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=delay_s))
    detail = AnyMessage()
    detail.Pack(retry)
    status = rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[detail]))
    await context.abort(status.code, status.details,
                        trailing_metadata=(*status.trailing_metadata, (RETRY_INFO_KEY, retry.SerializeToString())))


async def start(receiver: Receiver, host: str, port: int) -> Any:
    """A started ``grpc.aio`` server of the trace service on ``host:port`` (``await server.stop(grace)`` ends it).

    Raises:
        OSError: the address cannot be bound.
    """
    server = aio.server(options=[("grpc.max_receive_message_length", receiver.max_body_bytes)])
    server.add_generic_rpc_handlers((_handler(receiver),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as e:  # grpc's word for "cannot bind"
        raise OSError(f"cannot listen on {address}: {e}") from e
    await server.start()
    return server
