"""The corpus programs as replay tests run them: the same agents and scripted models (:mod:`.script`),
with each model wrapped in its framework's replay adapter (:mod:`agentlog.replay.frameworks`).

Each ``*_program(...)`` returns a program for :func:`agentlog.replay.regression.replay_test`:
``program(recorder)`` builds the agents around the scripted models and runs them. Two knobs make
the known changes a replay test must catch: ``lookup_result`` (a tool that now returns something
else) and ``refuse`` (a model whose first call now refuses). Each program's tools go through its
framework's replay tool wrapper, so a replay test chooses whether they run or are answered from the
recording (``tools=``); ``tool_calls`` (a list), when given, collects each time a tool really runs. pydantic-ai's program (not in the OTLP
corpus) is a support agent looking an order up with a tool, from the same script.

Frameworks are imported inside the programs: importing this module needs none of them.
"""

from __future__ import annotations

import json
from typing import Any

from agentlog.replay.recorder import Recorder
from tests.otel_corpus import script as s

# --- OpenAI Agents SDK: triage → lookup_order → handoff → refund specialist ------------------------------------


def openai_agents_program(*, lookup_result: str = s.LOOKUP_RESULT, refuse: bool = False,
                          tool_calls: list[str] | None = None) -> Any:
    def program(recorder: Recorder) -> str:
        import asyncio

        from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool
        from agents.models.interface import Model
        from openai.types.responses import (
            ResponseOutputMessage,
            ResponseOutputRefusal,
        )

        from agentlog.replay.frameworks.openai_agents import ReplayModel, replay_tools

        asked = [0]

        class Scripted(Model):
            """Answers what the conversation calls for: look up, then hand off; the specialist confirms."""

            def __init__(self, agent: str) -> None:
                self.agent = agent

            async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                                   **kwargs: Any) -> ModelResponse:
                looked_up = any(isinstance(item, dict) and item.get("type") == "function_call_output"
                                for item in input)
                kind = "text" if self.agent == s.SPECIALIST else "handoff" if looked_up else "tool_call"
                i, (_, _, tokens_in, tokens_out) = next(
                    (n, c) for n, c in enumerate(s.AGENTS_CALLS) if c[:2] == (self.agent, kind))
                asked[0] += 1
                if refuse and asked[0] == 1:
                    item: Any = ResponseOutputMessage(type="message", id=f"msg_{i}", role="assistant",
                                                      status="completed", content=[ResponseOutputRefusal(
                                                          type="refusal", refusal="I can't help with refunds.")])
                else:
                    item = agents_output_item(i, kind)
                return ModelResponse(output=[item], usage=Usage(requests=1, input_tokens=tokens_in,
                                                                output_tokens=tokens_out,
                                                                total_tokens=tokens_in + tokens_out),
                                     response_id=f"resp_{i}")

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError

        @function_tool(name_override=s.LOOKUP_TOOL)
        def lookup_order(order_id: str) -> str:
            """Look an order up by its id."""
            if tool_calls is not None:
                tool_calls.append(s.LOOKUP_TOOL)
            return lookup_result

        def model(agent: str) -> ReplayModel:
            return ReplayModel(recorder, inner=Scripted(agent), node=agent, model_name=s.AGENTS_MODEL)

        specialist = Agent(name=s.SPECIALIST, instructions=s.SPECIALIST_INSTRUCTIONS, model=model(s.SPECIALIST))
        triage = Agent(name=s.TRIAGE, instructions=s.TRIAGE_INSTRUCTIONS,
                       tools=replay_tools(recorder, [lookup_order]),
                       handoffs=[specialist], model=model(s.TRIAGE))
        result = asyncio.run(Runner.run(triage, s.AGENTS_USER, run_config=RunConfig(
            workflow_name=s.AGENTS_WORKFLOW, group_id=s.AGENTS_GROUP, tracing_disabled=True)))
        return str(result.final_output)

    return program


