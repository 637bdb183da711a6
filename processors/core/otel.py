"""OpenTelemetry GenAI spans → OpenWOP RunEventDocs: the pure mapping and the hold/emit rule.

Spans reach the worker as plain dicts (:func:`processors.worker.otlp.span_dict` makes
them from OTLP): ``traceId``/``spanId``/``parentSpanId`` lowercase hex, ``startNs``/``endNs``
as decimal strings (nanoseconds are beyond JSON's safe integers), ``attributes`` as
JSON values, ``status {code, message}`` (code 2 = error), ``name``, ``kind``.

Why hold spans at all: an exporter sends a span when it **ends**, children before
parents, in batches, possibly from several processes. A run's events need contiguous
sequences and causation ids that name earlier events, in the order things started.
So the worker keeps a trace's spans (:func:`due` says when to let go), then
:func:`plan_trace` orders each run's events by start time (stage 1, per trace), and
:func:`sequence_run` gives them the run's next sequences and backward causation
(stage 2, per run: a conversation usually spans several traces; :func:`map_trace` is
both stages for one trace, in memory). The cost is latency: a trace is
published ``settle_ms`` after its last span arrived once its root has arrived, or
``grace_ms`` after its first span at the latest (or when ``max_spans`` are held).
Spans arriving after their trace was published are appended to the same runs as a
later emission (still contiguous; causation still names earlier events).

Runs: run id = ``gen_ai.conversation.id``, inherited from the nearest ancestor span
that has one, else the trace id. An ``invoke_agent`` span whose run differs from its
parent span's is a **child run**; its parent run gets the RFC 0037 §B handoff
(``runOrchestrator.decided`` → ``dispatch.began`` → ``dispatch.succeeded`` →
``child.completed``/``child.failed``, each caused by the previous one).

Event ids are ``uuid5(NAMESPACE, "<traceId>/<spanId>/<role>")``, so a re-sent span
maps to the same ids and the sequencer counts it as a duplicate.

Nothing is dropped: a span with no GenAI operation we map becomes an opaque
``log.appended`` event carrying the span.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from schemas.cachekey import RECIPE_IDS, cache_key
from schemas.errors import AgentlogError, EventRejected
from schemas.validate import validate_doc

__all__ = [
    "NAMESPACE",
    "Cursor",
    "Emission",
    "Plan",
    "Sequenced",
    "due",
    "event_id",
    "map_trace",
    "plan_trace",
    "run_ids",
    "sequence_run",
]

#: uuid5 namespace of every event id minted from a span (fixed: ids must not change across releases).
NAMESPACE = uuid.UUID("5d1e7a4c-3b0f-4c55-9a61-0f2a8e6b7c13")

_CHAT_OPS = frozenset({"chat", "text_completion", "generate_content"})
_REFUSAL_REASONS = frozenset({"content_filter", "refusal", "refused", "safety"})
_ERROR = 2  # OTLP STATUS_CODE_ERROR


def event_id(trace_id: str, span_id: str, role: str) -> str:
    """Deterministic event id: a re-sent span is a duplicate, never a new event."""
    return str(uuid.uuid5(NAMESPACE, f"{trace_id}/{span_id}/{role}"))


def timestamp(ns: int) -> str:
    """RFC 3339 with the span's full nanosecond precision, UTC."""
    secs, frac = divmod(ns, 1_000_000_000)
    return f"{datetime.fromtimestamp(secs, tz=UTC):%Y-%m-%dT%H:%M:%S}.{frac:09d}Z"


def due(entry: Mapping[str, Any], now_ms: int, *, settle_ms: int, grace_ms: int, max_spans: int) -> bool:
    """Whether a held trace should be published now.

    ``entry``: ``{"pending": [spanId, ...], "firstMs", "lastMs", "rootSeen"}`` (arrival times
    are the Kafka timestamps of the span records, so a redelivery decides the same way).
    """
    pending = entry.get("pending") or {}
    if not pending:
        return False
    if len(pending) >= max_spans:
        return True
    if now_ms - int(entry["firstMs"]) >= grace_ms:
        return True
    return bool(entry.get("rootSeen")) and now_ms - int(entry["lastMs"]) >= settle_ms


def is_root(span: Mapping[str, Any]) -> bool:
    return not span.get("parentSpanId")


