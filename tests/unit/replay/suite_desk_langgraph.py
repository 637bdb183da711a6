"""The support desk (:mod:`tests.unit.replay.desk`) in LangGraph, for the suite tests: offline scripted models.

A graph over ``MessagesState``: the triage node asks its model and answers a ``transfer_to_refunds`` call with
"Handed over"; a conditional edge routes on the model's last call: to the ``lookup`` tool node (and back), or for
the transfer, in code (:func:`~tests.unit.replay.desk.route`), to the refunds agent (a subgraph: its model and
the refund tool) or the escalation node. The router writes nothing: a changed routing shows where the agent handed to
first differs. Programs: :data:`desk`, :data:`desk_prompt_v2`, :data:`desk_refund_v2`,
:data:`desk_routing_v2`. Needs LangGraph.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from agentlog.replay.frameworks.langchain import ReplayChatModel, replay_tool_node
from agentlog.replay.recorder import Recorder
from tests.unit.replay import desk as d

MODEL = "scripted-chat"


class Scripted(BaseChatModel):
    """The desk's scripted chat model for one agent."""

    agent: str

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        said = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
        returned = [(str(m.name), str(m.content)) for m in messages if isinstance(m, ToolMessage)]
        action = d.decide(self.agent, said, returned)
        usage = {"input_tokens": 20 + 10 * len(returned), "output_tokens": 6, "total_tokens": 26 + 10 * len(returned)}
        if action.tool is not None:
            msg = AIMessage(content="", tool_calls=[{"name": action.tool, "args": action.args or {},
                                                     "id": action.call_id}], usage_metadata=usage)
        else:
            msg = AIMessage(content=action.text, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=msg)])


def desk_program(*, instructions: str = d.INSTRUCTIONS, refund_note: str = d.REFUND_NOTE,
                 escalate_from: int | None = None) -> Any:
    def program(recorder: Recorder) -> str:
        asked = recorder.input or {}

        def model(agent: str) -> ReplayChatModel:
            return ReplayChatModel(recorder=recorder, inner=Scripted(agent=agent), node=agent, model_name=MODEL)

        @tool(d.LOOKUP)
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            return d.lookup_order(order_id)

        @tool(d.TRANSFER)
        def transfer_to_refunds() -> str:
            """Hand the customer to the refunds desk."""
            return d.HANDED_OVER  # the triage node answers the call, the router routes it

        @tool(d.REFUND)
        def refund(order_id: str) -> str:
            """Refund an order."""
            return d.refund(order_id, refund_note)

        triage_model = model(d.TRIAGE).bind_tools([lookup_order, transfer_to_refunds])
        escalation_model = model(d.ESCALATION)

        def triage(state: MessagesState) -> dict[str, Any]:
            reply = triage_model.invoke([SystemMessage(instructions), *state["messages"]])
            calls = reply.tool_calls
            if calls and calls[0]["name"] == d.TRANSFER:
                return {"messages": [reply, ToolMessage(content=d.HANDED_OVER, tool_call_id=calls[0]["id"],
                                                        name=d.TRANSFER)]}
            return {"messages": [reply]}

        def router(state: MessagesState) -> str:
            calls = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage)).tool_calls
            if not calls:
                return END
            if calls[0]["name"] == d.LOOKUP:
                return "lookup"
            return d.route(str(asked.get("order")), escalate_from=escalate_from)

        def escalation(state: MessagesState) -> dict[str, Any]:
            return {"messages": [escalation_model.invoke([SystemMessage(d.ESCALATION_INSTRUCTIONS),
                                                          *state["messages"]])]}

        refunds_model = model(d.REFUNDS).bind_tools([refund])

        def refunds_agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [refunds_model.invoke([SystemMessage(d.REFUNDS_INSTRUCTIONS), *state["messages"]])]}

        refunds = StateGraph(MessagesState)  # a tool-calling agent: its model, its tools, back until it answers
        refunds.add_node("agent", refunds_agent)
        refunds.add_node("tools", replay_tool_node(recorder, [refund]))
        refunds.add_edge(START, "agent")
        refunds.add_conditional_edges("agent", tools_condition, ["tools", END])
        refunds.add_edge("tools", "agent")

        graph = StateGraph(MessagesState)
        graph.add_node(d.TRIAGE, triage)
        graph.add_node("lookup", replay_tool_node(recorder, [lookup_order]))
        graph.add_node(d.REFUNDS, refunds.compile(name=d.REFUNDS))
        graph.add_node(d.ESCALATION, escalation)
        graph.add_edge(START, d.TRIAGE)
        graph.add_conditional_edges(d.TRIAGE, router, ["lookup", d.REFUNDS, d.ESCALATION, END])
        graph.add_edge("lookup", d.TRIAGE)
        graph.add_edge(d.REFUNDS, END)
        graph.add_edge(d.ESCALATION, END)
        out = graph.compile().invoke({"messages": [("user", str(asked.get("question", "")))]})
        return str(out["messages"][-1].content)

    return program


desk = desk_program()
desk_prompt_v2 = desk_program(instructions=d.INSTRUCTIONS_V2)
desk_refund_v2 = desk_program(refund_note=d.REFUND_NOTE_V2)
desk_routing_v2 = desk_program(escalate_from=d.ESCALATE_FROM)
