"""LangChain / LangGraph: ``ReplayChatModel``, a ``BaseChatModel`` answered through a :class:`Recorder`.

The recorder is the one a program is given (``program(recorder)``, run by :func:`agentlog.record` or
:func:`agentlog.replay_test`). Give ``ReplayChatModel(recorder=recorder, inner=model, model_name=...)`` to
the graph where the program's chat model goes (``create_react_agent(model, …)``, a node's
``model.invoke``): ``inner`` is the chat model the graph would use (``ChatOpenAI(...)``, any
``BaseChatModel``), asked when the run is recorded (:func:`agentlog.record` runs ``live``; without ``inner`` a
call there fails with "no model to ask") and in ``live`` / ``what-if`` replays, never in a ``recorded`` one;
``model_name`` and ``provider`` are what each call's cache key names, so give the same ones when recording and
replaying. Its node is ``node`` when given, else the LangGraph node the call runs in (``langgraph_node`` in the
run's metadata), so a recording and its replay name the same nodes.

Tools go through LangGraph's ``ToolNode`` tool-call interceptor (``wrap_tool_call`` /
``awrap_tool_call``), with the wrappers from this module: :class:`ReplayToolCalls` runs each call
(``execute``) or, with ``tools="recorded"``, answers it with a ``ToolMessage`` carrying the recorded result
without running the tool. :func:`replay_tool_node` builds the ``ToolNode`` with it, to give
``create_react_agent`` (or a graph) in place of the list of tools.

The one conversion between LangChain and the cache-key shape is here: :func:`request_of`
(messages and bound tools → the GenAI parts form the worker records from spans), :func:`envelope_of`
(an ``AIMessage`` → an output message; ``additional_kwargs["refusal"]`` or a ``content_filter``
finish reason → a refusal) and :func:`response_of` (back to an ``AIMessage``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from agentlog.replay.recorder import Recorder, refusal_of

__all__ = ["ReplayChatModel", "ReplayToolCalls", "envelope_of", "replay_tool_node", "request_of", "response_of"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def _text(content: Any) -> Any:
    """A message's content as the text it carries (content blocks joined), or as it is when not text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
                                         for b in content):
        return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content)
    return content


def _message(message: BaseMessage) -> dict[str, Any]:
    role = _ROLES.get(message.type, message.type)
    if isinstance(message, ToolMessage):
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": message.tool_call_id,
                                           "response": _text(message.content)}]}
    parts: list[dict[str, Any]] = []
    text = _text(message.content)
    if text not in ("", None, []):
        parts.append({"type": "text", "content": text})
    if isinstance(message, AIMessage):
        parts.extend({"type": "tool_call", "id": call.get("id"), "name": call["name"], "arguments": call["args"]}
                     for call in message.tool_calls)
    return {"role": role, "parts": parts}


def _tool(tool: Any) -> dict[str, Any]:
    spec = tool if isinstance(tool, dict) and tool.get("type") == "function" else convert_to_openai_tool(tool)
    fn = spec.get("function", spec)
    out = {"type": "function", "name": fn["name"]}
    out.update({k: fn[k] for k in ("description", "parameters") if fn.get(k) is not None})
    return out


def request_of(messages: Sequence[BaseMessage], *, provider: str, model: str, tools: Sequence[Any] = (),
               stop: Sequence[str] | None = None) -> dict[str, Any]:
    """A chat model call in cache-key shape (``{provider, model, messages, tools?, stop?}``)."""
    request: dict[str, Any] = {"provider": provider, "model": model, "messages": [_message(m) for m in messages]}
    if tools:
        request["tools"] = [_tool(t) for t in tools]
    if stop:
        request["stop"] = list(stop)
    return request


def envelope_of(message: BaseMessage) -> dict[str, Any]:
    """A model's answer as a recorder result: valid (its output message, usage) or a refusal."""
    out = _message(message)
    refusal = message.additional_kwargs.get("refusal")
    if refusal:
        out["parts"].append({"type": "refusal", "content": str(refusal)})
    finish = (message.response_metadata or {}).get("finish_reason")
    if finish:
        out["finish_reason"] = str(finish)
    envelope = [out]
    reason = refusal_of(envelope)
    if reason is not None:
        return {"kind": "refusal", "reason": reason, "envelope": envelope}
    result: dict[str, Any] = {"kind": "valid", "envelope": envelope}
    usage = getattr(message, "usage_metadata", None)
    if usage:
        result["usage"] = {"inputTokens": usage["input_tokens"], "outputTokens": usage["output_tokens"]}
    return result