# --- LangGraph: a supervisor routes to a researcher subgraph (a ReAct agent with a tool) -----------------------


def langgraph_program(*, search_result: str = s.SEARCH_RESULT, refuse: bool = False,
                      tool_calls: list[str] | None = None) -> Any:
    def program(recorder: Recorder) -> str:

        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
        from langchain_core.tools import tool

        from agentlog.replay.frameworks.langchain import ReplayChatModel, replay_tool_node

        asked = [0]

        class Scripted(BaseChatModel):
            """Answers what the conversation calls for: route, then search, then sum up."""

            node: str

            @property
            def _llm_type(self) -> str:
                return "scripted"

            def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                          **kwargs: Any) -> ChatResult:
                node = self.node
                searched = any(isinstance(m, ToolMessage) and m.name == s.SEARCH_TOOL for m in messages)
                answered = any(isinstance(m, AIMessage) and m.content == s.RESEARCHER_ANSWER for m in messages)
                kind = ("text" if answered else "route") if node == s.SUPERVISOR else \
                    ("text" if searched else "tool_call")
                i, (_, _, tokens_in, tokens_out) = next(
                    (n, c) for n, c in enumerate(s.GRAPH_CALLS) if c[:2] == (node, kind))
                asked[0] += 1
                usage = {"input_tokens": tokens_in, "output_tokens": tokens_out,
                         "total_tokens": tokens_in + tokens_out}
                if refuse and asked[0] == 1:
                    msg = AIMessage(content="", additional_kwargs={"refusal": "I can't route this."},
                                    response_metadata={"finish_reason": "content_filter"})
                elif kind == "route":
                    msg = AIMessage(content="", tool_calls=[{"name": s.ROUTE_TOOL, "args": {}, "id": f"call_{i}"}],
                                    usage_metadata=usage)
                elif kind == "tool_call":
                    msg = AIMessage(content="", tool_calls=[{"name": s.SEARCH_TOOL, "args": s.SEARCH_ARGS,
                                                             "id": f"call_{i}"}], usage_metadata=usage)
                else:
                    text = s.RESEARCHER_ANSWER if node == s.RESEARCHER else s.SUPERVISOR_ANSWER
                    msg = AIMessage(content=text, usage_metadata=usage)
                return ChatResult(generations=[ChatGeneration(message=msg)])

        @tool(s.SEARCH_TOOL)
        def search_papers(query: str) -> str:
            """Search papers."""
            if tool_calls is not None:
                tool_calls.append(s.SEARCH_TOOL)
            return search_result

        def model(node: str, name: str) -> ReplayChatModel:
            return ReplayChatModel(recorder=recorder, inner=Scripted(node=node), node=node, model_name=name)

        return str(supervisor_graph_answer(model(s.SUPERVISOR, s.SUPERVISOR_MODEL),
                                           model(s.RESEARCHER, s.RESEARCHER_MODEL),
                                           replay_tool_node(recorder, [search_papers])).content)

    return program


# --- pydantic-ai: a support agent looks the order up with a tool, then answers -----------------------------------

PYDANTIC_AGENT = "support"
PYDANTIC_MODEL_CALLS = [("tool_call", 31, 7), ("text", 58, 12)]


