"""The calls one execution of an agent program makes, as the events of one run.

The framework adapters (:mod:`agentlog.replay.frameworks`) sit where a framework calls its model.
Each call goes through one :class:`Recorder`, which

* puts the request in cache-key shape (the adapter's one conversion per framework) and keys it
  with the recipe the SDK records (``Run.llm_request``: RFC 0041 §A, v2);
* answers it, by :data:`Mode`: ``live`` asks the wrapped model; ``recorded`` takes the result
  recorded for that key (:class:`agentlog.replay.mock.MockReplaySession` or the worker's results
  endpoint) and raises the miss diagnosis when there is none; ``what-if`` takes the recorded
  result where the key is unchanged and asks the wrapped model where it is not;
* records the call as the SDK does: ``agent.invocation.started {request, cacheKey, recipe}``, then
  ``agent.invocation.completed {cacheKey, envelope, usage?}`` or ``envelope.refusal``.

Envelopes are the model's output messages in the GenAI "parts" form
(``[{"role": "assistant", "parts": [...], "finish_reason"?}]``), what the worker records from an
OpenTelemetry span, so one shape serves every framework. A tool call is seen from the model's
side: the call in a response, its result in the next request (a ``tool_call_response`` part
answering that call id). The recorder then records ``agent.toolCalled`` and
``agent.toolReturned`` before the request that carries the result, so a tool that now returns
something else shows as a divergence at its own index, before the model call it changes.

Tools are answered by :data:`ToolMode`, through each framework's own tool interface (the adapters'
tool wrappers call :meth:`Recorder.tool`): ``run`` executes the tool; ``recorded`` returns the
``agent.toolReturned`` result of the matching recorded ``agent.toolCalled`` and does not execute it.
A tool call matches the recorded call of the same tool with the same arguments at the same node (the
lane: the node of the model call that asked for it), in order: the n-th such call gets the n-th
recorded result. The node and the arguments are read from the model's response that asked for the
call (by its call id, else by tool name and arguments), so they are the recording's own when the
model call was served. A call with no recorded match raises the miss diagnosis, as a model call does.

Nothing here does I/O: the events are kept in order (:attr:`Recorder.docs`, complete
RunEventDocs) and published, or compared, by the caller once the program has run
(:mod:`agentlog.replay.regression`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from agentlog.core.result_cache import ReplayCacheMiss
from agentlog.schemas.cachekey import RECIPE_IDS, cache_key
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import ReplayError
from agentlog.streams.publisher import rfc3339_ms, uuid7, uuid7_time_ms

__all__ = ["MODES", "TOOL_MODES", "Mode", "Recorder", "RecordedResults", "ToolMode", "answer_of", "delegating_tools",
           "recorded_input", "refusal_of"]

Mode = Literal["live", "recorded", "what-if"]
MODES: tuple[Mode, ...] = ("live", "recorded", "what-if")
#: How tool calls are answered: ``run`` executes the tool, ``recorded`` returns the recorded result.
ToolMode = Literal["run", "recorded"]
TOOL_MODES: tuple[ToolMode, ...] = ("run", "recorded")
#: The recipe every adapter keys with: the SDK's default (``Run.llm_request``).
RECIPE = "v2"


class RecordedResults(Protocol):
    """Where recorded results come from: a :class:`~agentlog.replay.mock.MockReplaySession` (store or file)
    or a :class:`~agentlog.replay.served.ServedResults` (a worker's results endpoint)."""

    def recorded_llm(self, node_id: str | None, attempt: int, cache_key: str,
                     request: dict[str, Any] | None = None) -> dict[str, Any]: ...

    def recorded_tool(self, node_id: str | None, attempt: int, tool: str, args: Any) -> Any: ...


def refusal_of(envelope: Any) -> str | None:
    """The refusal text when an envelope in parts form refused (a ``refusal`` part or a
    ``content_filter`` finish reason), else ``None``."""
    for message in envelope if isinstance(envelope, list) else []:
        if not isinstance(message, Mapping):
            continue
        for part in message.get("parts") or []:
            if isinstance(part, Mapping) and part.get("type") == "refusal":
                return str(part.get("content") or "refusal")
        if message.get("finish_reason") == "content_filter":
            return "content_filter"
    return None


def answer_of(envelope: list[dict[str, Any]], input_tokens: int = 0, output_tokens: int = 0) -> dict[str, Any]:
    """A model's answer (its output messages in parts form) as a recorder result: a refusal, or valid with its
    envelope and, when the model counted tokens, its usage."""
    reason = refusal_of(envelope)
    if reason is not None:
        return {"kind": "refusal", "reason": reason}
    result: dict[str, Any] = {"kind": "valid", "envelope": envelope}
    if input_tokens or output_tokens:
        result["usage"] = {"inputTokens": input_tokens, "outputTokens": output_tokens}
    return result


class Recorder:
    """One execution of an agent program: how its model calls are answered, and the run they make.

    ``bindings`` go into ``run.started`` (a replay keeps its source's, so it is judged as a
    historical replay; other bindings make it a ``what-if``); ``replay_of`` marks the run as a host
    replay (RFC 0041 §C). ``served`` and ``asked`` count the model calls answered from the recording
    and by the wrapped model; ``tools_served`` and ``tools_run`` the tool calls answered from the
    recording and by running the tool. ``missed`` is the first call the recording could not answer
    (kept here as well as raised, since a framework may wrap what a tool raises in its own error).
    """

    def __init__(self, run_id: str, *, mode: Mode = "live", tools: ToolMode = "run",
                 results: RecordedResults | None = None, bindings: Mapping[str, Any] | None = None,
                 replay_of: Mapping[str, Any] | None = None, input: Any = None,
                 delegating: Collection[str] = (), tags: Sequence[str] = ()) -> None:
        if mode not in MODES:
            raise ReplayError(f"replay mode must be one of {', '.join(MODES)}, not {mode!r}")
        if tools not in TOOL_MODES:
            raise ReplayError(f"tools must be one of {', '.join(TOOL_MODES)}, not {tools!r}")
        if (mode != "live" or tools == "recorded") and results is None:
            what = f"mode {mode!r}" if mode != "live" else "tools='recorded'"
            raise ReplayError(f"{what} answers calls from a recording: pass results")
        self.run_id = run_id
        self.mode: Mode = mode
        self.tools: ToolMode = tools
        #: Tools that hand the work to another agent (:func:`delegating_tools`): they run even with
        #: ``tools="recorded"``, so that the agent they delegate to runs again.
        self.delegating = frozenset(delegating)
        self.results = results
        self.docs: list[dict[str, Any]] = []
        self.served = 0
        self.asked = 0
        self.tools_served = 0
        self.tools_run = 0
        self.missed: ReplayCacheMiss | None = None
        self._asked_tools: dict[str, tuple[str | None, str, Any]] = {}  # call id → (node, tool, args)
        self._last_node: str | None = None  # the node of the last model call answered
        self._finished = False
        #: What the program is asked (``run.started`` ``payload.input``): a replay gets its recording's
        #: (:func:`recorded_input`), so one program replays every run of a suite with that run's own input.
        self.input = input
        payload: dict[str, Any] = {"bindings": dict(bindings or {})}
        if input is not None:
            payload["input"] = input
        if tags:
            payload["tags"] = list(tags)
        if replay_of is not None:
            payload["replayOf"] = dict(replay_of)
        self._emit("run.started", payload)

    # -- answering a call ------------------------------------------------------------------------------

    def answer(self, node: str | None, request: dict[str, Any],
               live: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
        """The result for one model call (``{"kind": "valid", "envelope", "usage"?}`` or
        ``{"kind": "refusal", "reason"}``), recorded; ``live()`` asks the wrapped model.

        Raises:
            ReplayCacheMiss: ``recorded`` mode and the recording has no result for this call.
        """
        key, found = self._begin(node, request)
        if found is None:
            found = self._live_result(live() if live is not None else None, key)
        return self._end(node, request, key, found)

    async def aanswer(self, node: str | None, request: dict[str, Any],
                      live: Callable[[], Awaitable[dict[str, Any]]] | None) -> dict[str, Any]:
        """:meth:`answer` for a wrapped model that is awaited."""
        key, found = self._begin(node, request)
        if found is None:
            found = self._live_result(await live() if live is not None else None, key)
        return self._end(node, request, key, found)

    def _begin(self, node: str | None, request: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        self._observe_tool_results(node, request)
        key = cache_key(request, RECIPE)
        if self.mode == "live" or self.results is None:
            return key, None
        try:
            found = self.results.recorded_llm(node, 0, key, request=request)
        except ReplayCacheMiss as e:
            if self.mode == "recorded":
                self._record_started(node, request, key)  # the run shows the call it could not answer
                self.missed = self.missed or e
                raise
            return key, None
        self.served += 1
        return key, found

    def _live_result(self, result: dict[str, Any] | None, key: str) -> dict[str, Any]:
        if result is None:
            raise ReplayError(f"no recorded result for the call with key {key[:12]}… and no model to ask: "
                              "give the adapter the model to ask (inner=…)")
        self.asked += 1
        return result

    def _end(self, node: str | None, request: dict[str, Any], key: str, result: dict[str, Any]) -> dict[str, Any]:
        started = self._record_started(node, request, key)
        if result.get("kind") == "refusal":
            payload: dict[str, Any] = {"cacheKey": key, "reason": str(result.get("reason") or "refusal")}
            self._emit("envelope.refusal", payload, node=node, caused_by=started)
        else:
            payload = {"cacheKey": key, "envelope": copy.deepcopy(result.get("envelope"))}
            if result.get("usage"):
                payload["usage"] = copy.deepcopy(result["usage"])
            self._emit("agent.invocation.completed", payload, node=node, caused_by=started)
            self._remember_tool_calls(node, result.get("envelope"))
        return result

    def _record_started(self, node: str | None, request: dict[str, Any], key: str) -> str:
        return self._emit("agent.invocation.started",
                          {"request": copy.deepcopy(request), "cacheKey": key, "recipe": RECIPE_IDS[RECIPE]},
                          node=node)

    # -- answering a tool call -------------------------------------------------------------------------

    def tool(self, tool: str, args: Any, run: Callable[[], Any], *, call_id: str | None = None) -> Any:
        """The result of one tool call: ``run()`` (the tool executed) or, with ``tools="recorded"``, the
        recorded result of the matching call. ``args`` as the framework hands them to the tool (a JSON
        string is read); ``call_id`` the id the model gave the call, when the framework tells it.

        Raises:
            ReplayCacheMiss: ``tools="recorded"`` and the recording has no matching call.
        """
        if self.tools == "run" or tool in self.delegating:
            self.tools_run += 1
            return run()
        return self._recorded_tool(tool, args, call_id)

    async def atool(self, tool: str, args: Any, run: Callable[[], Awaitable[Any]], *,
                    call_id: str | None = None) -> Any:
        """:meth:`tool` for a tool that is awaited."""
        if self.tools == "run" or tool in self.delegating:
            self.tools_run += 1
            return await run()
        return self._recorded_tool(tool, args, call_id)

    def _recorded_tool(self, tool: str, args: Any, call_id: str | None) -> Any:
        assert self.results is not None  # checked in __init__
        found = self._asked_call(tool, _parsed(args), call_id)
        if found is not None:
            call_id, (node, _, asked_args) = found
        else:  # a call no model response asked for: the program's own, in the lane of the last model call
            node, asked_args = self._last_node, _parsed(args)
        try:
            result = self.results.recorded_tool(node, 0, tool, asked_args)
        except ReplayCacheMiss as e:
            self.missed = self.missed or e
            # The run shows the call it could not answer.
            call_id = call_id or f"unanswered-{len(self.docs)}"
            self._asked_tools.pop(call_id, None)
            self._emit("agent.toolCalled", {"callId": call_id, "tool": tool, "args": asked_args}, node=node)
            raise
        self.tools_served += 1
        return result

    def _asked_call(self, tool: str, args: Any,
                    call_id: str | None) -> tuple[str, tuple[str | None, str, Any]] | None:
        """The model's request for this tool call, not answered yet: by its call id, else the first asked
        call of the same tool with the same arguments."""
        if call_id is not None and call_id in self._asked_tools and self._asked_tools[call_id][1] == tool:
            return call_id, self._asked_tools[call_id]
        wanted = jcs(args)
        return next(((cid, call) for cid, call in self._asked_tools.items()
                     if call[1] == tool and jcs(_parsed(call[2])) == wanted), None)

    # -- tools, seen from the model's side --------------------------------------------------------------

    def _remember_tool_calls(self, node: str | None, envelope: Any) -> None:
        self._last_node = node
        for message in envelope if isinstance(envelope, list) else []:
            for part in (message.get("parts") or []) if isinstance(message, Mapping) else []:
                if isinstance(part, Mapping) and part.get("type") == "tool_call" and isinstance(part.get("id"), str):
                    self._asked_tools[part["id"]] = (node, str(part.get("name") or "tool"), part.get("arguments"))

    def _observe_tool_results(self, node: str | None, request: Mapping[str, Any]) -> None:
        """Record the tool calls this request answers (once each, in the order the request lists them)."""
        for message in request.get("messages") or []:
            for part in (message.get("parts") or []) if isinstance(message, Mapping) else []:
                if not (isinstance(part, Mapping) and part.get("type") == "tool_call_response"):
                    continue
                call = self._asked_tools.pop(str(part.get("id")), None)
                if call is None:
                    continue  # answered before, or a call this execution did not see asked
                call_node, tool, args = call
                called = self._emit("agent.toolCalled", {"callId": str(part["id"]), "tool": tool, "args": args},
                                    node=call_node)
                result = part.get("response", part.get("result"))  # GenAI's name; pydantic-ai's
                self._emit("agent.toolReturned", {"callId": str(part["id"]), "result": result},
                           node=call_node, caused_by=called)

    # -- the run -------------------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None) -> None:
        """End the run: ``run.completed``, or ``run.failed`` naming ``error`` (its ``code`` when it has one)."""
        if self._finished:
            return
        self._finished = True
        if error is None:
            self._emit("run.completed", {"status": "completed"})
        else:
            code = getattr(error, "code", None) or type(error).__name__
            self._emit("run.failed", {"status": "failed",
                                      "error": {"code": str(code), "message": str(error)[:2000] or code}})

    def _emit(self, type: str, payload: dict[str, Any], *, node: str | None = None,
              caused_by: str | None = None) -> str:
        event_id = uuid7()
        doc: dict[str, Any] = {"eventId": event_id, "runId": self.run_id, "type": type, "payload": payload,
                               "timestamp": rfc3339_ms(uuid7_time_ms(event_id)), "sequence": len(self.docs)}
        if node is not None:
            doc["nodeId"] = node
        cause = caused_by or (self.docs[-1]["eventId"] if self.docs else None)
        if cause is not None:
            doc["causationId"] = cause
        self.docs.append(doc)
        return event_id


def delegating_tools(docs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The tools that delegated in a recorded run: between the model response that asked for a call of the tool and
    that call's result, a model call at another node ran (a sub-agent the tool invoked).

    Served from the recording, such a tool would skip its agent's whole run, so ``tools="recorded"`` runs it: the
    agent it delegates to runs again, its model calls answered as the mode says and its own tools as ``tools`` says.
    """
    asked_at: dict[str, tuple[int, str | None]] = {}  # call id → (index of the asking response, its node)
    found: set[str] = set()
    for i, doc in enumerate(docs):
        payload = doc.get("payload")
        if not isinstance(payload, Mapping):
            continue
        if doc.get("type") == "agent.invocation.completed":
            envelope = payload.get("envelope")
            for message in envelope if isinstance(envelope, list) else []:
                for part in (message.get("parts") or []) if isinstance(message, Mapping) else []:
                    if isinstance(part, Mapping) and part.get("type") == "tool_call" and isinstance(part.get("id"),
                                                                                                  str):
                        asked_at[part["id"]] = (i, doc.get("nodeId"))
        elif doc.get("type") == "agent.toolReturned" and payload.get("callId") in asked_at:
            start, node = asked_at.pop(payload["callId"])
            tool = next((d["payload"].get("tool") for d in docs[start:i] if d.get("type") == "agent.toolCalled"
                         and isinstance(d.get("payload"), Mapping)
                         and d["payload"].get("callId") == payload["callId"]), None)
            if tool is not None and any(d.get("type") == "agent.invocation.started" and d.get("nodeId") != node
                                        for d in docs[start + 1:i]):
                found.add(str(tool))
    return found


def recorded_input(docs: Iterable[Mapping[str, Any]]) -> tuple[Any, bool]:
    """What a recorded run was asked, and whether the run recorded it itself.

    A host records its run's input as ``run.started`` ``payload.input`` (any JSON value; it is content, sealed
    like the rest). A run without one was asked its first LLM request's first user message: its text (the
    string, or its text parts joined by newlines), or None when it has none. The second value is True only for
    ``payload.input``, which a replay records again so that its ``run.started`` stays the recording's.
    """
    first_request: Mapping[str, Any] | None = None
    for doc in docs:
        payload = doc.get("payload")
        if not isinstance(payload, Mapping):
            continue
        if doc.get("type") == "run.started" and "input" in payload:
            return payload["input"], True
        if doc.get("type") == "agent.invocation.started" and first_request is None:
            request = payload.get("request")
            first_request = request if isinstance(request, Mapping) else None
    messages = first_request.get("messages") if first_request is not None else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _text_of(message), False
    return None, False


def _text_of(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = message.get("parts") if content is None else content
    texts = [str(p.get("content") if "content" in p else p.get("text")) for p in parts or []
             if isinstance(p, Mapping) and p.get("type") == "text"] if isinstance(parts, list) else []
    return "\n".join(texts) if texts else None


def _parsed(args: Any) -> Any:
    """Tool arguments as a value: a JSON string (as some frameworks hand them to the tool) is read."""
    if isinstance(args, str):
        try:
            return json.loads(args) if args else {}
        except ValueError:
            return args
    return args
