"""OpenTelemetry GenAI spans → OpenWOP RunEventDocs: the pure mapping and the hold/emit rule.

Spans reach the worker as plain dicts (:func:`agentlog.worker.otlp.span_dict` makes
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
parent span's is a **child run**, and so is the target of a handoff (:func:`_handoffs`: a
framework's handoff span, or a LangGraph agent node another node hands control to); its parent
run gets the RFC 0037 §B handoff
(``runOrchestrator.decided`` → ``dispatch.began`` → ``dispatch.succeeded`` →
``child.completed``/``child.failed``, each caused by the previous one). A run's ``run.started``
names its data subject from the span that starts it (:func:`agentlog.core.otel_read.subject`).

Event ids are ``uuid5(NAMESPACE, "<traceId>/<spanId>/<role>")``, so a re-sent span
maps to the same ids and the sequencer counts it as a duplicate.

Nothing is dropped: a span with no GenAI operation we map becomes an opaque
``log.appended`` event carrying the span.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from agentlog.core.otel_read import (
    DELEGATE_ARGS,
    REFUSAL_REASONS,
    Malformed,
    Reading,
    conversation,
    read_span,
    run_class,
    span_attrs,
    subject,
)
from agentlog.schemas.cachekey import RECIPE_IDS, cache_key
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import AgentlogError, EventRejected
from agentlog.schemas.validate import validate_doc, validate_parsed

__all__ = [
    "NAMESPACE",
    "Cursor",
    "Emission",
    "Plan",
    "Sequenced",
    "due",
    "encodable",
    "event_id",
    "map_trace",
    "plan_trace",
    "run_ids",
    "sequence_run",
]

#: uuid5 namespace of every event id minted from a span (fixed: ids must not change across releases).
NAMESPACE = uuid.UUID("5d1e7a4c-3b0f-4c55-9a61-0f2a8e6b7c13")

_ERROR = 2  # OTLP STATUS_CODE_ERROR


def event_id(trace_id: str, span_id: str, role: str) -> str:
    """Deterministic event id: a re-sent span is a duplicate, never a new event."""
    return str(uuid.uuid5(NAMESPACE, f"{trace_id}/{span_id}/{role}"))


def timestamp(ns: int) -> str:
    """RFC 3339 with the span's full nanosecond precision, UTC."""
    secs, frac = divmod(ns, 1_000_000_000)
    return f"{_second(secs)}.{frac:09d}Z"