def pydantic_ai_program(*, lookup_result: str = s.LOOKUP_RESULT, refuse: bool = False,
                        instructions: str = s.TRIAGE_INSTRUCTIONS, tool_calls: list[str] | None = None) -> Any:
    def program(recorder: Recorder) -> str:
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel
        from pydantic_ai.usage import RequestUsage

        from agentlog.replay.frameworks.pydantic_ai import ReplayModel, ReplayTools

        asked = [0]

        def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            """Answers what the conversation calls for: look the order up, then confirm."""
            looked_up = any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
            i = 1 if looked_up else 0
            kind, tokens_in, tokens_out = PYDANTIC_MODEL_CALLS[i]
            usage = RequestUsage(input_tokens=tokens_in, output_tokens=tokens_out)
            asked[0] += 1
            if refuse and asked[0] == 1:
                return ModelResponse(parts=[TextPart("I can't help with refunds.")], usage=usage,
                                     finish_reason="content_filter")
            if kind == "tool_call":
                return ModelResponse(parts=[ToolCallPart(s.LOOKUP_TOOL, dict(s.LOOKUP_ARGS), f"call_{i}")],
                                     usage=usage, finish_reason="tool_call")
            return ModelResponse(parts=[TextPart(s.SPECIALIST_ANSWER)], usage=usage, finish_reason="stop")

        agent = Agent(ReplayModel(recorder, inner=FunctionModel(scripted, model_name=s.AGENTS_MODEL),
                                  node=PYDANTIC_AGENT),
                      name=PYDANTIC_AGENT, instructions=instructions, capabilities=[ReplayTools(recorder)])

        @agent.tool_plain(name=s.LOOKUP_TOOL)
        def lookup_order(order_id: str) -> str:
            """Look an order up by its id."""
            if tool_calls is not None:
                tool_calls.append(s.LOOKUP_TOOL)
            return lookup_result

        return str(agent.run_sync(s.AGENTS_USER).output)

    return program


PROGRAMS = {"pydantic_ai": pydantic_ai_program, "openai_agents": openai_agents_program,
            "langgraph": langgraph_program}

#: The unchanged programs, by the name ``agentlog replay-test --program tests.otel_corpus.programs:<name>`` uses.
support_agents = openai_agents_program()
research_graph = langgraph_program()
support_pydantic = pydantic_ai_program()


def supervisor_graph_answer(supervisor_model: Any, researcher_model: Any, search_tools: Any) -> Any:
    """The LangGraph program of the corpus and of its replay tests, on the given chat models: a supervisor that
    routes (``Command(goto=...)``) to a ReAct researcher with the search tool and back; its final message.
    ``search_tools``: the researcher's tools, a list or a ``ToolNode``."""
    from typing import Literal

    from langchain_core.messages import ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import create_react_agent
    from langgraph.types import Command

    researcher = create_react_agent(researcher_model, search_tools, name=s.RESEARCHER)

    def supervisor(state: MessagesState) -> Command[Literal["researcher", "__end__"]]:
        reply = supervisor_model.invoke(state["messages"])
        if reply.tool_calls:
            call = reply.tool_calls[0]
            done = ToolMessage(content=f"Transferred to {s.RESEARCHER}", tool_call_id=call["id"], name=call["name"])
            return Command(goto=s.RESEARCHER, update={"messages": [reply, done]})
        return Command(goto=END, update={"messages": [reply]})

    graph = StateGraph(MessagesState)
    graph.add_node(s.SUPERVISOR, supervisor)
    graph.add_node(s.RESEARCHER, researcher)
    graph.add_edge(START, s.SUPERVISOR)
    graph.add_edge(s.RESEARCHER, s.SUPERVISOR)
    out = graph.compile().invoke({"messages": [("user", s.GRAPH_USER)]},
                                 config={"configurable": {"thread_id": s.GRAPH_THREAD}})
    return out["messages"][-1]


def agents_output_item(i: int, kind: str) -> Any:
    """The OpenAI Agents scripted model's output item for call ``i`` of the script: the lookup tool call, the
    handoff, or the specialist's answer."""
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    if kind == "tool_call":
        return ResponseFunctionToolCall(type="function_call", id=f"fc_{i}", call_id=f"call_{i}",
                                        name=s.LOOKUP_TOOL, arguments=json.dumps(s.LOOKUP_ARGS))
    if kind == "handoff":
        return ResponseFunctionToolCall(type="function_call", id=f"fc_{i}", call_id=f"call_{i}",
                                        name=s.HANDOFF_TOOL, arguments="{}")
    return ResponseOutputMessage(type="message", id=f"msg_{i}", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", annotations=[],
                                                             text=s.SPECIALIST_ANSWER)])
