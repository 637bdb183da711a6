"""A two-agent pydantic-ai program for the replay tests: the README's planner and writer, offline.

The planner looks an order up with a tool and delegates the reply to a writer agent through another
tool. Its scripted models give their tool calls no id, so pydantic-ai mints a random one per call, as
it does for a real model: two live runs of the program differ in every tool-call id (in the response
envelopes, the tool events and the later requests' messages) and in nothing else. With
``structured_writer`` the writer answers through pydantic-ai's output tool, whose call id appears in
its response envelope only (no tool events name it).

``agentlog replay-test --program tests.unit.replay.two_agents:<name>`` uses :data:`support` (as
recorded) and :data:`support_prompt_v2` (the planner's prompt changed). Needs pydantic-ai (import this
module after ``pytest.importorskip("pydantic_ai")``); pydantic-ai reads the tools' annotations from the
module, so its names are imported here and not inside the program.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentlog.replay.frameworks.pydantic_ai import ReplayModel, ReplayTools
from agentlog.replay.recorder import Recorder

PLANNER_INSTRUCTIONS = "Answer the customer."
PROMPT_V2 = "Answer the customer briefly."
ORDER = "blue kettle, 39 EUR, delivered on 3 May"
REPLY = "Your blue kettle was delivered on 3 May."


class Reply(BaseModel):
    """The structured writer's answer."""

    text: str


def support_program(*, planner_instructions: str = PLANNER_INSTRUCTIONS, structured_writer: bool = False) -> Any:
    """The program (``program(recorder)``), its planner under ``planner_instructions``."""

    def program(recorder: Recorder) -> str:
        def planner_llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            returned = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
            if "lookup_order" not in returned:
                return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "42"})])
            if "write_reply" not in returned:
                return ModelResponse(parts=[ToolCallPart("write_reply", {"facts": returned["lookup_order"]})])
            return ModelResponse(parts=[TextPart(str(returned["write_reply"]))])

        def writer_llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            if structured_writer:
                return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"text": REPLY})])
            return ModelResponse(parts=[TextPart(REPLY)])

        writer: Agent[None, Any] = Agent(ReplayModel(recorder, inner=FunctionModel(writer_llm), node="writer"),
                                         name="writer", instructions="Word a short, friendly reply.",
                                         output_type=Reply if structured_writer else str)
        planner = Agent(ReplayModel(recorder, inner=FunctionModel(planner_llm), node="planner"),
                        name="planner", instructions=planner_instructions, capabilities=[ReplayTools(recorder)])

        @planner.tool_plain
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            return ORDER

        @planner.tool
        async def write_reply(ctx: RunContext[None], facts: str) -> str:
            """Have the writer agent word the reply."""
            output = (await writer.run(f"Reply to the customer: {facts}", usage=ctx.usage)).output
            return output.text if structured_writer else str(output)

        return planner.run_sync("Where is my order 42?").output

    return program


#: The program as recorded, and with the planner's prompt changed, for ``--program``.
support = support_program()
support_prompt_v2 = support_program(planner_instructions=PROMPT_V2)
