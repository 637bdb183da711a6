"""The corpus programs exported live: real frameworks, real instrumentations, real exporters, a real worker.

For each program × instrumentation of ``tests/otel_corpus`` (OpenAI Agents SDK and LangGraph, each under
OpenLLMetry and OpenInference; Google ADK under its own instrumentation and OpenInference; LangGraph's supervisor
routing by conditional edges to a compiled subgraph and a ``create_react_agent``, and to node functions that
invoke compiled graphs, under both), ``python -m
tests.otel_corpus.record --live`` runs the recorder's own program (scripted models, offline: ADK's is a
``BaseLlm``) with the SDK's ``OTLPSpanExporter`` configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables
only, as a user's program is, and sends its spans to an ``agentlog worker`` bound beyond loopback
(``0.0.0.0``) with ``AGENTLOG_WEB_TOKEN`` set. Five cases export over OTLP/gRPC, five over OTLP/HTTP; each
sends the token as ``OTEL_EXPORTER_OTLP_HEADERS`` says.

The runs are read back from the committed log (``agentlog export``) and the audit store (``agentlog
sql``/``query``), and checked by the corpus unit tests' own ``check_*`` functions (the LangGraph shapes':
``test_otel_langgraph.check_shape``): runs, child runs, the handoffs, LLM calls with their cache keys, tool
pairs, usage. Around that: a request without the
token (or with a wrong one) is refused (401 / UNAUTHENTICATED) and adds nothing, and on gRPC an
exporter's retry of the same batch, after its runs are committed, adds nothing either.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.otel.test_otlp_ingest import _export, _wait_for
from tests.integration.worker.worker_proc import WorkerProcess
from tests.otel_corpus import script as s
from tests.tools import REQUIRE_TOOLS_ENV, agentlog_cli, free_port
from tests.unit.core.test_otel_corpus import (
    CORPUS,
    SCRIPTS,
    check_llm_calls_with_content_cache_keys_and_usage,
    check_runs_child_runs_and_the_handoff,
    check_tool_call_and_return_pairs,
    root_and_child,
)
from tests.unit.core.test_otel_langgraph import check_shape, shape_runs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
TOKEN = "live-otlp-t0ken"
#: The span mapper's timing, quicker: a trace is due 0.5 s after its last span, checked every 0.2 s.
QUICK = {"agentlog.worker.spans:SETTLE_MS": 500, "agentlog.worker.spans:TICK_S": 0.2}
#: (program, instrumentation, protocol): each program once over gRPC and once over HTTP.
CASES = [
    ("openai_agents", "openllmetry", "grpc"),
    ("openai_agents", "openinference", "http/protobuf"),
    ("langgraph", "openllmetry", "http/protobuf"),
    ("langgraph", "openinference", "grpc"),
    ("adk", "genai", "http/protobuf"),
    ("adk", "openinference", "grpc"),
    ("lg_routed", "openllmetry", "http/protobuf"),
    ("lg_routed", "openinference", "grpc"),
    ("lg_invoked", "openllmetry", "grpc"),
    ("lg_invoked", "openinference", "http/protobuf"),
]
#: What each case needs in the test process (the program itself runs in a child process), by program, by
#: instrumentation, by protocol and by program.instrumentation.
NEEDS = {"openai_agents": ("agents",), "langgraph": ("langgraph", "langchain_core"), "adk": ("google.adk",),
         **{program: ("langgraph", "langchain_core") for program in s.LANGGRAPH_SHAPES},
         "openllmetry": ("opentelemetry.instrumentation",), "openinference": ("openinference.instrumentation",),
         "genai": ("google.adk.telemetry",), "adk.openinference": ("openinference.instrumentation.google_adk",),
         "grpc": ("grpc", "opentelemetry.exporter.otlp.proto.grpc"),
         "http/protobuf": ("opentelemetry.exporter.otlp.proto.http",)}


def _require(module: str) -> None:
    """Skip without ``module``; fail instead in CI (``.ci/run`` sets the variable; ``make venv`` installs it)."""
    if os.environ.get(REQUIRE_TOOLS_ENV):
        importlib.import_module(module)
    else:
        pytest.importorskip(module, reason="pip install -e '.[test,grpc,frameworks]' (make venv does)")


def _otlp_port() -> int:
    """A free port whose neighbour below (the gRPC receiver's) is free too."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port - 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def _http_export(port: int, body: bytes, token: str | None) -> int:
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0  # not listening yet


def _grpc_export(port: int, body: bytes, token: str | None) -> str:
    """One raw ``Export`` (the exact bytes an exporter sent) through the generated stub's method path."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = TraceServiceStub(channel)
        raw = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        try:
            if body:
                raw(body, metadata=metadata, timeout=30)
            else:
                stub.Export(_empty_request(), metadata=metadata, timeout=30)
        except grpc.RpcError as e:
            return str(e.code().name)
    return "OK"


def _empty_request() -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return ExportTraceServiceRequest()


def _authorized(settings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.web_token}"}


def _metric(settings, name: str, **labels: str) -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{settings.web_port}/metrics", headers=_authorized(settings))
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and all(w in line for w in want))


def _sql_rows(settings, sql: str) -> list[list[Any]] | None:
    out = agentlog_cli(settings, "sql", "--json", sql)
    return json.loads(out.stdout)["rows"] if out.returncode == 0 else None


def _committed_runs(settings) -> dict[str, list[dict]]:
    """Every run of the deployment, each as ``agentlog export`` reads it from the committed log."""
    ids = _sql_rows(settings, "SELECT DISTINCT run_id FROM events ORDER BY run_id") or []
    return {run: _export(settings, run) for (run,) in ids}


def _eventually(what: str, check: Callable[[], Any], timeout_s: float = 240.0) -> Any:
    """``check()``'s value once it stops raising AssertionError; its last error after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {e}") from e
        time.sleep(2.0)


def _usage(settings) -> tuple[int, int]:
    out = agentlog_cli(settings, "query", "usage", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    payload = json.loads(out.stdout)
    rows = [dict(zip(payload["columns"], r, strict=True)) for r in payload["rows"]]
    return sum(int(r["input_tokens"]) for r in rows), sum(int(r["output_tokens"]) for r in rows)


@pytest.mark.parametrize("program,instrumentation,protocol", CASES,
                         ids=[f"{p}-{i}-{'grpc' if t == 'grpc' else 'http'}" for p, i, t in CASES])
def test_a_live_program_arrives_as_its_runs(settings, tmp_path, program, instrumentation, protocol):
    for module in (*NEEDS[program], *NEEDS[instrumentation], *NEEDS[protocol],
                   *NEEDS.get(f"{program}.{instrumentation}", ())):
        _require(module)
    port = _otlp_port()
    grpc_port = port - 1
    settings = settings.replace(otlp_port=port, web_port=free_port(), web_host="0.0.0.0", web_token=TOKEN)
    worker = WorkerProcess(settings, sink=True, web=True, log_name=f"live-{program}-{instrumentation}",
                           constants=QUICK).start()
    # Valid OTLP of the same program (its recorded request): refused without the token, it must add nothing.
    recorded = (CORPUS / f"{program}.{instrumentation}.pb.gz").read_bytes()
    try:
        if protocol == "grpc":
            _wait_for("the OTLP/gRPC receiver", lambda: _grpc_export(grpc_port, b"", None) == "UNAUTHENTICATED")
            assert _grpc_export(grpc_port, gzip.decompress(recorded), None) == "UNAUTHENTICATED"
            assert _grpc_export(grpc_port, gzip.decompress(recorded), "wrong") == "UNAUTHENTICATED"
            endpoint = f"http://127.0.0.1:{grpc_port}"
        else:
            _wait_for("the OTLP/HTTP receiver", lambda: _http_export(port, recorded, None) == 401)
            assert _http_export(port, recorded, "wrong") == 401
            endpoint = f"http://127.0.0.1:{port}"
        assert _metric(settings, "agentlog_otlp_requests_total", outcome="unauthorized") >= 2

        # The user's program: only the standard variables point its exporter at the worker.
        saved = tmp_path / "requests"
        saved.mkdir()
        env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
               "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}"}
        out = subprocess.run([sys.executable, "-m", "tests.otel_corpus.record", "--live",
                              f"{program}.{instrumentation}", "--save", str(saved)],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]

        def arrived() -> tuple[dict[str, list[dict]], str, list[str]]:
            committed = _committed_runs(settings)
            if program in s.LANGGRAPH_SHAPES:
                check_shape(program, instrumentation, committed)
                return committed, *shape_runs(committed, program)
            runs, root, child = root_and_child(committed)
            check_runs_child_runs_and_the_handoff(program, instrumentation, runs, root, child)
            check_llm_calls_with_content_cache_keys_and_usage(program, instrumentation, runs, root, child)
            check_tool_call_and_return_pairs(program, instrumentation, runs, root, child)
            return runs, root, [child]

        runs, root, children = _eventually("the program's runs, whole", arrived)

        # The audit store agrees: each handoff's transitions and the script's tokens.
        def transitions() -> None:
            rows = _sql_rows(settings, f"SELECT phase, child_run_id FROM transitions WHERE parent_run_id = '{root}'")
            assert rows is not None and len(rows) == 3 * len(children), rows
            assert sorted(r[0] for r in rows) == sorted(
                ["child.completed", "dispatch.began", "dispatch.succeeded"] * len(children))
            assert {r[1] for r in rows if r[0] != "dispatch.began"} == set(children)

        _eventually("the handoff transitions", transitions)
        script = s.LANGGRAPH_SHAPES[program][1] if program in s.LANGGRAPH_SHAPES else SCRIPTS[program][2]
        expected = (sum(c[2] for c in script), sum(c[3] for c in script))
        _eventually("usage equal to the script's tokens", lambda: _check_equal(_usage(settings), expected))
        # Nothing refused anywhere: the unauthorized requests above left no rejection either.
        assert _sql_rows(settings, "SELECT count() FROM rejections") == [[0]]

        if protocol == "grpc":
            # An exporter's retry of the same batch, after its runs are committed, adds nothing.
            bodies = sorted(saved.glob("request-*.pb"))
            assert bodies
            spans_before = _metric(settings, "agentlog_otlp_spans_total", outcome="accepted")
            assert all(_grpc_export(grpc_port, b.read_bytes(), TOKEN) == "OK" for b in bodies)
            resent = _metric(settings, "agentlog_otlp_spans_total", outcome="accepted") - spans_before
            assert resent > 0
            _wait_for("the re-sent spans counted as duplicates",
                      lambda: _metric(settings, "agentlog_otel_duplicate_spans_total") >= resent)
            again = _committed_runs(settings)
            assert {r: [d["eventId"] for d in e] for r, e in again.items()} == {
                r: [d["eventId"] for d in e] for r, e in runs.items()}
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()


def _check_equal(got: Any, want: Any) -> None:
    assert got == want, f"{got} != {want}"
