"""The support desk (:mod:`tests.unit.replay.desk`) in pydantic-ai, for the suite tests: offline scripted models.

Triage's ``transfer_to_refunds`` tool routes in code (:func:`~tests.unit.replay.desk.route`) and says where it
sent the customer; the program then hands the question to that agent (pydantic-ai's programmatic hand-off).
Programs: :data:`desk`, :data:`desk_prompt_v2`, :data:`desk_refund_v2`, :data:`desk_routing_v2`. Needs pydantic-ai.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from agentlog.replay.frameworks.pydantic_ai import ReplayModel, ReplayTools
from agentlog.replay.recorder import Recorder
from tests.unit.replay import desk as d


def desk_program(*, instructions: str = d.INSTRUCTIONS, refund_note: str = d.REFUND_NOTE,
                 escalate_from: int | None = None) -> Any:
    def program(recorder: Recorder) -> str:
        asked = recorder.input or {}
        question = str(asked.get("question", ""))

        def scripted(agent: str) -> FunctionModel:
            def llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                said = next(str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart))
                returned = [(p.tool_name, str(p.content)) for m in messages for p in m.parts
                            if isinstance(p, ToolReturnPart)]
                action = d.decide(agent, said, returned)
                usage = RequestUsage(input_tokens=20 + 10 * len(returned), output_tokens=6)
                if action.tool is not None:
                    return ModelResponse(parts=[ToolCallPart(action.tool, action.args, tool_call_id=action.call_id)],
                                         usage=usage)
                return ModelResponse(parts=[TextPart(action.text)], usage=usage)

            return FunctionModel(llm, model_name=f"scripted-{agent}")

        def agent(name: str, told: str) -> Agent[None, str]:
            return Agent(ReplayModel(recorder, inner=scripted(name), node=name), name=name, instructions=told,
                         capabilities=[ReplayTools(recorder)])

        triage, refunds = agent(d.TRIAGE, instructions), agent(d.REFUNDS, d.REFUNDS_INSTRUCTIONS)
        escalation = agent(d.ESCALATION, d.ESCALATION_INSTRUCTIONS)
        handed: list[str] = []

        @triage.tool_plain(name=d.LOOKUP)
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            return d.lookup_order(order_id)

        @triage.tool_plain(name=d.TRANSFER)
        def transfer_to_refunds() -> str:
            """Hand the customer to the refunds desk."""
            handed.append(d.route(str(asked.get("order")), escalate_from=escalate_from))
            return d.transferred(handed[-1])

        @refunds.tool_plain(name=d.REFUND)
        def refund(order_id: str) -> str:
            """Refund an order."""
            return d.refund(order_id, refund_note)

        answer = triage.run_sync(question).output
        if handed:
            answer = {d.REFUNDS: refunds, d.ESCALATION: escalation}[handed[-1]].run_sync(question).output
        return str(answer)

    return program


desk = desk_program()
desk_prompt_v2 = desk_program(instructions=d.INSTRUCTIONS_V2)
desk_refund_v2 = desk_program(refund_note=d.REFUND_NOTE_V2)
desk_routing_v2 = desk_program(escalate_from=d.ESCALATE_FROM)