def _attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    attrs = span.get("attributes")
    return attrs if isinstance(attrs, dict) else {}


def run_ids(spans: Mapping[str, Mapping[str, Any]], known: Mapping[str, str] | None = None) -> dict[str, str]:
    """spanId → run id for every span: its conversation id, else its nearest ancestor's, else the trace id.

    ``known`` holds run ids of spans published earlier (a late child finds its parent's run).
    """
    known = known or {}
    out: dict[str, str] = {}

    def resolve(span_id: str, depth: int = 0) -> str | None:
        if span_id in out:
            return out[span_id]
        if span_id in known:
            return known[span_id]
        span = spans.get(span_id)
        if span is None or depth > 1000:
            return None
        conv = _attrs(span).get("gen_ai.conversation.id")
        if isinstance(conv, str) and conv:
            run = conv
        else:
            parent = span.get("parentSpanId") or ""
            run = (resolve(parent, depth + 1) if parent else None) or str(span["traceId"])
        out[span_id] = run
        return run

    for span_id in spans:
        resolve(span_id)
    return out


@dataclass
class Cursor:
    """Where a run's next event goes: ``next`` sequence and the id of the last event (causation)."""

    next: int = 0
    last: str | None = None


@dataclass
class Emission:
    """What publishing a trace produces: docs per run (in order) and the new cursors and span memory."""

    docs: list[dict[str, Any]] = field(default_factory=list)
    cursors: dict[str, Cursor] = field(default_factory=dict)
    #: spanId → {"run": runId, "start": eventId | None} for every span published now.
    published: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Draft:
    run: str
    t: int
    span_start: int
    depth: int
    span_id: str
    idx: int
    type: str
    payload: dict[str, Any]
    eid: str
    cause: str | None = None  # fixed causation (chain / start event); None = the span's context
    node: str | None = None


def _loads(value: Any) -> Any:
    """GenAI attributes that carry structure are JSON strings (OTel attributes are flat)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _error(span: Mapping[str, Any]) -> dict[str, Any]:
    status = span.get("status") or {}
    attrs = _attrs(span)
    code = attrs.get("error.type") or "span_error"
    message = status.get("message") or attrs.get("exception.message") or f"span {span.get('name')!r} ended in error"
    return {"code": str(code), "message": str(message)}


def _failed(span: Mapping[str, Any]) -> bool:
    return int((span.get("status") or {}).get("code") or 0) == _ERROR


def _llm_request(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request in cache-key shape, or None when the content was not captured."""
    messages = _loads(attrs.get("gen_ai.input.messages"))
    if not isinstance(messages, list):
        return None
    request: dict[str, Any] = {
        "provider": str(attrs.get("gen_ai.provider.name") or attrs.get("gen_ai.system") or "unknown"),
        "model": str(attrs.get("gen_ai.request.model") or "unknown"),
        "messages": messages,
    }
    tools = _loads(attrs.get("gen_ai.tool.definitions"))
    if isinstance(tools, list) and tools:
        request["tools"] = tools
    for attr, name in (("gen_ai.request.temperature", "temperature"), ("gen_ai.request.top_p", "topP"),
                       ("gen_ai.request.top_k", "topK"), ("gen_ai.request.max_tokens", "maxOutputTokens"),
                       ("gen_ai.request.seed", "seed")):
        if isinstance(attrs.get(attr), int | float) and not isinstance(attrs.get(attr), bool):
            request[name] = attrs[attr]
    stop = attrs.get("gen_ai.request.stop_sequences")
    if isinstance(stop, list):
        request["stop"] = stop
    return request


