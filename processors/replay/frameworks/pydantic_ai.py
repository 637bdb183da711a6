"""pydantic-ai: ``ReplayModel``, a pydantic-ai ``Model``, and ``ReplayTools``, answered through a :class:`Recorder`.

The recorder is the one a program is given (``program(recorder)``, run by :func:`agentlog.record` or
:func:`agentlog.replay_test`). Each agent's model becomes a ``ReplayModel`` over it, ``inner`` being the
model the agent would use (``OpenAIChatModel("gpt-5")``; offline, a ``FunctionModel`` or ``TestModel``)
and ``node`` the agent's name::

    planner = Agent(ReplayModel(recorder, inner=OpenAIChatModel("gpt-5"), node="planner"),
                    capabilities=[ReplayTools(recorder)])

``inner`` is asked when the run is recorded (:func:`agentlog.record` runs ``live``; without ``inner`` a
call there fails with "no model to ask") and in ``live`` / ``what-if`` replays; a ``recorded`` replay
never asks it, but keep it in the program: its ``model_name`` and ``system`` are in each call's cache
key (or give ``model_name=`` and ``provider=``). Without touching the program,
``with agent.override(model=ReplayModel(...)):`` does the same. An agent that delegates to another
through a tool records both in one run: each agent its own ``ReplayModel`` over the one recorder, each
at its node; the sub-agent's calls come after the response that asked for the tool and before that
call's ``agent.toolCalled`` / ``agent.toolReturned`` (recorded, as every tool call, when its result
reaches the delegating agent's next request). The README's "Replaying runs as
regression tests" has the whole program: a planner that looks an order up and delegates the reply to
a writer agent, recorded with ``FunctionModel`` and replayed.

The tools go through ``ReplayTools``, from this module: a pydantic-ai capability
(``Agent(..., capabilities=[ReplayTools(recorder)])`` or ``agent.run(..., capabilities=[...])``) whose
``wrap_tool_execute`` hook runs each function tool, or answers it from the recording without running it
(``tools="recorded"``). Output tools are not tool calls to pydantic-ai's hooks, nor to the recording.

The one conversion between pydantic-ai and the cache-key shape is here. Messages go through
pydantic-ai's own OpenTelemetry conversion (``InstrumentationSettings.messages_to_otel_messages``),
the very ``gen_ai.input.messages`` an instrumented agent exports, so a call keys the same whether it
was recorded by this adapter or by the worker from the agent's spans; the request's instructions
(exported apart, as ``gen_ai.system_instructions``) lead as a system message, so a changed prompt
changes the key. A ``content_filter`` finish reason is a refusal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapToolExecuteHandler
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.usage import RequestUsage

from agentlog.replay.recorder import Recorder, answer_of

__all__ = ["ReplayModel", "ReplayTools", "envelope_of", "request_of", "response_of"]

#: Content included, as an instrumented agent records it for the worker.
_OTEL = InstrumentationSettings(include_content=True)
#: pydantic-ai's model settings → the cache-key request's sampling fields (RFC 0041 §A, v2).
_SETTINGS = {"temperature": "temperature", "top_p": "topP", "max_tokens": "maxOutputTokens", "seed": "seed"}


def request_of(messages: list[ModelMessage], settings: ModelSettings | None, parameters: ModelRequestParameters,
               *, provider: str, model: str) -> dict[str, Any]:
    """A model request in cache-key shape (``{provider, model, messages, tools?, temperature?, …}``)."""
    otel: list[Any] = list(_OTEL.messages_to_otel_messages(messages))
    instructions = next((m.instructions for m in reversed(messages) if isinstance(m, ModelRequest)), None)
    if instructions:
        otel.insert(0, {"role": "system", "parts": [{"type": "text", "content": instructions}]})
    request: dict[str, Any] = {"provider": provider, "model": model, "messages": json.loads(json.dumps(otel))}
    tools = [*parameters.function_tools, *parameters.output_tools]
    if tools:
        request["tools"] = [{"type": "function", "name": t.name,
                             **({"description": t.description} if t.description else {}),
                             "parameters": t.parameters_json_schema} for t in tools]
    for name, field in _SETTINGS.items():
        value = (settings or {}).get(name)
        if value is not None:
            request[field] = value
    stop = (settings or {}).get("stop_sequences")
    if stop:
        request["stop"] = list(stop)
    return request


def envelope_of(response: ModelResponse) -> dict[str, Any]:
    """A model's answer as a recorder result: valid (its output message, usage) or a refusal."""
    envelope = json.loads(json.dumps(_OTEL.messages_to_otel_messages([response])))
    return answer_of(envelope, response.usage.input_tokens, response.usage.output_tokens)


def response_of(result: dict[str, Any], *, model: str, provider: str) -> ModelResponse:
    """The ``ModelResponse`` a recorded result stands for."""
    if result.get("kind") == "refusal":
        return ModelResponse(parts=[TextPart(str(result.get("reason") or "refusal"))], model_name=model,
                             provider_name=provider, finish_reason="content_filter")
    envelope = result.get("envelope")
    message = envelope[0] if isinstance(envelope, list) and envelope else {"parts": []}
    parts: list[Any] = []
    for part in message.get("parts", []):
        if part.get("type") == "text":
            parts.append(TextPart(str(part.get("content", ""))))
        elif part.get("type") == "tool_call":
            parts.append(ToolCallPart(part["name"], part.get("arguments"), part.get("id")))
    usage = result.get("usage") or {}
    return ModelResponse(parts=parts, model_name=model, provider_name=provider,
                         usage=RequestUsage(input_tokens=usage.get("inputTokens", 0),
                                            output_tokens=usage.get("outputTokens", 0)),
                         finish_reason=message.get("finish_reason"))


class ReplayModel(Model):
    """A pydantic-ai model whose calls go through ``recorder``; ``inner`` is asked live (``live`` and
    ``what-if`` modes). ``node`` names the calls in the run (the agent, usually)."""

    def __init__(self, recorder: Recorder, *, inner: Model | None = None, node: str | None = None,
                 model_name: str | None = None, provider: str | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.inner = inner
        self.node = node
        self._model_name = model_name or (inner.model_name if inner is not None else "unknown")
        self._system = provider or (inner.system if inner is not None else "unknown")

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def system(self) -> str:
        return self._system

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        request = request_of(messages, model_settings, model_request_parameters, provider=self.system,
                             model=self.model_name)
        inner = self.inner

        async def live() -> dict[str, Any]:
            assert inner is not None
            return envelope_of(await inner.request(messages, model_settings, model_request_parameters))

        result = await self.recorder.aanswer(self.node, request, live if inner is not None else None)
        return response_of(result, model=self.model_name, provider=self.system)


@dataclass
class ReplayTools(AbstractCapability[Any]):
    """The agent's function tools answered through ``recorder``: run (``tools="run"``), or the recorded
    result of the matching call returned without running the tool (``tools="recorded"``)."""

    recorder: Recorder

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
                                args: ValidatedToolArgs, handler: WrapToolExecuteHandler) -> Any:
        async def run() -> Any:
            return await handler(args)

        return await self.recorder.atool(call.tool_name, call.args_as_dict(), run, call_id=call.tool_call_id)
