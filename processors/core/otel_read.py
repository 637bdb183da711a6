"""What one span says, whichever convention family wrote it: the reading :mod:`agentlog.core.otel` maps.

Two families of attributes describe LLM applications, and frameworks' instrumentations emit
one or the other:

* the OTel **GenAI** semantic conventions (``gen_ai.operation.name`` = ``invoke_agent``,
  ``chat``, ``execute_tool`` …), with the messages in any of four forms: the
  ``gen_ai.input/output.messages`` attributes, the ``gen_ai.client.inference.operation.details``
  event, the older indexed ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` attributes, or one
  event per message (``gen_ai.user.message``, ``gen_ai.choice`` …). OpenLLMetry adds its own
  ``traceloop.span.kind`` (``workflow``/``agent``/``task``/``tool``) and, for LangGraph,
  ``execute_task`` and ``goto`` operations;
* **OpenInference** (``openinference.span.kind`` = ``AGENT``/``CHAIN``/``LLM``/``TOOL``,
  ``llm.input_messages.N.message.*``, ``llm.token_count.*``, ``tool.name``, ``input.value``,
  ``session.id``).

:func:`read_span` turns either into one :class:`Reading`; messages always come out in the
GenAI "parts" form (``{"role", "parts": [{"type": "text"|"tool_call"|"tool_call_response", …}]}``),
so a request's cache key does not depend on which form carried it. An attribute that is there
but unusable (truncated JSON, a string where a count belongs) raises :class:`Malformed`: the
caller rejects that span with the reason and keeps the others.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agentlog.schemas.payloads import RUN_CLASS

__all__ = ["DELEGATE_ARGS", "HANDOFF_TOOLS", "REFUSAL_REASONS", "Malformed", "Reading", "conversation", "read_span",
           "run_class", "span_attrs", "subject"]

_CHAT_OPS = frozenset({"chat", "text_completion", "generate_content"})
REFUSAL_REASONS = frozenset({"content_filter", "refusal", "refused", "safety"})
#: LangGraph's name of the graph's end (a ``goto`` there hands off to no one).
_END = frozenset({"__end__", "END"})
#: ``gen_ai.tool.type`` of Google ADK's built-in ``transfer_to_agent`` tool (a handoff to a sub-agent).
_ADK_TRANSFER = "TransferToAgentTool"
#: Handoff tools that name their target in an argument: tool name → the argument. ADK's ``transfer_to_agent`` and
#: Strands' ``handoff_to_agent`` (``agent_name``), LlamaIndex AgentWorkflow's ``handoff`` (``to_agent``). A tool named
#: ``transfer_to_<agent>`` (OpenAI Agents, AutoGen, the proposed GenAI handoff) names it in its own name.
HANDOFF_TOOLS = {"transfer_to_agent": "agent_name", "handoff_to_agent": "agent_name", "handoff": "to_agent"}
_TRANSFER_PREFIX = "transfer_to_"
#: Arguments that name the agent a delegation tool hands its task to (CrewAI's ``Delegate work to coworker``:
#: ``coworker``), besides the handoff tools' own.
DELEGATE_ARGS = ("coworker", "agent_name", "to_agent", "agent")
_INDEXED = re.compile(r"^(\d+)\.(.+)$")


class Malformed(ValueError):
    """A span attribute is present but cannot be read as its convention says (the span is rejected)."""

    def __init__(self, attribute: str, detail: str) -> None:
        super().__init__(f"attribute {attribute!r}: {detail}")
        self.attribute = attribute


@dataclass(frozen=True)
class Reading:
    """One span, classified. ``kind``: ``workflow`` (a trace's root step), ``agent``, ``llm``, ``tool``,
    ``handoff`` (control passes from ``source`` to ``target``), ``route`` (a graph's supervisor sends the
    next step to ``target``), ``step`` (a graph node or chain), or ``opaque`` (no family we read)."""

    kind: str
    family: str = ""  # "genai" | "openinference" | ""
    name: str | None = None
    conversation: str | None = None
    node: str | None = None  # the graph node the span ran in (LangGraph), for nodeId
    #: LangGraph's checkpoint namespace of the node execution the span ran in (``researcher:<task id>``, a
    #: subgraph's nodes ``researcher:<task id>|llm:<task id>``): which graph, node and task a span belongs to.
    scope: str | None = None
    source: str | None = None
    target: str | None = None
    #: The agent at work in a workflow step that names it (LlamaIndex's AgentWorkflow events carry
    #: ``current_agent_name``), where no agent span says who works.
    agent: str | None = None
    # llm
    provider: str = "unknown"
    model: str = "unknown"
    request: dict[str, Any] | None = None
    output: Any = None
    finish_reasons: tuple[str, ...] = ()
    refusal: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    # tool
    call_id: str | None = None
    args: Any = None
    result: Any = None


def span_attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    attrs = span.get("attributes")
    return attrs if isinstance(attrs, dict) else {}


# --- typed attribute access -----------------------------------------------------------------------------------

def _str(attrs: Mapping[str, Any], key: str) -> str | None:
    value = attrs.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise Malformed(key, f"expected a string, got {type(value).__name__}")
    return value


def _count(attrs: Mapping[str, Any], key: str) -> int | None:
    value = attrs.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Malformed(key, f"expected a token count (integer >= 0), got {value!r:.60}")
    return value


def _json(attrs: Mapping[str, Any], key: str, *, strict: bool = True) -> Any:
    """A structured attribute: OTel attributes are flat, so structure travels as JSON text.

    ``strict``: the convention says this is JSON, so text that does not parse is malformed;
    otherwise (``input.value``, ``gen_ai.tool.call.result``) text is a plain string value.
    """
    value = attrs.get(key)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as e:
        if strict:
            raise Malformed(key, f"not valid JSON ({e}; {len(value)} characters)") from e
        return value


def _loose(value: Any) -> Any:
    """A value that may be JSON text (tool arguments, results): parsed if it parses, else as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _indexed(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``prefix.N.rest`` attributes → a list (by N) of ``{rest: value}`` dicts."""
    rows: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            m = _INDEXED.match(key[len(prefix):])
            if m:
                rows.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return [rows[i] for i in sorted(rows)]


# --- messages in the GenAI parts form ---------------------------------------------------------------------------

def _part_text(text: Any) -> dict[str, Any]:
    return {"type": "text", "content": text}


def _message(role: Any, content: Any, tool_calls: list[dict[str, Any]], tool_call_id: Any = None,
             finish_reason: Any = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if tool_call_id:
        parts.append({"type": "tool_call_response", "id": str(tool_call_id), "response": content})
    elif content not in (None, ""):
        parts.append(_part_text(content))
    parts.extend(tool_calls)
    msg: dict[str, Any] = {"role": str(role or "user"), "parts": parts}
    if finish_reason:
        msg["finish_reason"] = str(finish_reason)
    return msg


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "tool_call", "name": str(name or "")}
    if call_id:
        part["id"] = str(call_id)
    part["arguments"] = _loose(arguments) if arguments not in (None, "") else {}
    return part


#: Where each indexed message form keeps a message's fields: OpenInference's ``llm.input_messages.N.*``
#: and OpenLLMetry's older ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``.
_OPENINFERENCE_KEYS = {"role": "message.role", "content": "message.content", "tool_call_id": "message.tool_call_id",
                       "finish_reason": "", "calls": "message.tool_calls.", "id": "tool_call.id",
                       "name": "tool_call.function.name", "arguments": "tool_call.function.arguments"}
_INDEXED_GENAI_KEYS = {"role": "role", "content": "content", "tool_call_id": "tool_call_id",
                       "finish_reason": "finish_reason", "calls": "tool_calls.", "id": "id", "name": "name",
                       "arguments": "arguments"}


def _indexed_messages(attrs: Mapping[str, Any], prefix: str, keys: Mapping[str, str]) -> list[dict[str, Any]] | None:
    rows = _indexed(attrs, prefix)
    if not rows:
        return None
    out = []
    for row in rows:
        content = row.get(keys["content"])
        if content is None:  # OpenInference's list form: message.contents.K.message_content.text
            texts = [v for k, v in sorted(row.items()) if k.startswith("message.contents.")
                     and k.endswith(".message_content.text")]
            content = "".join(str(t) for t in texts) if texts else None
        calls = [_tool_call(c.get(keys["id"]), c.get(keys["name"]), c.get(keys["arguments"]))
                 for c in _indexed(row, keys["calls"])]
        out.append(_message(row.get(keys["role"]), content, calls, row.get(keys["tool_call_id"]),
                            row.get(keys["finish_reason"])))
    return out


def _event_tool_calls(value: Any) -> list[dict[str, Any]]:
    """Tool calls in a message event: OpenAI's ``{id, function: {name, arguments}}`` or ``{id, name, arguments}``."""
    calls = _loose(value)
    out = []
    for c in calls if isinstance(calls, list) else []:
        if isinstance(c, dict):
            fn: dict[str, Any] = c["function"] if isinstance(c.get("function"), dict) else {}
            out.append(_tool_call(c.get("id"), fn.get("name") or c.get("name"),
                                  fn.get("arguments") or c.get("arguments")))
    return out


def _event_messages(span: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """Messages carried by span events: the ``gen_ai.client.inference.operation.details`` event (attributes
    ``gen_ai.input.messages``/``gen_ai.output.messages``), or one event per message (the older form)."""
    events = span.get("events")
    if not isinstance(events, list):
        return None, None
    inputs: list[dict[str, Any]] | None = None
    outputs: list[dict[str, Any]] | None = None
    per_in: list[dict[str, Any]] = []
    per_out: list[dict[str, Any]] = []
    for event in events:
        if not isinstance(event, dict):
            continue
        name, attrs = event.get("name"), event.get("attributes") or {}
        if name == "gen_ai.client.inference.operation.details":
            got = _json(attrs, "gen_ai.input.messages")
            inputs = got if isinstance(got, list) else inputs
            got = _json(attrs, "gen_ai.output.messages")
            outputs = got if isinstance(got, list) else outputs
        elif isinstance(name, str) and name.startswith("gen_ai.") and name.endswith(".message"):
            role = name[len("gen_ai."):-len(".message")]
            body = _loose(attrs.get("content"))
            calls = _event_tool_calls(attrs.get("tool_calls"))
            per_in.append(_message(attrs.get("role") or role, body, calls, attrs.get("id")))
        elif name == "gen_ai.choice":
            msg = _loose(attrs.get("message")) or {}
            msg = msg if isinstance(msg, dict) else {"content": msg}
            calls = _event_tool_calls(msg.get("tool_calls"))
            per_out.append(_message(msg.get("role") or "assistant", msg.get("content"), calls,
                                    finish_reason=attrs.get("finish_reason")))
    return inputs or (per_in or None), outputs or (per_out or None)


def _details_event_attrs(span: Mapping[str, Any]) -> Mapping[str, Any]:
    """The attributes of the span's ``gen_ai.client.inference.operation.details`` events, merged (Strands puts
    the system instructions, the input and the output messages in one event each)."""
    merged: dict[str, Any] = {}
    events = span.get("events")
    for event in events if isinstance(events, list) else []:
        if isinstance(event, dict) and event.get("name") == "gen_ai.client.inference.operation.details":
            merged.update(event.get("attributes") or {})
    return merged


def _tool_definitions(value: Any) -> list[dict[str, Any]] | None:
    """Tool definitions flattened to the GenAI form ``{type, name, description?, parameters?}``
    (OpenAI's chat form nests them under ``function``)."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for tool in value:
        tool = _loose(tool)
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            tool = {"type": tool.get("type", "function"), **tool["function"]}
        if not (isinstance(tool, dict) and isinstance(tool.get("name"), str)):
            return None  # not keyable: the caller's request has no tools rather than wrong ones
        out.append(tool)
    return out


# --- LangChain values inside attributes -------------------------------------------------------------------------

def _langchain_message(value: Any) -> dict[str, Any] | None:
    """A serialised LangChain message (``{"lc": 1, "kwargs": …}`` or ``{"type", "data": …}``) → its fields."""
    if not isinstance(value, dict):
        return None
    kwargs, data = value.get("kwargs"), value.get("data")
    if value.get("lc") == 1 and isinstance(kwargs, dict):
        return kwargs
    if isinstance(value.get("type"), str) and isinstance(data, dict) and "content" in data:
        return data
    return None


def _tool_result(value: Any) -> tuple[Any, str | None]:
    """The observable result of a tool and the call id it names, unwrapping LangChain's ToolMessage."""
    value = _loose(value)
    if isinstance(value, dict) and set(value) <= {"output", "kwargs"} and "output" in value:
        value = value["output"]
    msg = _langchain_message(value)
    if msg is not None:
        call = msg.get("tool_call_id")
        return _loose(msg.get("content")), str(call) if call else None
    return value, None


#: The keys of a Python call recorded as the tool's input (smolagents, LlamaIndex under OpenInference):
#: ``{"args": [], "kwargs": {…}}`` is a call by keywords, whose arguments are the keywords.
_CALL_KEYS = frozenset({"args", "kwargs", "sanitize_inputs_outputs"})


def _tool_args(value: Any) -> Any:
    """Tool arguments; OpenLLMetry's LangChain callback wraps them as ``{"input_str": "<repr>", …}``, and
    OpenInference records some tools' Python call as ``{"args": [], "kwargs": {…}}``."""
    value = _loose(value)
    if (isinstance(value, dict) and "kwargs" in value and set(value) <= _CALL_KEYS and not value.get("args")
            and isinstance(value["kwargs"], dict)):
        return value["kwargs"]
    if isinstance(value, dict) and isinstance(value.get("input_str"), str):
        text = value["input_str"]
        try:
            return json.loads(text)
        except ValueError:
            try:
                return ast.literal_eval(text)  # a Python repr of the arguments dict; literals only
            except (ValueError, SyntaxError):
                return text
    return value


# --- the reading ------------------------------------------------------------------------------------------------

def conversation(attrs: Mapping[str, Any]) -> str | None:
    for key in ("gen_ai.conversation.id", "session.id", "traceloop.association.properties.thread_id"):
        value = _str(attrs, key)
        if value:
            return value
    meta = _json(attrs, "metadata", strict=False)
    if isinstance(meta, dict) and isinstance(meta.get("thread_id"), str) and meta["thread_id"]:
        return str(meta["thread_id"])
    return None


#: The attributes naming the person a run is about, most specific first: ``user.id`` is the current
#: convention, ``enduser.id`` the one it replaced (instrumentations still send either).
_SUBJECT_KEYS = ("user.id", "enduser.id")


def subject(span: Mapping[str, Any]) -> str | None:
    """The data subject a run started by ``span`` names (``run.started`` ``payload.subjectId``, SPEC §12).

    The first usable of: the span's ``user.id``, its resource's ``user.id``, the span's ``enduser.id``,
    its resource's ``enduser.id``, else the span's own conversation (:func:`conversation`:
    ``gen_ai.conversation.id``, ``session.id``, LangGraph's ``thread_id``). The attribute name decides
    before the holder does, since a user id says who the run is about and a conversation only groups
    runs; the span decides before its resource, being the more specific. Usable is a non-blank
    string or an integer (as its decimal string); any other value is passed over rather than
    rejected, so a bad identity attribute never costs the run its events. None: the run is its own
    subject. Only the span that starts the run speaks for it: a conversation it inherits from an
    ancestor span does not count.
    """
    own = span_attrs(span)
    resource = span.get("resource")
    holders = (own, resource) if isinstance(resource, dict) else (own,)
    for key in _SUBJECT_KEYS:
        for attrs in holders:
            value = attrs.get(key)
            if isinstance(value, str) and value.strip():
                return value
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
    try:
        return conversation(own)
    except Malformed:
        return None


#: Where a run's class (``run.started`` ``runClass``, what retention and metrics-only choose by) is read from, in
#: order: ours, then OpenTelemetry's deployment environment (``deployment.environment`` before semconv 1.27).
_CLASS_KEYS = ("agentlog.run.class", "deployment.environment.name", "deployment.environment")


def run_class(span: Mapping[str, Any]) -> str | None:
    """The class of the run ``span`` starts: the first of :data:`_CLASS_KEYS` on the span, then on its resource,
    that is a valid class name (letters, digits, ``_``, ``.``, ``-``; at most 64). A value that is not one is passed
    over, so a stray environment name never costs the run its ``run.started``. None: no class."""
    own = span_attrs(span)
    resource = span.get("resource")
    for key in _CLASS_KEYS:
        for attrs in (own, resource) if isinstance(resource, dict) else (own,):
            value = attrs.get(key)
            if isinstance(value, str) and RUN_CLASS.fullmatch(value):
                return value
    return None


def _graph_node(attrs: Mapping[str, Any]) -> str | None:
    node = attrs.get("traceloop.association.properties.langgraph_node")
    if isinstance(node, str) and node:
        return node
    meta = _json(attrs, "metadata", strict=False)
    if isinstance(meta, dict) and isinstance(meta.get("langgraph_node"), str):
        return str(meta["langgraph_node"])
    return None


#: ``current_agent_name`` in the event a LlamaIndex AgentWorkflow step receives, as OpenInference records it in
#: ``input.value``: the event's repr (``AgentSetup(…, current_agent_name='triage')``), inside JSON or alone.
_CURRENT_AGENT = re.compile(r"""current_agent_name=(?:'([^'\\]+)'|\\?"([^"\\]+)\\?")""")


def _current_agent(attrs: Mapping[str, Any]) -> str | None:
    """The agent a workflow step works for, as the event it receives names it (the input's last mention)."""
    value = attrs.get("input.value")
    found = _CURRENT_AGENT.findall(value) if isinstance(value, str) else []
    return next((a or b for a, b in reversed(found) if a or b), None)


def _graph_scope(attrs: Mapping[str, Any]) -> str | None:
    """LangGraph's ``langgraph_checkpoint_ns`` (OpenLLMetry's association property, OpenInference's metadata)."""
    scope = attrs.get("traceloop.association.properties.langgraph_checkpoint_ns")
    if not (isinstance(scope, str) and scope):
        meta = _json(attrs, "metadata", strict=False)
        scope = meta.get("langgraph_checkpoint_ns") if isinstance(meta, dict) else None
    return scope if isinstance(scope, str) and scope else None


def _usage(attrs: Mapping[str, Any]) -> dict[str, int]:
    pairs = (("inputTokens", ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")),
             ("outputTokens", ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                               "llm.token_count.completion")),
             ("totalTokens", ("gen_ai.usage.total_tokens", "llm.usage.total_tokens", "llm.token_count.total")))
    usage: dict[str, int] = {}
    for name, keys in pairs:
        for key in keys:
            value = _count(attrs, key)
            if value is not None:
                usage[name] = value
                break
    return usage


def _finish_reasons(attrs: Mapping[str, Any], output: Any) -> tuple[str, ...]:
    reasons = _json(attrs, "gen_ai.response.finish_reasons", strict=False)
    if isinstance(reasons, str):
        reasons = [reasons]
    if not isinstance(reasons, list):
        reasons = [attrs["llm.finish_reason"]] if isinstance(attrs.get("llm.finish_reason"), str) else []
    if not reasons and isinstance(output, list):
        reasons = [m["finish_reason"] for m in output if isinstance(m, dict) and m.get("finish_reason")]
    return tuple(str(r) for r in reasons if isinstance(r, str))


def _refusal(output: Any, reasons: tuple[str, ...]) -> str | None:
    """The refusal text (or reason) when the provider refused: a refusal part, or a refusal finish reason."""
    if isinstance(output, list):
        for msg in output:
            for part in (msg.get("parts") or []) if isinstance(msg, dict) else []:
                if isinstance(part, dict) and part.get("type") == "refusal":
                    return str(part.get("content") or part.get("refusal") or "refusal")
    for reason in reasons:
        if reason in REFUSAL_REASONS:
            return reason
    return None


def _llm(span: Mapping[str, Any], attrs: Mapping[str, Any], family: str) -> Reading:
    ev_in, ev_out = _event_messages(span)
    # Message forms, newest first: a span carries one of them; if it carries several, the newer form
    # is what the instrumentation means today (older forms are kept for backends that need them).
    messages = _json(attrs, "gen_ai.input.messages")
    if not isinstance(messages, list):
        messages = (ev_in or _indexed_messages(attrs, "gen_ai.prompt.", _INDEXED_GENAI_KEYS)
                    or _indexed_messages(attrs, "llm.input_messages.", _OPENINFERENCE_KEYS))
    output = _json(attrs, "gen_ai.output.messages")
    if not isinstance(output, list):
        output = (ev_out or _indexed_messages(attrs, "gen_ai.completion.", _INDEXED_GENAI_KEYS)
                  or _indexed_messages(attrs, "llm.output_messages.", _OPENINFERENCE_KEYS))
    provider = (_str(attrs, "gen_ai.provider.name") or _str(attrs, "gen_ai.system") or _str(attrs, "llm.provider")
                or _str(attrs, "llm.system") or "unknown")
    # The model asked for; instrumentations that only record the answering model (OpenLLMetry's
    # OpenAI Agents spans) give that one, which is the same model unless the provider aliased it.
    model = _str(attrs, "gen_ai.request.model") or _str(attrs, "llm.model_name")
    if model in (None, "unknown"):
        model = _str(attrs, "gen_ai.response.model") or "unknown"
    request: dict[str, Any] | None = None
    if isinstance(messages, list):
        system = attrs if "gen_ai.system_instructions" in attrs else _details_event_attrs(span)
        request = {"provider": provider, "model": model, "messages": _with_system(messages, system)}
        tools = _tool_definitions(_json(attrs, "gen_ai.tool.definitions")) or _tool_definitions(
            [r.get("tool.json_schema") for r in _indexed(attrs, "llm.tools.")])
        if tools:
            request["tools"] = tools
        for attr, name in (("gen_ai.request.temperature", "temperature"), ("gen_ai.request.top_p", "topP"),
                           ("gen_ai.request.top_k", "topK"), ("gen_ai.request.max_tokens", "maxOutputTokens"),
                           ("gen_ai.request.seed", "seed")):
            value = attrs.get(attr)
            if isinstance(value, int | float) and not isinstance(value, bool):
                request[name] = value
        stop = attrs.get("gen_ai.request.stop_sequences")
        if isinstance(stop, list):
            request["stop"] = stop
    reasons = _finish_reasons(attrs, output)
    return Reading("llm", family, name=str(span.get("name") or ""), provider=provider, model=model,
                   request=request, output=output, finish_reasons=reasons, refusal=_refusal(output, reasons),
                   usage=_usage(attrs), conversation=conversation(attrs), node=_graph_node(attrs))


def _with_system(messages: list[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """The input messages led by ``gen_ai.system_instructions`` as a system message, unless one leads already.

    The GenAI conventions export the system prompt apart from the messages (Google ADK, pydantic-ai);
    it is part of what the model was asked, so a changed prompt must change the cache key.
    """
    value = _json(attrs, "gen_ai.system_instructions", strict=False)  # JSON parts, or plain text
    if isinstance(value, str) and value:
        parts: Any = [{"type": "text", "content": value}]
    elif isinstance(value, list) and value:
        parts = value
    elif value is None or value == [] or value == "":
        return messages
    else:
        raise Malformed("gen_ai.system_instructions", f"expected a list of parts, got {type(value).__name__}")
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
        return messages
    return [{"role": "system", "parts": parts}, *messages]


def _tool(span: Mapping[str, Any], attrs: Mapping[str, Any], family: str) -> Reading:
    name = (_str(attrs, "gen_ai.tool.name") or _str(attrs, "tool.name") or _str(attrs, "traceloop.entity.name")
            or str(span.get("name") or "tool"))
    if "gen_ai.tool.call.arguments" in attrs:
        args = _tool_args(attrs["gen_ai.tool.call.arguments"])
    elif "tool.parameters" in attrs and "input.value" not in attrs:
        args = _loose(attrs["tool.parameters"])
    else:
        args = _tool_args(attrs.get("input.value", attrs.get("traceloop.entity.input")))
    raw = attrs.get("gen_ai.tool.call.result", attrs.get("output.value", attrs.get("traceloop.entity.output")))
    result, named_call = _tool_result(raw)
    call_id = (_str(attrs, "gen_ai.tool.call.id") or _str(attrs, "tool_call.id") or _str(attrs, "tool.call_id")
               or _str(attrs, "tool.id") or named_call)
    # Inside a LangGraph graph a handoff tool is a tool like any other: the graph's own rule finds the handoff
    # (agentlog.core.otel._graph_handoffs), whichever tool or edge moved control.
    kind, target = _handoff_tool(name, args) if _graph_scope(attrs) is None else ("tool", None)
    return Reading(kind, family, name=name, call_id=call_id, args=args, result=result, target=target,
                   source=_str(attrs, "gen_ai.agent.name") if kind == "handoff" else None,
                   conversation=conversation(attrs), node=_graph_node(attrs))


def _handoff_tool(name: str, args: Any) -> tuple[str, str | None]:
    """(``"handoff"``, its target or None) for a tool call that hands control to another agent, else
    (``"tool"``, None): a tool of :data:`HANDOFF_TOOLS` (its target in its argument; without captured arguments
    the target is the next agent to start), or one named ``transfer_to_<agent>``. LlamaIndex's ``handoff`` is a
    common tool name, so it counts only when its argument names the agent."""
    if name in HANDOFF_TOOLS:
        target = args.get(HANDOFF_TOOLS[name]) if isinstance(args, dict) else None
        target = target if isinstance(target, str) and target else None
        if target is not None or name != "handoff":
            return "handoff", target
    if name.startswith(_TRANSFER_PREFIX) and len(name) > len(_TRANSFER_PREFIX):
        return "handoff", name[len(_TRANSFER_PREFIX):]
    return "tool", None


def _agent_name(attrs: Mapping[str, Any], name: str) -> str:
    """An agent span's agent: ``gen_ai.agent.name`` / ``agent.name``, else what the span name says of it (the GenAI
    conventions name the span ``invoke_agent <agent>``; OpenInference's instrumentors name a method's span
    ``<owner>.<method>``, and an agent's owner is the agent: smolagents' ``researcher.run``, AutoGen's
    ``triage.on_messages_stream``, CrewAI's ``supervisor._execute_core``)."""
    named = _str(attrs, "gen_ai.agent.name") or _str(attrs, "agent.name")
    if named:
        return named
    if name.startswith("invoke_agent "):
        return name[len("invoke_agent "):]
    owner, dot, _ = name.partition(".")
    return owner if dot and owner else name


def _adk_transfer(name: str, attrs: Mapping[str, Any], conv: str | None) -> Reading:
    """Google ADK's ``transfer_to_agent`` tool call: a handoff from the calling agent to ``agent_name``.

    The arguments (and so the target) are there only when content is captured; without them the
    handoff goes to the first agent that starts after it.
    """
    args = _tool_args(attrs.get("gen_ai.tool.call.arguments"))
    target = args.get("agent_name") if isinstance(args, dict) else None
    return Reading("handoff", "genai", name=name, target=target if isinstance(target, str) and target else None,
                   source=_str(attrs, "gen_ai.agent.name"), conversation=conv)


def _openinference(span: Mapping[str, Any], attrs: Mapping[str, Any], kind: str) -> Reading:
    conv, node = conversation(attrs), _graph_node(attrs)
    name = str(span.get("name") or "")
    if kind == "LLM":
        r = _llm(span, attrs, "openinference")
        if r.request is None and r.output is None and not r.usage and not r.finish_reasons:
            # OpenInference marks every method of an LLM class LLM (LlamaIndex's _prepare_chat_with_tools, the
            # wrapper around a streamed call): a span that records no messages, no tokens and no finish reason
            # is no model call.
            return Reading("step", "openinference", name=name, conversation=conv, node=node)
        return r
    if kind == "TOOL":
        # The OpenAI Agents instrumentation records a handoff as a TOOL span "handoff to <agent>"
        # with the two agents as input/output values (and no tool.name).
        if not attrs.get("tool.name") and name.startswith("handoff to "):
            source, target = attrs.get("input.value"), attrs.get("output.value") or name[len("handoff to "):]
            return Reading("handoff", "openinference", name=name, source=str(source) if source else None,
                           target=str(target), conversation=conv)
        return _tool(span, attrs, "openinference")
    if kind in ("AGENT", "CHAIN"):
        if not span.get("parentSpanId"):
            return Reading("workflow", "openinference", name=_agent_name(attrs, name) if kind == "AGENT" else name,
                           conversation=conv, node=node)
        if kind == "AGENT":
            return Reading("agent", "openinference", name=_agent_name(attrs, name), conversation=conv,
                           node=node, source=_str(attrs, "graph.node.parent_id"))
        return Reading("step", "openinference", name=name, conversation=conv, node=node, agent=_current_agent(attrs))
    return Reading("opaque", "openinference", name=name, conversation=conv)


def read_span(span: Mapping[str, Any]) -> Reading:
    """Classify a span and read what its family says about it.

    Where both families describe one span, the GenAI operation name decides what the span is:
    it names the operation (``chat``, ``execute_tool``), where OpenInference's kinds are coarser
    (its LangChain instrumentation puts ``llm.input_messages`` on every CHAIN span). Values are
    then read from the GenAI attributes first and from OpenInference's where GenAI has none.

    Raises:
        Malformed: an attribute the span's family defines is present but unreadable.
    """
    reading = _classify(span)
    scope = _graph_scope(span_attrs(span))
    return replace(reading, scope=scope) if scope else reading


def _classify(span: Mapping[str, Any]) -> Reading:
    attrs = span_attrs(span)
    op = attrs.get("gen_ai.operation.name")
    if op is not None and not isinstance(op, str):
        raise Malformed("gen_ai.operation.name", f"expected a string, got {type(op).__name__}")
    name = str(span.get("name") or "")
    conv, node = conversation(attrs), _graph_node(attrs)
    traceloop = attrs.get("traceloop.span.kind")
    if op == "invoke_agent":
        # OpenLLMetry's LangGraph root has a second invoke_agent inside it ("<graph>.workflow"): a step.
        kind = "step" if traceloop == "workflow" and span.get("parentSpanId") else "agent"
        return Reading(kind, "genai", name=_agent_name(attrs, name), conversation=conv, node=node)
    if op in _CHAT_OPS:
        return _llm(span, attrs, "genai")
    if op == "execute_tool":
        target = _str(attrs, "gen_ai.agent.handoff.target.name")
        if target:  # the proposed semconv handoff: an execute_tool transfer_to_<agent> span
            return Reading("handoff", "genai", name=name, target=target, conversation=conv,
                           source=_str(attrs, "gen_ai.agent.handoff.source.name") or _str(attrs, "gen_ai.agent.name"))
        if attrs.get("gen_ai.tool.type") == _ADK_TRANSFER:
            return _adk_transfer(name, attrs, conv)
        return _tool(span, attrs, "genai")
    if op == "handoff":
        return Reading("handoff", "genai", name=name, conversation=conv,
                       source=_str(attrs, "gen_ai.handoff.from_agent") or _str(attrs, "gen_ai.agent.name"),
                       target=_str(attrs, "gen_ai.handoff.to_agent"))
    if op == "goto":
        target = _str(attrs, "langgraph.command.goto_node")
        if target and target not in _END:
            return Reading("route", "genai", name=name, source=_str(attrs, "langgraph.command.source_node"),
                           target=target, conversation=conv)
        return Reading("opaque", "genai", name=name, conversation=conv)
    if op == "invoke_workflow":  # Google ADK's root span around a run of its agents
        return Reading("workflow" if not span.get("parentSpanId") else "step", "genai",
                       name=_str(attrs, "gen_ai.workflow.name") or name, conversation=conv, node=node)
    if op == "execute_task" or (op is None and traceloop == "task"):
        return Reading("step", "genai", name=_str(attrs, "gen_ai.task.name") or _str(attrs, "traceloop.entity.name")
                       or name, conversation=conv, node=node)
    if op is not None and op.startswith(("invoke_", "execute_")):
        # Another framework's own run or step (Strands' invoke_swarm root and execute_event_loop_cycle): what
        # runs an agent's work, not a definition (create_agent) nor an event we could misread.
        return Reading("workflow" if not span.get("parentSpanId") else "step", "genai", name=name,
                       conversation=conv, node=node)
    oi_kind = attrs.get("openinference.span.kind")
    if op is None and isinstance(oi_kind, str):
        return _openinference(span, attrs, oi_kind.upper())
    if op is None and traceloop == "workflow":
        name = _str(attrs, "traceloop.workflow.name") or name
        return Reading("workflow" if not span.get("parentSpanId") else "step", "genai", name=name,
                       conversation=conv, node=node)
    if op is None and traceloop == "agent":
        return Reading("agent", "genai", name=_str(attrs, "gen_ai.agent.name") or name, conversation=conv, node=node)
    if op is None and traceloop == "tool":
        return _tool(span, attrs, "genai")
    if op is None and (attrs.get("llm.request.type") in ("chat", "completion") or any(
            k.startswith("gen_ai.prompt.") for k in attrs)):
        return _llm(span, attrs, "genai")
    return Reading("opaque", "genai" if op else "", name=name, conversation=conv)
