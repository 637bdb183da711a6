"""The support desk (:mod:`tests.unit.replay.desk`) in the OpenAI Agents SDK, for the suite tests: offline scripted
models.

Triage hands off with the SDK's handoff tool (``transfer_to_refunds``); the handoff's ``on_invoke_handoff`` routes in
code (:func:`~tests.unit.replay.desk.route`) and the SDK tells the model where it went (``{"assistant": <agent>}``).
Programs: :data:`desk`, :data:`desk_prompt_v2`, :data:`desk_refund_v2`, :data:`desk_routing_v2`. Needs the SDK.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool, handoff
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from agentlog.replay.frameworks.openai_agents import ReplayModel, replay_tools
from agentlog.replay.recorder import Recorder
from tests.unit.replay import desk as d

MODEL = "scripted-gpt"


class Scripted(Model):
    """The desk's scripted model for one agent, reading the Responses-API input items."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        said = next(str(i.get("content")) for i in items if i.get("role") == "user")
        names = {i.get("call_id"): i.get("name") for i in items if i.get("type") == "function_call"}
        returned = [(str(names.get(i.get("call_id"))), str(i.get("output"))) for i in items
                    if i.get("type") == "function_call_output"]
        action = d.decide(self.agent, said, returned)
        item: Any
        if action.tool is not None:
            item = ResponseFunctionToolCall(type="function_call", id=f"fc-{action.call_id}", call_id=action.call_id,
                                            name=action.tool, arguments=json.dumps(action.args))
        else:
            item = ResponseOutputMessage(type="message", id="msg-1", role="assistant", status="completed",
                                         content=[ResponseOutputText(type="output_text", text=action.text,
                                                                     annotations=[])])
        tokens_in = 20 + 10 * len(returned)
        return ModelResponse(output=[item], usage=Usage(requests=1, input_tokens=tokens_in, output_tokens=6,
                                                        total_tokens=tokens_in + 6), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def desk_program(*, instructions: str = d.INSTRUCTIONS, refund_note: str = d.REFUND_NOTE,
                 escalate_from: int | None = None) -> Any:
    def program(recorder: Recorder) -> str:
        asked = recorder.input or {}

        def model(agent: str) -> ReplayModel:
            return ReplayModel(recorder, inner=Scripted(agent), node=agent, model_name=MODEL)

        @function_tool(name_override=d.LOOKUP)
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            return d.lookup_order(order_id)

        @function_tool(name_override=d.REFUND)
        def refund(order_id: str) -> str:
            """Refund an order."""
            return d.refund(order_id, refund_note)

        refunds = Agent(name=d.REFUNDS, instructions=d.REFUNDS_INSTRUCTIONS, model=model(d.REFUNDS),
                        tools=replay_tools(recorder, [refund]))
        escalation = Agent(name=d.ESCALATION, instructions=d.ESCALATION_INSTRUCTIONS, model=model(d.ESCALATION))
        desks = {d.REFUNDS: refunds, d.ESCALATION: escalation}

        async def routed(context: Any, arguments: str) -> Agent[Any]:
            return desks[d.route(str(asked.get("order")), escalate_from=escalate_from)]

        transfer = dataclasses.replace(handoff(refunds, tool_name_override=d.TRANSFER), on_invoke_handoff=routed)
        triage = Agent(name=d.TRIAGE, instructions=instructions, model=model(d.TRIAGE),
                       tools=replay_tools(recorder, [lookup_order]), handoffs=[transfer])
        result = asyncio.run(Runner.run(triage, str(asked.get("question", "")),
                                        run_config=RunConfig(tracing_disabled=True)))
        return str(result.final_output)

    return program


desk = desk_program()
desk_prompt_v2 = desk_program(instructions=d.INSTRUCTIONS_V2)
desk_refund_v2 = desk_program(refund_note=d.REFUND_NOTE_V2)
desk_routing_v2 = desk_program(escalate_from=d.ESCALATE_FROM)