def _chat(span: Mapping[str, Any], add: Any) -> None:
    attrs = _attrs(span)
    trace, sid = span["traceId"], span["spanId"]
    request = _llm_request(attrs)
    key, recipe = None, RECIPE_IDS["v2"]
    if request is not None:
        try:
            key = cache_key(request)
        except AgentlogError:
            key = None
    if key is None:
        # Content not captured (or not keyable): a key unique to this span, so a mock replay never
        # serves another call's result for it; the recipe id says it is no semantic key.
        key, recipe = f"otel-span:{trace}:{sid}", "otel-span-id"
    started = add("start", "agent.invocation.started",
                  {"request": request or {"captured": False, "model": attrs.get("gen_ai.request.model")},
                   "cacheKey": key, "recipe": recipe})
    if _failed(span):
        add("end", "node.failed", {"error": _error(span), "cacheKey": key}, cause=started)
        return
    reasons = _loads(attrs.get("gen_ai.response.finish_reasons"))
    reasons = reasons if isinstance(reasons, list) else [reasons] if isinstance(reasons, str) else []
    usage = {k: attrs[a] for k, a in (("inputTokens", "gen_ai.usage.input_tokens"),
                                      ("outputTokens", "gen_ai.usage.output_tokens"))
             if isinstance(attrs.get(a), int) and not isinstance(attrs.get(a), bool) and attrs[a] >= 0}
    refused = [r for r in reasons if isinstance(r, str) and r in _REFUSAL_REASONS]
    if refused:
        add("end", "envelope.refusal", {"cacheKey": key, "reason": refused[0]}, cause=started)
    else:
        envelope = _loads(attrs.get("gen_ai.output.messages"))
        payload: dict[str, Any] = {"cacheKey": key,
                                   "envelope": envelope if envelope is not None else {"finishReasons": reasons}}
        if usage:
            payload["usage"] = usage
        add("end", "agent.invocation.completed", payload, cause=started)
    if "inputTokens" in usage and "outputTokens" in usage:
        add("usage", "provider.usage", {
            "provider": str(attrs.get("gen_ai.provider.name") or attrs.get("gen_ai.system") or "unknown"),
            "model": str(attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model") or "unknown"),
            "inputTokens": usage["inputTokens"], "outputTokens": usage["outputTokens"], "traceId": trace,
        }, cause=started)


def _tool(span: Mapping[str, Any], add: Any) -> None:
    attrs = _attrs(span)
    call_id = str(attrs.get("gen_ai.tool.call.id") or span["spanId"])
    tool = str(attrs.get("gen_ai.tool.name") or span.get("name") or "tool")
    called = add("start", "agent.toolCalled",
                 {"callId": call_id, "tool": tool, "args": _loads(attrs.get("gen_ai.tool.call.arguments"))})
    if _failed(span):
        add("end", "node.failed", {"callId": call_id, "tool": tool, "error": _error(span)}, cause=called)
    else:
        add("end", "agent.toolReturned", {"callId": call_id, "result": _loads(attrs.get("gen_ai.tool.call.result"))},
            cause=called)


def _opaque(span: Mapping[str, Any], add: Any) -> None:
    add("end", "log.appended", {"source": "opentelemetry", "otelSpan": {
        k: span.get(k) for k in ("traceId", "spanId", "parentSpanId", "name", "kind", "startNs", "endNs",
                                 "attributes", "status")}})


def map_trace(
    trace_id: str,
    pending: Mapping[str, Mapping[str, Any]],
    *,
    published: Mapping[str, Mapping[str, Any]],
    cursors: Mapping[str, Cursor],
) -> Emission:
    """Both stages at once for one trace: :func:`plan_trace` then :func:`sequence_run` per run.

    ``published``: spanId → {"run", "start"} of this trace's spans emitted before (their
    events are in the log already); ``cursors``: run id → :class:`Cursor` for every run
    those ids may touch (missing = a new run, sequence 0). The worker runs the stages apart
    (trace-keyed, then run-keyed); this is the same composition for one trace, in memory.
    """
    plan = plan_trace(trace_id, pending, published=published)
    earlier = {str(p["start"]) for p in published.values() if p.get("start")}
    out = Emission(published=plan.published)
    for run, events in plan.runs.items():
        done = sequence_run(cursors.get(run) or Cursor(), earlier.__contains__, trace_id, events)
        out.docs.extend(done.docs)
        out.cursors[run] = done.cursor
    return out


def plan_trace(trace_id: str, pending: Mapping[str, Mapping[str, Any]], *,
               published: Mapping[str, Mapping[str, Any]]) -> Plan:
    """Map a trace's pending spans to per-run event lists in start-time order (stage 1: no run state).

    ``published``: spanId → {"run", "start"} of this trace's spans planned before.
    """
    known_runs = {sid: str(p["run"]) for sid, p in published.items()}
    runs = run_ids(pending, known_runs)
    drafts: list[_Draft] = []

    def depth_of(span_id: str) -> int:
        d, cur = 0, pending.get(span_id)
        while cur is not None and cur.get("parentSpanId") and d < 1000:
            d += 1
            cur = pending.get(cur["parentSpanId"])
        return d

    for sid, span in pending.items():
        run = runs[sid]
        attrs = _attrs(span)
        start, end = int(span["startNs"]), int(span["endNs"])
        depth = depth_of(sid)
        counter = [0]
        node = str(attrs.get("gen_ai.agent.name") or "") or None

        def add(when: str, etype: str, payload: dict[str, Any], *, cause: str | None = None,
                role: str | None = None, target: str | None = None,
                _sid: str = sid, _run: str = run, _start: int = start, _end: int = end, _depth: int = depth,
                _counter: list[int] = counter, _node: str | None = node) -> str:
            eid = event_id(trace_id, _sid, role or etype)
            t = _start if when == "start" else _end
            drafts.append(_Draft(target or _run, t, _start, _depth, _sid, _counter[0], etype, payload, eid, cause,
                                 _node))
            _counter[0] += 1
            return eid

        op = attrs.get("gen_ai.operation.name")
        parent_sid = span.get("parentSpanId") or ""
        parent_run = runs.get(parent_sid) or known_runs.get(parent_sid)
        if op == "invoke_agent":
            worker = str(attrs.get("gen_ai.agent.name") or run)
            if parent_run is not None and parent_run == run:
                began = add("start", "node.started", {"agent": worker})
                if _failed(span):
                    add("end", "node.failed", {"agent": worker, "error": _error(span)}, cause=began)
                else:
                    add("end", "node.completed", {"agent": worker}, cause=began)
                continue
            add("start", "run.started", {"bindings": {}, "agent": worker})
            if _failed(span):
                add("end", "run.failed", {"error": _error(span)})
            else:
                add("end", "run.completed", {})
            if parent_run is not None:
                parent_span = pending.get(parent_sid) or {}
                planner = str(_attrs(parent_span).get("gen_ai.agent.name") or "otel-planner")
                planner = planner if len(planner) >= 3 else f"agent:{planner}"
                decided = add("start", "runOrchestrator.decided",
                              {"agentId": planner, "decision": {"nextWorkerIds": [worker]}}, target=parent_run)
                chain = {"workerId": worker, "parentRunId": parent_run}
                began = add("start", "core.workflowChain.event", {"phase": "dispatch.began", **chain},
                            cause=decided, role="dispatch.began", target=parent_run)
                ok = add("start", "core.workflowChain.event",
                         {"phase": "dispatch.succeeded", "childRunId": run, **chain},
                         cause=began, role="dispatch.succeeded", target=parent_run)
                if _failed(span):
                    add("end", "core.workflowChain.event",
                        {"phase": "child.failed", "childRunId": run, "error": _error(span), **chain},
                        cause=ok, role="child.failed", target=parent_run)
                else:
                    add("end", "core.workflowChain.event", {"phase": "child.completed", "childRunId": run, **chain},
                        cause=ok, role="child.completed", target=parent_run)
        elif op in _CHAT_OPS:
            _chat(span, add)
        elif op == "execute_tool":
            _tool(span, add)
        else:
            _opaque(span, add)

    return _plan(trace_id, pending, drafts, runs, published)


@dataclass
class Plan:
    """Stage 1's output for one trace: each run's events in start-time order, without sequences.

    ``runs``: run id → ``[{"doc": RunEventDoc without "sequence", "span": spanId}, ...]``; a
    doc's ``causationId`` is set only where the trace alone decides it (an end event's start
    event, the handoff chain, the first event of the nearest ancestor span in the same run);
    :func:`sequence_run` fills the rest with the run's previous event.
    """

    trace_id: str
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: spanId → {"run": runId, "start": eventId | None} for every span planned now.
    published: dict[str, dict[str, Any]] = field(default_factory=dict)


def _plan(
    trace_id: str,
    pending: Mapping[str, Mapping[str, Any]],
    drafts: Iterable[_Draft],
    runs: Mapping[str, str],
    published: Mapping[str, Mapping[str, Any]],
) -> Plan:
    """Order the drafts per run by (time, span start, depth, span, index) and fix the causation the trace decides.

    Causation of an event with no fixed cause: the first event of the nearest ancestor span
    in the same run (its context) — earlier by construction; else left to the run's sequencer.
    """
    out = Plan(trace_id)
    first_event: dict[str, str] = {sid: str(p["start"]) for sid, p in published.items() if p.get("start")}
    ordered = sorted(drafts, key=lambda d: (d.t, d.span_start, d.depth, d.span_id, d.idx))
    for d in ordered:
        if d.run == runs.get(d.span_id):
            first_event.setdefault(d.span_id, d.eid)
    for d in ordered:
        cause = d.cause or _context(d, pending, runs, published, first_event)
        doc: dict[str, Any] = {"eventId": d.eid, "runId": d.run, "type": d.type, "payload": d.payload,
                               "timestamp": timestamp(d.t)}
        if cause is not None:
            doc["causationId"] = cause
        if d.node:
            doc["nodeId"] = d.node
        out.runs.setdefault(d.run, []).append({"doc": doc, "span": d.span_id})
    for sid in pending:
        out.published[sid] = {"run": runs[sid], "start": first_event.get(sid)}
    return out


@dataclass
class Sequenced:
    """Stage 2's output for one run: the docs to publish, the run's new cursor, how many were already sequenced."""

    docs: list[dict[str, Any]]
    cursor: Cursor
    duplicates: int = 0


def sequence_run(cursor: Cursor, known: Callable[[str], bool], trace_id: str,
                 events: Iterable[Mapping[str, Any]]) -> Sequenced:
    """Give a run's planned events the next sequences (stage 2, the run's one writer).

    ``known(eventId)``: whether the run already has that event (sequenced before). A known
    event is skipped, so a re-emitted doc never gets a second sequence. A planned
    ``causationId`` is kept only if it names a known event or one sequenced earlier in this
    call; otherwise (and when the trace left it open) the cause is the run's previous event,
    so causation always names an earlier event of the run, whatever trace it came from.
    """
    docs: list[dict[str, Any]] = []
    now: set[str] = set()
    duplicates = 0
    for event in events:
        planned = event["doc"]
        eid = str(planned["eventId"])
        if eid in now or known(eid):
            duplicates += 1
            continue
        doc = {k: v for k, v in planned.items() if k != "causationId"}
        doc["sequence"] = cursor.next
        cause = planned.get("causationId")
        if not (isinstance(cause, str) and (cause in now or known(cause))):
            cause = cursor.last
        if cause is not None and cursor.next > 0:
            doc["causationId"] = cause
        _keep_valid(doc, trace_id, str(event["span"]))
        docs.append(doc)
        now.add(eid)
        cursor = Cursor(cursor.next + 1, eid)
    return Sequenced(docs, cursor, duplicates)


def _keep_valid(doc: dict[str, Any], trace_id: str, span_id: str) -> None:
    """Turn a doc the sequencer would reject into an opaque ``log.appended`` saying why, in place.

    A rejected event would leave a hole in the run's sequences (every later event a
    ``sequence_gap``), so the mapper checks each doc with the sequencer's own validator and keeps
    the slot, the id and the reason instead (e.g. a span attribute holding NaN or a 2^60 integer
    inside captured JSON, or a payload over the size limit).
    """
    try:
        validate_doc(doc)
    except EventRejected as e:
        doc["payload"] = {"source": "opentelemetry", "unmapped": {
            "type": doc["type"], "code": e.code, "detail": str(e)[:500], "traceId": trace_id, "spanId": span_id}}
        doc["type"] = "log.appended"
        doc.pop("nodeId", None)


def _context(d: _Draft, pending: Mapping[str, Mapping[str, Any]], runs: Mapping[str, str],
             published: Mapping[str, Mapping[str, Any]], first_event: Mapping[str, str]) -> str | None:
    span = pending.get(d.span_id) or {}
    parent = span.get("parentSpanId") or ""
    hops = 0
    while parent and hops < 1000:
        run = runs.get(parent) or (published.get(parent) or {}).get("run")
        if run == d.run and parent in first_event:
            return first_event[parent]
        nxt = pending.get(parent)
        parent = (nxt or {}).get("parentSpanId") or ""
        hops += 1
    return None
