"""``agentlog demo --otel``: an instrumented agent framework publishes runs with no agentlog code.

A pydantic-ai planner (offline: its ``TestModel``) delegates to a researcher agent through a
tool. The only link to agentlog is the OpenTelemetry SDK's own ``OTLPSpanExporter`` pointed at
the worker's receiver, exactly what ``OTEL_EXPORTER_OTLP_ENDPOINT`` does for any instrumented
program. The tour then reads back what the store made of the spans: two hash-chained runs,
the handoff between them and the token usage.

pydantic-ai and the OpenTelemetry SDK are optional (``pip install 'agentlog[otel]'``); the
demo says so instead of failing on an import.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from agentlog.audit.server import query_via_worker
from agentlog.demo.tour import _migrate, ensure_stack, ensure_worker
from agentlog.schemas.errors import AgentlogError, InfraError
from agentlog.streams.admin import ensure_topics_sync
from agentlog.streams.reader import read_run
from agentlog.streams.settings import Settings

__all__ = ["OtelDemoSummary", "run_otel_demo", "run_planner"]


def run_planner(provider: Any, prompt: str = "plan a trip to Lisbon") -> Any:
    """Run the pydantic-ai planner → researcher scenario (:mod:`agentlog.demo.otel_agents`)."""
    try:
        from agentlog.demo.otel_agents import run_planner as run
    except ImportError as e:
        raise InfraError("the OpenTelemetry demo needs pydantic-ai and the OpenTelemetry SDK: "
                         "pip install 'agentlog[otel]'", code="missing_dependency") from e
    return run(provider, prompt)


@dataclass
class OtelDemoSummary:
    """What the OpenTelemetry tour established; ``to_dict`` is the ``--json`` output."""

    endpoint: str = ""
    spans: int = 0
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> {runId, events, types}
    transitions: list[list[Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    expected_tokens: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ok(self) -> bool:
        """Both runs committed and complete, the handoff recorded, the tokens summed right."""
        complete = len(self.runs) == 2 and all(r["types"][-1:] == ["run.completed"] for r in self.runs.values())
        phases = sorted(str(t[0]) for t in self.transitions)
        return (complete and phases == ["child.completed", "dispatch.began", "dispatch.succeeded"]
                and [self.usage.get("input_tokens"), self.usage.get("output_tokens")] == self.expected_tokens)


def _ship(endpoint: str, token: str = "") -> tuple[int, dict[str, str], list[int]]:
    """Run the agents with the real OTLP exporter; return span count, role → run id, expected tokens.

    ``token``: the worker's ``web_token``, sent as every exporter sends it (its receivers ask for it when set).
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError as e:
        raise InfraError("the OpenTelemetry demo needs the OpenTelemetry SDK: pip install 'agentlog[otel]'",
                         code="missing_dependency") from e
    provider = TracerProvider()
    memory = InMemorySpanExporter()  # a copy, only to know the run ids and tokens to look for
    provider.add_span_processor(SimpleSpanProcessor(memory))
    headers = {"Authorization": f"Bearer {token}"} if token else None
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, headers=headers),
                                                   max_export_batch_size=4))
    run_planner(provider)
    provider.shutdown()  # flushes the batch processor: every span is acknowledged (or retried) by now
    spans = memory.get_finished_spans()
    roles = {str(s.attributes.get("gen_ai.agent.name")): str(s.attributes.get("gen_ai.conversation.id"))
             for s in spans if s.attributes and s.attributes.get("gen_ai.operation.name") == "invoke_agent"}
    tokens = [sum(_int(s.attributes.get(k)) for s in spans if s.attributes)
              for k in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")]
    return len(spans), roles, tokens


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def _wait_complete(settings: Settings, run_id: str, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        events = [e["doc"] for e in await read_run(settings, run_id, short_name="log")]
        if events and events[-1]["type"] == "run.completed":
            return events
        if time.monotonic() > deadline:
            raise AgentlogError(f"run {run_id} did not complete in the log within {timeout_s:.0f}s "
                                f"({len(events)} events so far); see the worker log", code="demo_timeout")
        await asyncio.sleep(1.0)


def run_otel_demo(settings: Settings, console: Console | None = None, *, timeout_s: float = 180.0) -> OtelDemoSummary:
    """Bring the stack up, send a pydantic-ai run over OTLP, read back runs, handoff and usage."""
    console = console or Console()
    t0 = time.monotonic()
    summary = OtelDemoSummary(endpoint=f"http://127.0.0.1:{settings.otlp_port}/v1/traces")

    def say(text: str) -> None:
        console.print(f"[dim]•[/] {text}")

    console.rule("agentlog demo --otel")
    ensure_stack(settings, say)
    ensure_topics_sync(settings)
    _migrate(settings)
    worker = ensure_worker(settings, say)
    say(f"pydantic-ai planner → researcher, spans via OTLPSpanExporter → {summary.endpoint}")
    summary.spans, roles, summary.expected_tokens = _ship(summary.endpoint, settings.web_token)
    say(f"{summary.spans} spans acknowledged; waiting for the runs in the committed log")
    for role in ("planner", "researcher"):
        events = asyncio.run(_wait_complete(settings, roles[role], timeout_s))
        summary.runs[role] = {"runId": roles[role], "events": len(events), "types": [e["type"] for e in events]}
    planner = roles["planner"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = query_via_worker(settings, {"sql": "SELECT phase, worker_id, child_run_id FROM transitions "
                                                    f"WHERE parent_run_id = '{planner}' ORDER BY event_time, phase"},
                                  worker_url=worker.url) or {}
        usage = query_via_worker(settings, {"query": "usage", "params": {}}, worker_url=worker.url) or {}
        rows = [dict(zip(usage.get("columns", []), r, strict=True)) for r in usage.get("rows", [])]
        rows = [r for r in rows if r.get("run_id") in roles.values()]
        summary.transitions = answer.get("rows", [])
        summary.usage = {"calls": sum(int(r["calls"]) for r in rows),
                         "input_tokens": sum(int(r["input_tokens"]) for r in rows),
                         "output_tokens": sum(int(r["output_tokens"]) for r in rows)}
        if summary.ok:
            break
        time.sleep(1.0)
    _print(console, summary)
    summary.wall_s = round(time.monotonic() - t0, 1)
    return summary


def _print(console: Console, summary: OtelDemoSummary) -> None:
    table = Table(title="runs made from the spans", title_justify="left")
    for col in ("agent", "run id", "events", "types"):
        table.add_column(col, overflow="fold")
    for role, run in summary.runs.items():
        table.add_row(role, run["runId"], str(run["events"]), ", ".join(run["types"]))
    console.print(table)
    console.print(f"handoff transitions of the planner run: {[t[0] for t in summary.transitions]}")
    console.print(f"usage: {summary.usage} (spans said input/output {summary.expected_tokens})")
    console.print("[bold green]ok[/]" if summary.ok else "[bold red]not everything arrived; see the worker log[/]")
