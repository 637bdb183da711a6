"""OpenAI Agents SDK: ``ReplayModel`` (a ``Model``) and ``ReplayModelProvider`` answered through a :class:`Recorder`.

The recorder is the one a program is given (``program(recorder)``, run by :func:`agentlog.record` or
:func:`agentlog.replay_test`). Per agent, ``Agent(..., model=ReplayModel(recorder, inner=model,
node=agent_name, model_name=...))``: ``inner`` is the SDK ``Model`` the agent would use
(``OpenAIResponsesModel(...)``, or any ``Model``), asked when the run is recorded (:func:`agentlog.record`
runs ``live``; without ``inner`` a call there fails with "no model to ask") and in ``live`` / ``what-if``
replays, never in a ``recorded`` one; ``model_name`` and ``provider`` are what each call's cache key names
(``inner`` does not tell them), so give the same ones when recording and replaying. The node is the agent,
as in a run the worker records from the SDK's spans. For a program that names its models by string,
``RunConfig(model_provider=ReplayModelProvider(recorder, inner=provider))`` answers every agent's calls,
``inner`` being the ``ModelProvider`` that makes the live models (``OpenAIProvider()``); their node is then
the model name: the provider is not told the agent. Handoffs need nothing more: the agent handed to has its
own ``ReplayModel`` over the same recorder.

The agent's tools go through :func:`replay_tools`, from this module (``Agent(..., tools=replay_tools(recorder,
[lookup]))``): each ``FunctionTool`` is copied with an ``on_invoke_tool`` (the SDK's own tool interface: the
tool context and the model's arguments as a JSON string) that runs the tool or, with ``tools="recorded"``,
returns the recorded result without running it. Hosted tools and handoffs are left as they are.

The one conversion between the SDK and the cache-key shape is here: :func:`request_of` (system
instructions, the Responses-API input items, the tools and handoffs as function tools → the GenAI
parts form), :func:`envelope_of` (the output items → an output message; a ``refusal`` content part
is a refusal) and :func:`response_of` (back to output items).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agents import FunctionTool, ModelResponse, Usage
from agents.models.interface import Model, ModelProvider
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
)

from agentlog.replay.recorder import Recorder, answer_of

__all__ = ["ReplayModel", "ReplayModelProvider", "envelope_of", "replay_tools", "request_of", "response_of"]

_SETTINGS = {"temperature": "temperature", "top_p": "topP", "max_tokens": "maxOutputTokens"}


def _plain(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    dumped: dict[str, Any] = item.model_dump(exclude_unset=True)
    return dumped


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[dict[str, Any]] = []
    for block in content or []:
        block = _plain(block)
        if block.get("type") in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "content": block.get("text", "")})
        elif block.get("type") == "refusal":
            parts.append({"type": "refusal", "content": block.get("refusal", "")})
        else:
            parts.append({"type": str(block.get("type")), "content": block})
    return parts


def _message(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type")
    if kind == "function_call":
        return {"role": "assistant", "parts": [{"type": "tool_call", "id": item.get("call_id"),
                                                "name": item.get("name"),
                                                "arguments": _arguments(item.get("arguments"))}]}
    if kind == "function_call_output":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": item.get("call_id"),
                                           "response": item.get("output")}]}
    if "role" in item:
        return {"role": str(item["role"]), "parts": _content_parts(item.get("content"))}
    return {"role": "user", "parts": [{"type": str(kind), "content": item}]}


def _tool(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "name": name}
    if description:
        out["description"] = description
    if parameters is not None:
        out["parameters"] = parameters
    return out


def request_of(system_instructions: str | None, input: str | Sequence[Any], model_settings: Any,
               tools: Sequence[Any], output_schema: Any, handoffs: Sequence[Any], *, provider: str,
               model: str) -> dict[str, Any]:
    """A model call in cache-key shape (``{provider, model, messages, tools?, responseFormat?, …}``)."""
    messages: list[dict[str, Any]] = []
    if system_instructions:
        messages.append({"role": "system", "parts": [{"type": "text", "content": system_instructions}]})
    items = [{"role": "user", "content": input}] if isinstance(input, str) else [_plain(i) for i in input]
    messages.extend(_message(i) for i in items)
    request: dict[str, Any] = {"provider": provider, "model": model, "messages": messages}
    specs = [_tool(t.name, getattr(t, "description", None), getattr(t, "params_json_schema", None))
             for t in tools] + [_tool(h.tool_name, h.tool_description, h.input_json_schema) for h in handoffs]
    if specs:
        request["tools"] = specs
    if output_schema is not None and not output_schema.is_plain_text():
        request["responseFormat"] = {"type": "json_schema", "schema": output_schema.json_schema()}
    for name, field in _SETTINGS.items():
        value = getattr(model_settings, name, None)
        if value is not None:
            request[field] = value
    return request


def envelope_of(response: ModelResponse) -> dict[str, Any]:
    """A model's answer as a recorder result: valid (its output message, usage) or a refusal."""
    parts: list[dict[str, Any]] = []
    for item in response.output:
        plain = _plain(item)
        if plain.get("type") == "message":
            parts.extend(_content_parts(plain.get("content")))
        elif plain.get("type") == "function_call":
            parts.extend(_message(plain)["parts"])
        else:
            parts.append({"type": str(plain.get("type")), "content": plain})
    return answer_of([{"role": "assistant", "parts": parts}], response.usage.input_tokens,
                     response.usage.output_tokens)