@functools.lru_cache(maxsize=4096)
def _second(secs: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of a second: a trace's events share a few seconds, and formatting costs ~2 µs."""
    return f"{datetime.fromtimestamp(secs, tz=UTC):%Y-%m-%dT%H:%M:%S}"


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


def run_ids(spans: Mapping[str, Mapping[str, Any]], known: Mapping[str, str] | None = None, *,
            children: Mapping[str, str] | None = None) -> dict[str, str]:
    """spanId → run id for every span.

    A span's **conversation** is its own (``gen_ai.conversation.id``, ``session.id``, LangGraph's
    ``thread_id``), else its nearest ancestor's, else the trace id. A span starts a run of its own
    when its conversation differs from its parent's, or when it is in ``children`` (spanId → the
    run id of a child run a handoff started there); otherwise it is in its parent's run.
    ``known`` holds run ids of spans published earlier (a late child finds its parent's run).
    """
    runs = _Runs(spans, known or {}, children or {})
    for span_id in spans:
        runs.resolve(span_id)
    return runs.out


@dataclass
class _Runs:
    """:func:`run_ids`' walk. A class, not a nested function: one that calls itself is a reference cycle, which
    holds every span of the batch until a full collection, and the worker runs those rarely
    (:mod:`agentlog.worker.gcpause`)."""

    spans: Mapping[str, Mapping[str, Any]]
    known: Mapping[str, str]
    children: Mapping[str, str]
    conv: dict[str, str] = field(default_factory=dict)
    out: dict[str, str] = field(default_factory=dict)

    def resolve(self, span_id: str, depth: int = 0) -> tuple[str | None, str | None]:
        """(conversation, run) of a span; (None, known run) for a span published earlier."""
        if span_id in self.out:
            return self.conv[span_id], self.out[span_id]
        if span_id in self.known:
            return None, self.known[span_id]
        span = self.spans.get(span_id)
        if span is None or depth > 1000:
            return None, None
        parent = span.get("parentSpanId") or ""
        p_conv, p_run = self.resolve(parent, depth + 1) if parent else (None, None)
        mine = _own_conversation(span)
        c = mine or p_conv or p_run or str(span["traceId"])
        if span_id in self.children:
            run = self.children[span_id]
        elif p_run is None:
            run = c
        elif p_conv is not None:
            run = p_run if c == p_conv else c
        else:  # parent published earlier: only its run is known
            run = p_run if mine is None or p_run == mine or p_run.startswith(f"{mine}/") else mine
        self.conv[span_id], self.out[span_id] = c, run
        return c, run


def _own_conversation(span: Mapping[str, Any]) -> str | None:
    try:
        return conversation(span_attrs(span))
    except Malformed:
        return None  # the span is rejected by the mapping; its run is its parent's


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


def _error(span: Mapping[str, Any]) -> dict[str, Any]:
    status = span.get("status") or {}
    attrs = span_attrs(span)
    code = attrs.get("error.type") or "span_error"
    message = status.get("message") or attrs.get("exception.message") or f"span {span.get('name')!r} ended in error"
    return {"code": str(code), "message": str(message)}


def _failed(span: Mapping[str, Any]) -> bool:
    """Whether the span ended in error; LangGraph handing control to a parent graph is no error."""
    return int((span.get("status") or {}).get("code") or 0) == _ERROR and not _hands_to_parent(span)


#: The exception LangGraph raises to carry ``Command(graph=Command.PARENT, …)`` up to the parent graph: the
#: instrumentations record it as an error on every span it passes through, though control only moves on.
_PARENT_COMMAND = "ParentCommand"


def _hands_to_parent(span: Mapping[str, Any]) -> bool:
    if span_attrs(span).get("error.type") == _PARENT_COMMAND:
        return True
    events = span.get("events")
    return isinstance(events, list) and any(
        isinstance(e, dict) and e.get("name") == "exception"
        and str((e.get("attributes") or {}).get("exception.type") or "").rpartition(".")[2] == _PARENT_COMMAND
        for e in events)


def _chat(span: Mapping[str, Any], r: Reading, add: Any) -> None:
    trace, sid = span["traceId"], span["spanId"]
    key, recipe = None, RECIPE_IDS["v2"]
    if r.request is not None:
        try:
            key = cache_key(r.request)
        except AgentlogError:
            key = None
    if key is None:
        # Content not captured (or not keyable): a key unique to this span, so a mock replay never
        # serves another call's result for it; the recipe id says it is no semantic key.
        key, recipe = f"otel-span:{trace}:{sid}", "otel-span-id"
    started = add("start", "agent.invocation.started",
                  {"request": r.request or {"captured": False, "model": r.model}, "cacheKey": key, "recipe": recipe})
    if _failed(span):
        add("end", "node.failed", {"error": _error(span), "cacheKey": key}, cause=started)
        return
    usage = {k: v for k, v in r.usage.items() if k in ("inputTokens", "outputTokens")}
    if r.refusal is not None:
        refusal: dict[str, Any] = {"cacheKey": key, "reason": r.refusal if r.refusal in REFUSAL_REASONS else "refusal"}
        if r.refusal not in REFUSAL_REASONS:
            refusal["refusalText"] = r.refusal
        add("end", "envelope.refusal", refusal, cause=started)
    else:
        payload: dict[str, Any] = {"cacheKey": key, "envelope": r.output if r.output is not None
                                   else {"finishReasons": list(r.finish_reasons)}}
        if usage:
            payload["usage"] = usage
        add("end", "agent.invocation.completed", payload, cause=started)
    if "inputTokens" in usage and "outputTokens" in usage:
        attrs = span_attrs(span)
        model = attrs.get("gen_ai.response.model")
        add("usage", "provider.usage", {
            "provider": r.provider, "model": model if isinstance(model, str) and model else r.model,
            **usage, **({"totalTokens": r.usage["totalTokens"]} if "totalTokens" in r.usage else {}),
            "traceId": trace,
        }, cause=started)


def _tool(span: Mapping[str, Any], r: Reading, add: Any) -> None:
    call_id = r.call_id or str(span["spanId"])
    tool = r.name or "tool"
    called = add("start", "agent.toolCalled", {"callId": call_id, "tool": tool, "args": r.args})
    if _failed(span):
        add("end", "node.failed", {"callId": call_id, "tool": tool, "error": _error(span)}, cause=called)
    else:
        add("end", "agent.toolReturned", {"callId": call_id, "result": r.result}, cause=called)


def _opaque(span: Mapping[str, Any], add: Any) -> None:
    add("end", "log.appended", {"source": "opentelemetry", "otelSpan": {
        k: span.get(k) for k in ("traceId", "spanId", "parentSpanId", "name", "kind", "startNs", "endNs",
                                 "attributes", "status")}})


@dataclass(frozen=True)
class _Handoff:
    origin: str | None  # the handoff/route span, None when the trace shows the handoff only by its shape
    source: str | None  # the agent or graph node handing off
    worker: str | None = None  # the agent taking over, where the target span does not name it
    #: A target with no span of its own (LlamaIndex's flat workflow): the spans after the handoff, in order; the
    #: child run starts with the first (the key of this handoff) and ends with the last.
    segment: tuple[str, ...] = ()


#: LangGraph's name of the node a graph starts from: a branch taken from START runs as a task of this node.
_GRAPH_START = "__start__"


def _handoffs(pending: Mapping[str, Mapping[str, Any]], readings: Mapping[str, Reading],
              base: Mapping[str, str]) -> tuple[dict[str, _Handoff], set[str]]:
    """Target span → handoff, for the spans where control passes to another agent; and the route spans
    those handoffs account for (they add no event of their own).

    * a handoff span (OpenAI Agents: ``handoff`` operation, OpenInference ``handoff to <agent>``;
      the proposed ``gen_ai.agent.handoff.target.name``; a handoff tool call: ``transfer_to_<agent>``,
      ADK's ``transfer_to_agent``, Strands' ``handoff_to_agent``, LlamaIndex's ``handoff``): the target is the first
      agent span starting after it, not enclosing it, named as its target when it names one; where no agent span
      of that name follows (LlamaIndex's workflow has none), the spans after the handoff are the target's. Where
      the handoff does not name its source, the agent a workflow step around it or before it names is (LlamaIndex's
      steps name the current agent in the events they receive);
    * LangGraph (:func:`_graph_handoffs`): a node that runs an agent, reached from another node;
    * outside a LangGraph graph, an agent inside another agent that calls a model itself (a managed agent called as
      a tool: smolagents, AutoGen's ``AgentTool``): a delegation from the agent around it; so is a tool span inside
      which model calls run with no agent span of their own (CrewAI's ``Delegate work to coworker``), to the agent
      its arguments name. Not where the inner span is in another conversation (``base``: each span's run by
      conversation), which makes it a child run already.
    """
    start = {sid: int(s["startNs"]) for sid, s in pending.items()}
    children: dict[str, list[str]] = {}
    for sid, span in pending.items():
        children.setdefault(str(span.get("parentSpanId") or ""), []).append(sid)

    def ancestors(sid: str) -> list[str]:
        """The spans around ``sid`` that this emission holds, nearest first."""
        return [a for a in _ancestors(pending, sid) if a in pending]

    def below(sid: str) -> list[str]:
        out: list[str] = []
        todo = list(children.get(sid, []))
        while todo and len(out) < 100_000:
            cur = todo.pop()
            out.append(cur)
            todo.extend(children.get(cur, []))
        return out

    def agent_around(sid: str) -> str | None:
        return next((a for a in ancestors(sid) if _is_agent(pending[a], readings[a])), None)

    at_work = sorted((start[sid], sid) for sid, r in readings.items() if r.agent)

    def agent_at_work(sid: str) -> str | None:
        """The agent a workflow step around the span, else the latest one started before it, names (LlamaIndex)."""
        around = next((readings[a].agent for a in ancestors(sid) if readings[a].agent), None)
        return around or next((readings[s].agent for t, s in reversed(at_work) if t <= start[sid]), None)

    found: dict[str, _Handoff] = {}
    explicit = sorted((start[sid], sid) for sid, r in readings.items() if r.kind == "handoff")
    for t0, origin in explicit:
        r = readings[origin]
        if r.source is None and at_work:
            r = replace(r, source=agent_at_work(origin))
        enclosing = set(_ancestors(pending, origin))
        candidates = [(start[sid], len(_ancestors(pending, sid)), sid) for sid, c in readings.items()
                      if sid not in found and sid != origin and sid not in enclosing and c.kind == "agent"
                      and start[sid] >= t0 and (r.target is None or c.name == r.target)]
        if candidates:
            found[min(candidates)[2]] = _Handoff(origin, r.source)
        elif r.target:
            segment = _segment(origin, pending, children, ancestors(origin), start)
            if segment and segment[0] not in found:
                found[segment[0]] = _Handoff(origin, r.source, worker=r.target, segment=segment)
    consumed = _graph_handoffs(pending, readings, found)
    graph = any(r.scope is not None for r in readings.values())  # a LangGraph trace: its own rule decides
    for _, sid in sorted((start[sid], sid) for sid in readings) if not graph else ():
        r = readings[sid]
        if sid in found or r.kind not in ("agent", "tool") or base[sid] != base.get(
                str(pending[sid].get("parentSpanId") or ""), base[sid]):
            continue
        # The agent whose work this span is part of: the nearest agent span, or child run, around it.
        around = next((a for a in ancestors(sid) if a in found or _is_agent(pending[a], readings[a])), None)
        if around is None:
            continue
        around_name = (found[around].worker if around in found else None) or readings[around].name
        inside = below(sid)
        mine = set(inside)
        if r.kind == "agent" and r.name != around_name and around not in found and any(
                readings[b].kind == "llm" and b not in mine and agent_around(b) == around for b in below(around)):
            # The agent around it works itself (calls a model): it delegates to this one. A root that only
            # holds agents (OpenAI Agents' workflow) hands nothing to them.
            found[sid] = _Handoff(None, around_name)
        elif (r.kind == "tool" and any(readings[b].kind == "llm" for b in inside)
              and not any(readings[b].kind == "agent" for b in inside)):
            named = next((r.args[k] for k in DELEGATE_ARGS if isinstance(r.args, dict)
                          and isinstance(r.args.get(k), str) and r.args[k]), None)
            found[sid] = _Handoff(None, around_name, worker=named or r.name)
    return found, consumed


def _is_agent(span: Mapping[str, Any], r: Reading) -> bool:
    """An agent's own span: an agent, or a root that is one (an OpenInference AGENT or a GenAI ``invoke_agent``)."""
    if r.kind == "agent":
        return True
    attrs = span_attrs(span)
    return r.kind == "workflow" and (attrs.get("openinference.span.kind") == "AGENT"
                                     or attrs.get("gen_ai.operation.name") == "invoke_agent")


def _segment(origin: str, pending: Mapping[str, Mapping[str, Any]], children: Mapping[str, list[str]],
             ancestors: list[str], start: Mapping[str, int]) -> tuple[str, ...]:
    """The spans that run after a handoff whose target has no span: the later siblings of the nearest span around
    the handoff (or the handoff itself) that has any, in start order."""
    for sid in [origin, *ancestors]:
        parent = str(pending[sid].get("parentSpanId") or "")
        if not parent:
            return ()
        ends = int(pending[sid]["endNs"])
        later = sorted((start[c], c) for c in children.get(parent, []) if start[c] >= ends and c != sid)
        if later:
            return tuple(c for _, c in later)
    return ()


def _folded(pending: Mapping[str, Mapping[str, Any]], readings: dict[str, Reading]) -> set[str]:
    """Spans that repeat the span around them: a tool call (or handoff) inside a span of the same kind and name is
    the same call recorded twice (AutoGen's own ``execute_tool`` inside OpenInference's tool span). The outer
    reading takes what only the inner one records (the call id, the target); the inner maps to nothing."""
    out: set[str] = set()
    for sid, r in readings.items():
        parent = str(pending[sid].get("parentSpanId") or "")
        outer = readings.get(parent)
        if outer is None or r.kind not in ("tool", "handoff") or outer.kind != r.kind or outer.name != r.name:
            continue
        readings[parent] = replace(outer, call_id=outer.call_id or r.call_id, target=outer.target or r.target,
                                   source=outer.source or r.source,
                                   args=outer.args if outer.args is not None else r.args,
                                   result=outer.result if outer.result is not None else r.result)
        readings[sid] = replace(r, kind="folded")
        out.add(sid)
    return out


def _ancestors(pending: Mapping[str, Mapping[str, Any]], sid: str) -> list[str]:
    out: list[str] = []
    cur = pending.get(sid)
    while cur is not None and cur.get("parentSpanId") and len(out) < 1000:
        out.append(str(cur["parentSpanId"]))
        cur = pending.get(cur["parentSpanId"])
    return out


def _graph_handoffs(pending: Mapping[str, Mapping[str, Any]], readings: Mapping[str, Reading],
                    found: dict[str, _Handoff]) -> set[str]:
    """LangGraph's handoffs, into ``found``, from what every LangGraph shape's spans carry: checkpoint namespaces.

    Each node execution (a task) has its namespace, ``<node>:<task id>``, and a subgraph's tasks extend the
    namespace of the node running it (``researcher:<id>|llm:<id>``); both instrumentation families put it on a
    node's spans. A node execution that runs a graph of its own in which a model is called (a compiled subgraph,
    ``create_react_agent``, the agents of ``create_supervisor`` and ``create_swarm``, or a compiled graph a node
    function invokes, which LangGraph runs in the calling node's namespace: how supervisors are often written) is
    an **agent**; every other node (a router, a formatter, a function calling a model, a graph calling none) is a
    plain node of the run it is in. An agent's execution is a
    child run unless it is its graph's entry node (the first node that ran, whose agent the run itself is:
    a supervisor getting control back, a swarm's default agent). However control reached it (a conditional
    edge, ``Command(goto=…)``, ``Command(graph=Command.PARENT, …)`` from inside a sibling, a handoff tool,
    ``Send``), the handing node is the one a ``goto`` span naming the agent ran in (OpenLLMetry records
    ``Command``), else the sibling that finished last before the agent started (parallel ``Send`` workers all
    name the node that sent them). Returns the ``goto`` spans accounted for.
    """
    first: dict[str, tuple[int, int, str]] = {}  # namespace → (start, depth, span) of its outermost span
    for sid, r in readings.items():
        if r.scope is not None:
            key = (int(pending[sid]["startNs"]), len(_ancestors(pending, sid)), sid)
            if r.scope not in first or key < first[r.scope]:
                first[r.scope] = key
    execution_of = {key[2]: scope for scope, key in first.items()}  # outermost span → its namespace
    calling = {r.scope for r in readings.values() if r.kind == "llm" and r.scope is not None}
    agents = {graph for graph in {_graph_of(scope) for scope in first} & set(first)
              if any(scope.startswith(f"{graph}|") for scope in calling)}
    graphs: dict[str, list[str]] = {}  # a graph's namespace ("" for the root graph) → its executions by start
    for scope in sorted(first, key=first.__getitem__):
        graphs.setdefault(_graph_of(scope), []).append(scope)
    routes = [sid for _, sid in sorted((int(pending[sid]["startNs"]), sid) for sid, r in readings.items()
                                       if r.kind == "route")]
    consumed: set[str] = set()
    for scopes in graphs.values():
        entry = next((_node_of(sc) for sc in scopes if _node_of(sc) != _GRAPH_START), None)

        def execution_around(sid: str, siblings: frozenset[str] = frozenset(scopes)) -> str | None:
            """The execution of this graph that a span ran in (a ``goto`` span: the node that sent it)."""
            return next((execution_of[up] for up in [sid, *_ancestors(pending, sid)]
                         if execution_of.get(up) in siblings), None)

        for scope in scopes:
            target, t0 = first[scope][2], first[scope][0]
            name = _node_of(scope)
            if scope not in agents or name == entry or target in found:
                continue
            told = [(sid, sender) for sid in routes if sid not in consumed and int(pending[sid]["startNs"]) <= t0
                    and readings[sid].target == name and (sender := execution_around(sid)) is not None]
            if told:
                origin, sender = told[0]
                consumed.update(sid for sid, s in told if s == sender)  # a PARENT goto is recorded at each level
                found[target] = _Handoff(origin, _node_of(sender))
                continue
            ended = [(int(pending[first[sc][2]]["endNs"]), sc) for sc in scopes
                     if sc != scope and int(pending[first[sc][2]]["endNs"]) <= t0]
            found[target] = _Handoff(None, _node_of(max(ended)[1]) if ended else entry)
    return consumed


def _graph_of(scope: str) -> str:
    """The namespace of the graph a node execution ran in: its own less the last ``|<node>:<task id>``."""
    return scope.rpartition("|")[0]


def _node_of(scope: str) -> str:
    return scope.rpartition("|")[2].partition(":")[0]


def _asked_tool_calls(pending: Mapping[str, Mapping[str, Any]],
                      readings: Mapping[str, Reading]) -> list[tuple[int, str, str, Any]]:
    """The tool calls the trace's LLM calls asked for: (end of the LLM span, call id, tool name, arguments)."""
    out = []
    for sid, r in readings.items():
        if r.kind != "llm" or not isinstance(r.output, list):
            continue
        for m in r.output:
            for part in (m.get("parts") or []) if isinstance(m, dict) else []:
                if isinstance(part, dict) and part.get("type") == "tool_call" and isinstance(part.get("id"), str):
                    out.append((int(pending[sid]["endNs"]), part["id"], str(part.get("name") or ""),
                                part.get("arguments")))
    return sorted(out, key=lambda a: a[0])


def _with_asked_call(r: Reading, start: int, asked: list[tuple[int, str, str, Any]]) -> Reading:
    """Pair a tool span with the call the model asked for, so ``callId`` is the model's own.

    By call id when the span records one; else the latest call of that tool asked before the span
    started (OpenLLMetry's OpenAI Agents tool spans carry no call id). A span that records only a
    bare string as arguments (OpenInference's LangChain tool spans) gets the call's structured ones.
    """
    match = next((a for a in asked if a[1] == r.call_id), None) if r.call_id else next(
        (a for a in reversed(asked) if a[2] == r.name and a[0] <= start), None)
    if match is None:
        return r
    return replace(r, call_id=match[1], args=r.args if isinstance(r.args, dict) else match[3])


def _child_run(parent_run: str, agent: str, span_id: str) -> str:
    """Run id of a child run a handoff starts inside its parent's conversation (unique per span)."""
    return f"{parent_run}/{agent}/{span_id}"


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

    ``published``: spanId → {"run", "start"} of this trace's spans planned before. A span with a
    malformed attribute is listed in :attr:`Plan.rejected` with the reason and keeps an opaque
    ``log.appended`` in its run (so the run shows the hole); the trace's other spans map as usual.
    """
    known_runs = {sid: str(p["run"]) for sid, p in published.items()}
    readings: dict[str, Reading] = {}
    rejected: dict[str, str] = {}
    for sid, span in pending.items():
        try:
            readings[sid] = read_span(span)
        except Malformed as e:
            readings[sid] = Reading("rejected", name=str(span.get("name") or ""))
            rejected[sid] = str(e)
    folded = _folded(pending, readings)
    for sid, r in readings.items():
        if r.kind == "opaque" and not r.family and not pending[sid].get("parentSpanId") and any(
                p.get("parentSpanId") == sid for p in pending.values()):
            # A root no instrumentation describes around spans one does (the span a program opens around a team's
            # run, as AutoGen's tracing guide shows): the trace's run.
            readings[sid] = Reading("workflow", name=r.name, conversation=r.conversation)
    base = run_ids(pending, known_runs)
    handoffs, routed = _handoffs(pending, readings, base)
    children: dict[str, str] = {}
    last_of: dict[str, str] = {}  # the last span of a segment → its first (whose handoff it is)
    worker_of: dict[str, str] = {}  # a child run's span without an agent of its own → the agent it was handed to
    for sid, h in handoffs.items():
        children[sid] = _child_run(base[sid], h.worker or readings[sid].name or "agent", sid)
        for member in h.segment[1:]:
            children[member] = children[sid]
        last_of[(h.segment or (sid,))[-1]] = sid
        for member in h.segment or (sid,):
            if h.worker:
                worker_of[member] = h.worker
    runs = run_ids(pending, known_runs, children=children)
    asked = _asked_tool_calls(pending, readings)
    drafts: list[_Draft] = []

    def depth_of(span_id: str) -> int:
        d, cur = 0, pending.get(span_id)
        while cur is not None and cur.get("parentSpanId") and d < 1000:
            d += 1
            cur = pending.get(cur["parentSpanId"])
        return d

    def agent_of(span_id: str) -> str | None:
        """The name of the nearest enclosing agent (or graph node) span: the LLM call's or tool's node; in a
        child run with no agent span (a delegation tool, the steps after a handoff), the agent handed to."""
        cur, hops = pending.get(span_id), 0
        while cur is not None and hops < 1000:
            csid = str(cur["spanId"])
            r = readings.get(csid)
            if r is not None and (_is_agent(cur, r) or (r.kind == "step" and r.node)) and r.name:
                return r.name
            if csid in worker_of:
                return worker_of[csid]
            cur, hops = pending.get(cur.get("parentSpanId") or ""), hops + 1
        return None

    for sid, span in pending.items():
        run = runs[sid]
        r = readings[sid]
        start, end = int(span["startNs"]), int(span["endNs"])
        depth = depth_of(sid)
        counter = [0]
        node = r.name if r.kind == "agent" else r.node or agent_of(sid)

        def add(when: str, etype: str, payload: dict[str, Any], *, cause: str | None = None,
                role: str | None = None, target: str | None = None, at: int | None = None,
                _sid: str = sid, _run: str = run, _start: int = start, _end: int = end, _depth: int = depth,
                _counter: list[int] = counter, _node: str | None = node) -> str:
            eid = event_id(trace_id, _sid, role or etype)
            t = at if at is not None else _start if when == "start" else _end
            drafts.append(_Draft(target or _run, t, _start, _depth, _sid, _counter[0], etype, payload, eid, cause,
                                 _node))
            _counter[0] += 1
            return eid

        parent_sid = span.get("parentSpanId") or ""
        parent_run = runs.get(parent_sid) or known_runs.get(parent_sid)
        handoff = handoffs.get(sid)
        if handoff is not None and handoff.segment and handoff.origin is not None:
            parent_run = runs[handoff.origin]  # the run that handed off
        if sid in folded:
            continue  # the span around it records the same call (see _folded)
        if sid in rejected:
            add("end", "log.appended", {"source": "opentelemetry", "rejected": {
                "reason": rejected[sid], "traceId": trace_id, "spanId": sid, "name": r.name}})
        elif handoff is not None and handoff.segment:
            _run_start(span, r, add, parent_run=parent_run, run=run, handoff=handoff, pending=pending,
                       readings=readings, agent_of=agent_of)
            _span_events(span, r, add, start, asked)
        elif sid in handoffs or (r.kind in ("agent", "workflow") and parent_run != run):
            ok = _run_start(span, r, add, parent_run=parent_run, run=run, handoff=handoff, pending=pending,
                            readings=readings, agent_of=agent_of)
            _run_end(span, add, parent_run=parent_run, run=run, worker=_worker(r, run, handoff), ok=ok)
        elif sid in routed or (r.kind == "handoff" and any(h.origin == sid for h in handoffs.values())):
            pass  # its handoff chain is emitted with the target's run (at the handoff's start)
        else:
            _span_events(span, r, add, start, asked)
        first = last_of.get(sid)
        if first is not None and handoffs[first].segment:  # a segment's last span closes its run
            h = handoffs[first]
            _run_end(span, add, parent_run=runs[h.origin] if h.origin else None, run=runs[first],
                     worker=_worker(readings[first], runs[first], h),
                     ok=event_id(trace_id, first, "dispatch.succeeded"))

    plan = _plan(trace_id, pending, drafts, runs, published)
    plan.rejected = rejected
    return plan


def _span_events(span: Mapping[str, Any], r: Reading, add: Any, start: int,
                 asked: list[tuple[int, str, str, Any]]) -> None:
    """What a span that starts no run says, in its run."""
    if r.kind in ("agent", "workflow", "step"):
        key = "agent" if r.kind == "agent" else "node"
        began = add("start", "node.started", {key: r.name or "node"})
        if _failed(span):
            add("end", "node.failed", {key: r.name or "node", "error": _error(span)}, cause=began)
        else:
            add("end", "node.completed", {key: r.name or "node"}, cause=began)
    elif r.kind == "llm":
        _chat(span, r, add)
    elif r.kind == "tool":
        _tool(span, _with_asked_call(r, start, asked), add)
    else:
        _opaque(span, add)


def _worker(r: Reading, run: str, handoff: _Handoff | None) -> str:
    return (handoff.worker if handoff is not None and handoff.worker else None) or r.name or run


def _run_start(span: Mapping[str, Any], r: Reading, add: Any, *, parent_run: str | None, run: str,
               handoff: _Handoff | None, pending: Mapping[str, Mapping[str, Any]],
               readings: Mapping[str, Reading], agent_of: Callable[[str], str | None]) -> str | None:
    """A span that starts a run: ``run.started`` and, when it is a child run, the start of the RFC 0037 §B chain
    in its parent run (``runOrchestrator.decided`` → ``dispatch.began`` at the handoff, ``dispatch.succeeded``
    as the child starts); :func:`_run_end` ends both. Returns the ``dispatch.succeeded`` event id (None for a
    root run). The planner is the agent the handoff names, else the agent around the handoff span, else the
    span around the child run.

    ``run.started`` says the run came from spans (``source: "opentelemetry"``: a replay refuses it as a source), names
    the run's data subject from this span alone (:func:`agentlog.core.otel_read.subject`: ``user.id``, else
    ``enduser.id``, else the span's own conversation) or leaves it out, and its class where the span or its resource
    names one (:func:`agentlog.core.otel_read.run_class`); a child run's names its parent run (``parentRunId``), as a
    host's does, so that erasing the parent reaches it."""
    worker = _worker(r, run, handoff)
    started: dict[str, Any] = {"bindings": {}, "agent": worker, "source": "opentelemetry"}
    subject_id = subject(span)
    if subject_id is not None:
        started["subjectId"] = subject_id
    klass = run_class(span)
    if klass is not None:
        started["runClass"] = klass
    if parent_run is not None:  # so that erasing the parent's subject reaches the child run too
        started["parentRunId"] = parent_run
    add("start", "run.started", started)
    if parent_run is None:
        return None
    origin = pending.get(handoff.origin) if handoff and handoff.origin else None
    at = int(origin["startNs"]) if origin is not None else None
    planner = handoff.source if handoff and handoff.source else None
    if planner is None and origin is not None:
        planner = agent_of(str(origin["spanId"]))
    if planner is None:
        parent = pending.get(span.get("parentSpanId") or "") or {}
        parent_reading = readings.get(str(parent.get("spanId") or ""))
        planner = parent_reading.name if parent_reading is not None else None
    planner = planner or "otel-planner"
    planner = planner if len(planner) >= 3 else f"agent:{planner}"
    decided = add("start", "runOrchestrator.decided", {"agentId": planner, "decision": {"nextWorkerIds": [worker]}},
                  target=parent_run, at=at)
    chain = {"workerId": worker, "parentRunId": parent_run}
    began = add("start", "core.workflowChain.event", {"phase": "dispatch.began", **chain},
                cause=decided, role="dispatch.began", target=parent_run, at=at)
    ok: str = add("start", "core.workflowChain.event", {"phase": "dispatch.succeeded", "childRunId": run, **chain},
                  cause=began, role="dispatch.succeeded", target=parent_run)
    return ok


def _run_end(span: Mapping[str, Any], add: Any, *, parent_run: str | None, run: str, worker: str,
             ok: str | None) -> None:
    """``run.completed``/``run.failed`` as ``span`` ends and, in a child run's parent, ``child.completed`` /
    ``child.failed`` caused by ``ok`` (the child's ``dispatch.succeeded``)."""
    if _failed(span):
        add("end", "run.failed", {"error": _error(span)})
    else:
        add("end", "run.completed", {})
    if parent_run is None or ok is None:
        return
    chain = {"workerId": worker, "parentRunId": parent_run}
    if _failed(span):
        add("end", "core.workflowChain.event",
            {"phase": "child.failed", "childRunId": run, "error": _error(span), **chain},
            cause=ok, role="child.failed", target=parent_run)
    else:
        add("end", "core.workflowChain.event", {"phase": "child.completed", "childRunId": run, **chain},
            cause=ok, role="child.completed", target=parent_run)


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
    #: spanId → why the span was rejected (a malformed attribute); the worker records each on ``rejections``.
    rejected: dict[str, str] = field(default_factory=dict)


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
    #: With ``parsed``: each doc's JCS bytes (what the run sequencer publishes), computed by the validation.
    data: list[bytes] = field(default_factory=list)


def sequence_run(cursor: Cursor, known: Callable[[str], bool], trace_id: str,
                 events: Iterable[Mapping[str, Any]], *, parsed: bool = False) -> Sequenced:
    """Give a run's planned events the next sequences (stage 2, the run's one writer).

    ``known(eventId)``: whether the run already has that event (sequenced before). A known
    event is skipped, so a re-emitted doc never gets a second sequence. A planned
    ``causationId`` is kept only if it names a known event or one sequenced earlier in this
    call; otherwise (and when the trace left it open) the cause is the run's previous event,
    so causation always names an earlier event of the run, whatever trace it came from.

    ``parsed``: the events were read from JSON (dicts, lists, str, int, float, bool, None), so each
    doc is validated on its JCS bytes (:func:`agentlog.schemas.validate.validate_parsed`), which come back in
    :attr:`Sequenced.data`.
    """
    docs: list[dict[str, Any]] = []
    data: list[bytes] = []
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
        if parsed:
            data.append(_keep_valid_parsed(doc, trace_id, str(event["span"])))
        else:
            _keep_valid(doc, trace_id, str(event["span"]))
        docs.append(doc)
        now.add(eid)
        cursor = Cursor(cursor.next + 1, eid)
    return Sequenced(docs, cursor, duplicates, data)


def _keep_valid_parsed(doc: dict[str, Any], trace_id: str, span_id: str) -> bytes:
    """:func:`_keep_valid` of a doc read from JSON, returning its JCS bytes (the validation computes them)."""
    try:
        return validate_parsed(doc)
    except EventRejected as e:
        _unmapped(doc, e, trace_id, span_id)
    return jcs(doc)


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
        _unmapped(doc, e, trace_id, span_id)


def encodable(trace_id: str, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A run's planned events with each doc JCS cannot write made an opaque ``log.appended`` saying why.

    Captured JSON can hold what a RunEventDoc cannot (an integer past 2^53, NaN): the stage-1
    record carrying such a doc could not be written, so the doc keeps its slot and id as
    :func:`sequence_run` would keep it. The other docs are left as they are.
    """
    out: list[dict[str, Any]] = []
    for event in events:
        try:
            jcs(event["doc"])
        except EventRejected as e:
            doc = dict(event["doc"])
            _unmapped(doc, e, trace_id, str(event["span"]))
            out.append({**event, "doc": doc})
            continue
        out.append(dict(event))
    return out


def _unmapped(doc: dict[str, Any], error: EventRejected, trace_id: str, span_id: str) -> None:
    doc["payload"] = {"source": "opentelemetry", "unmapped": {
        "type": doc["type"], "code": error.code, "detail": str(error)[:500], "traceId": trace_id, "spanId": span_id}}
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