def response_of(result: dict[str, Any], *, model: str) -> AIMessage:
    """The ``AIMessage`` a recorded result stands for."""
    if result.get("kind") == "refusal":
        reason = str(result.get("reason") or "refusal")
        return AIMessage(content="", additional_kwargs={"refusal": reason},
                         response_metadata={"model_name": model, "finish_reason": "content_filter"})
    envelope = result.get("envelope")
    message = envelope[0] if isinstance(envelope, list) and envelope else {"parts": []}
    text = "".join(str(p.get("content", "")) for p in message.get("parts", []) if p.get("type") == "text")
    calls = [{"name": p["name"], "args": p.get("arguments") if isinstance(p.get("arguments"), dict)
              else json.loads(p.get("arguments") or "{}"), "id": p.get("id"), "type": "tool_call"}
             for p in message.get("parts", []) if p.get("type") == "tool_call"]
    meta: dict[str, Any] = {"model_name": model}
    if message.get("finish_reason"):
        meta["finish_reason"] = message["finish_reason"]
    usage = result.get("usage") or {}
    usage_metadata: Any = None
    if "inputTokens" in usage and "outputTokens" in usage:
        usage_metadata = {"input_tokens": usage["inputTokens"], "output_tokens": usage["outputTokens"],
                          "total_tokens": usage["inputTokens"] + usage["outputTokens"]}
    return AIMessage(content=text, tool_calls=calls, usage_metadata=usage_metadata, response_metadata=meta)


class ReplayChatModel(BaseChatModel):
    """A chat model whose calls go through ``recorder``; ``inner`` is the model asked live (``live`` and
    ``what-if`` modes). ``model_name`` and ``provider`` are what the cache key names."""

    recorder: Any
    inner: Any = None
    node: str | None = None
    model_name: str = "unknown"
    provider: str = "langchain"

    @property
    def _llm_type(self) -> str:
        return "agentlog-replay"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        """As provider chat models do: the tools in OpenAI's function format."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _node(self, run_manager: Any) -> str | None:
        if self.node is not None:
            return self.node
        node = (getattr(run_manager, "metadata", None) or {}).get("langgraph_node")
        return str(node) if node else None

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        request = request_of(messages, provider=self.provider, model=self.model_name, tools=kwargs.get("tools", ()),
                             stop=stop)

        def live() -> dict[str, Any]:
            return envelope_of(self._inner().invoke(messages, stop=stop, **kwargs))

        result = self.recorder.answer(self._node(run_manager), request, live if self.inner is not None else None)
        return ChatResult(generations=[ChatGeneration(message=response_of(result, model=self.model_name))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        request = request_of(messages, provider=self.provider, model=self.model_name, tools=kwargs.get("tools", ()),
                             stop=stop)

        async def live() -> dict[str, Any]:
            return envelope_of(await self._inner().ainvoke(messages, stop=stop, **kwargs))

        result = await self.recorder.aanswer(self._node(run_manager), request,
                                             live if self.inner is not None else None)
        return ChatResult(generations=[ChatGeneration(message=response_of(result, model=self.model_name))])

    def _inner(self) -> BaseChatModel:
        inner: BaseChatModel = self.inner
        return inner


class ReplayToolCalls:
    """A ``ToolNode``'s tool calls answered through ``recorder``: run (``tools="run"``), or a ``ToolMessage``
    with the recorded result of the matching call, the tool not run (``tools="recorded"``). Give
    :meth:`wrap_tool_call` and :meth:`awrap_tool_call` to ``ToolNode(..., wrap_tool_call=…, awrap_tool_call=…)``."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def wrap_tool_call(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        call = request.tool_call
        if self.recorder.tools == "run":
            return self.recorder.tool(call["name"], call["args"], lambda: execute(request), call_id=call.get("id"))
        return self._served(call)

    async def awrap_tool_call(self, request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        call = request.tool_call
        if self.recorder.tools == "run":
            return await self.recorder.atool(call["name"], call["args"], lambda: execute(request),
                                             call_id=call.get("id"))
        return self._served(call)

    def _served(self, call: Any) -> ToolMessage:
        """The call answered from the recording (the recorder does not run the tool in this mode)."""
        result = self.recorder.tool(call["name"], call["args"], _not_run, call_id=call.get("id"))
        content = result if isinstance(result, (str, list)) else json.dumps(result, ensure_ascii=False)
        return ToolMessage(content=content, name=call["name"], tool_call_id=call.get("id") or "")


def _not_run() -> Any:
    raise AssertionError("a tool answered from the recording is not run")


def replay_tool_node(recorder: Recorder, tools: Sequence[Any], **options: Any) -> Any:
    """A LangGraph ``ToolNode`` over ``tools`` whose calls go through ``recorder`` (:class:`ReplayToolCalls`);
    ``options`` are the ``ToolNode``'s own (``name``, ``handle_tool_errors``, …)."""
    from langgraph.prebuilt import ToolNode

    calls = ReplayToolCalls(recorder)
    return ToolNode(tools, wrap_tool_call=calls.wrap_tool_call, awrap_tool_call=calls.awrap_tool_call, **options)