def response_of(result: dict[str, Any]) -> ModelResponse:
    """The ``ModelResponse`` a recorded result stands for."""
    output: list[Any] = []
    if result.get("kind") == "refusal":
        output.append(ResponseOutputMessage(
            type="message", id="msg_replay", role="assistant", status="completed",
            content=[ResponseOutputRefusal(type="refusal", refusal=str(result.get("reason") or "refusal"))]))
    envelope = result.get("envelope") if result.get("kind") != "refusal" else None
    message = envelope[0] if isinstance(envelope, list) and envelope else {"parts": []}
    texts: list[ResponseOutputText | ResponseOutputRefusal] = [
        ResponseOutputText(type="output_text", text=str(p.get("content", "")), annotations=[])
        for p in message.get("parts", []) if p.get("type") == "text"]
    if texts:
        output.append(ResponseOutputMessage(type="message", id="msg_replay", role="assistant", status="completed",
                                            content=texts))
    for i, part in enumerate(p for p in message.get("parts", []) if p.get("type") == "tool_call"):
        args = part.get("arguments")
        output.append(ResponseFunctionToolCall(
            type="function_call", id=f"fc_replay_{i}", call_id=str(part.get("id")), name=str(part.get("name")),
            arguments=args if isinstance(args, str) else json.dumps(args)))
    usage = result.get("usage") or {}
    tokens_in, tokens_out = int(usage.get("inputTokens", 0)), int(usage.get("outputTokens", 0))
    return ModelResponse(output=output, usage=Usage(requests=1, input_tokens=tokens_in, output_tokens=tokens_out,
                                                    total_tokens=tokens_in + tokens_out), response_id=None)


class ReplayModel(Model):
    """An Agents SDK model whose calls go through ``recorder``; ``inner`` is asked live (``live`` and
    ``what-if`` modes). ``node`` names the calls in the run (the agent); ``model_name`` and
    ``provider`` are what the cache key names."""

    def __init__(self, recorder: Recorder, *, inner: Model | None = None, node: str | None = None,
                 model_name: str = "unknown", provider: str = "openai") -> None:
        self.recorder = recorder
        self.inner = inner
        self.node = node
        self.model_name = model_name
        self.provider = provider

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        request = request_of(system_instructions, input, model_settings, tools, output_schema, handoffs,
                             provider=self.provider, model=self.model_name)
        inner = self.inner

        async def live() -> dict[str, Any]:
            assert inner is not None
            return envelope_of(await inner.get_response(system_instructions, input, model_settings, tools,
                                                        output_schema, handoffs, tracing, **kwargs))

        result = await self.recorder.aanswer(self.node, request, live if inner is not None else None)
        return response_of(result)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("replay answers whole responses; run the agent with Runner.run, not run_streamed")


class ReplayModelProvider(ModelProvider):
    """Every model the SDK looks up by name, answered through ``recorder`` (``inner`` provides the live ones)."""

    def __init__(self, recorder: Recorder, *, inner: ModelProvider | None = None, provider: str = "openai") -> None:
        self.recorder = recorder
        self.inner = inner
        self.provider = provider

    def get_model(self, model_name: str | None) -> Model:
        name = model_name or "default"
        return ReplayModel(self.recorder, inner=self.inner.get_model(model_name) if self.inner else None,
                           node=name, model_name=name, provider=self.provider)


def replay_tools(recorder: Recorder, tools: Sequence[Any]) -> list[Any]:
    """``tools`` with each ``FunctionTool`` answered through ``recorder``: run (``tools="run"``), or the
    recorded result of the matching call returned without running the tool (``tools="recorded"``)."""
    return [_replay_tool(recorder, tool) if isinstance(tool, FunctionTool) else tool for tool in tools]


def _replay_tool(recorder: Recorder, tool: FunctionTool) -> FunctionTool:
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        async def run() -> Any:
            return await invoke(ctx, arguments)

        return await recorder.atool(tool.name, arguments, run, call_id=ctx.tool_call_id)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
