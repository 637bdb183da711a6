"""A support agent in pydantic-ai for the suite tests: one program, any run's input, offline models.

The program answers ``recorder.input`` (``{"order": "<id>", "question": "<text>"}``): the planner looks each order
the question names up with a tool, one call at a time, and when the question asks for a refund it calls a second
tool, then answers. Its scripted model
reads the order id and the question from the conversation, so the same program replays every recorded run with
that run's own input. Variants for ``--program``: :data:`support` (as recorded), :data:`support_prompt_v2` (the
planner's instructions changed: every run's first request differs), :data:`support_refund_v2` (the refund tool
returns something else: only the runs that ask for a refund change), :data:`support_raises` (the program raises
for order 105), :func:`support_slow` (half a second a run). Needs pydantic-ai (import after ``pytest.importorskip("pydantic_ai")``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentlog.replay.frameworks.pydantic_ai import ReplayModel, ReplayTools
from agentlog.replay.recorder import Recorder

INSTRUCTIONS = "Answer the customer about their order."


def inputs(n: int, *, orders: int = 1) -> list[dict[str, str]]:
    """``n`` varied inputs, each about ``orders`` orders (one tool call each): every third asks for a refund."""
    out = []
    for i in range(n):
        ids = [str(100 + i + k * n) for k in range(orders)]
        ask = "Please refund" if i % 3 == 0 else "Where is"
        out.append({"order": ids[0], "question": f"{ask} my order {', '.join(ids)}?"})
    return out


def support_program(*, instructions: str = INSTRUCTIONS, refund_note: str = "refund issued",
                    raise_for: str | None = None) -> Any:
    def program(recorder: Recorder) -> str:
        asked = recorder.input or {}
        if asked.get("order") == raise_for:
            raise RuntimeError(f"the order service is down for order {raise_for}")

        def llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            question = str(next(p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart)))
            orders = re.findall(r"\d+", question) or ["?"]
            returned = [(p.tool_name, p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            looked = [content for name, content in returned if name == "lookup_order"]
            if len(looked) < len(orders):  # one order at a time, as a model that thinks step by step
                return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": orders[len(looked)]},
                                                         tool_call_id=f"c{len(looked) + 1}")])
            refunded = [content for name, content in returned if name == "refund"]
            if "refund" in question.lower() and not refunded:
                return ModelResponse(parts=[ToolCallPart("refund", {"order_id": orders[0]}, tool_call_id="r1")])
            return ModelResponse(parts=[TextPart("; ".join(map(str, looked + (refunded or ["ok"]))))])

        planner = Agent(ReplayModel(recorder, inner=FunctionModel(llm), node="planner"), name="planner",
                        instructions=instructions, capabilities=[ReplayTools(recorder)])

        @planner.tool_plain
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            return f"order {order_id}: delivered"

        @planner.tool_plain
        def refund(order_id: str) -> str:
            """Refund an order."""
            return f"order {order_id}: {refund_note}"

        return str(planner.run_sync(str(asked.get("question", ""))).output)

    return program


support = support_program()
support_prompt_v2 = support_program(instructions="Answer the customer briefly.")
support_refund_v2 = support_program(refund_note="refund queued for review")
support_raises = support_program(raise_for="105")


def support_slow(recorder: Recorder) -> str:
    """:data:`support`, half a second a run: a suite long enough to interrupt."""
    import time

    time.sleep(0.5)
    return str(support(recorder))
