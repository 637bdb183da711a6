"""Record the OTLP corpus: real multi-agent programs, offline, each instrumented two ways (Google ADK: its own).

    pip install -e '.[frameworks]'
    python -m tests.otel_corpus.record                 # (re)record every fixture
    python -m tests.otel_corpus.record --one adk.genai # one fixture, in this process
    python -m tests.otel_corpus.record --show langgraph.openinference   # one fixture as OTLP/JSON
    python -m tests.otel_corpus.record --live langgraph.openinference   # export to OTEL_EXPORTER_OTLP_*
    python -m tests.otel_corpus.record --frameworks [crewai …]   # CrewAI, LlamaIndex, smolagents, Strands, AutoGen

CrewAI, LlamaIndex, smolagents, Strands and AutoGen run in environments of their own (their pins conflict with
the main venv's; :mod:`tests.otel_corpus.envs` builds them), their programs in ``tests/otel_corpus/recorders/``
against a fake OpenAI server on loopback (:mod:`tests.otel_corpus.fake_openai`) answering
:mod:`tests.otel_corpus.script_frameworks`.

``--live`` runs the same program with the exporter a user configures through the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``_PROTOCOL`` (``grpc`` or ``http/protobuf``) / ``_HEADERS``
variables, and exits non-zero unless every export succeeded: ``tests/integration/otel/
test_frameworks_live.py`` points it at a real worker.

Each program × instrumentation runs in a subprocess of its own (instrumentors patch
frameworks globally and cannot be undone cleanly). The models are scripted fakes driven
by :mod:`tests.otel_corpus.script`; any socket to a non-loopback address raises, so a
recording never reaches the network. Spans go through the SDK's ``BatchSpanProcessor``
and the real ``OTLPSpanExporter`` to a small HTTP server on loopback in this process,
which stores each request body as it arrived: ``<program>.<instrumentation>.pb.gz`` (one
body; ``.1.pb.gz``, ``.2.pb.gz`` … if the exporter sent several).

Why gzipped binary protobuf and not OTLP/JSON: it is the exact byte string an exporter sends
(``http/protobuf`` with ``OTEL_EXPORTER_OTLP_COMPRESSION=gzip``), so the tests decode it
with the receiver's own :func:`agentlog.worker.otlp.decode_request`; JSON through
protobuf's ``json_format`` would be a re-encoding we made (bytes ids as base64, unlike
OTLP/JSON's hex). Gzip keeps the fixtures to a few KB: LangChain instrumentations repeat the
whole graph state on every span. ``--show`` prints a fixture as JSON for review.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as fw

HERE = Path(__file__).parent


# --- no network -------------------------------------------------------------------------------------------------

def _forbid_network() -> None:
    """Refuse every connection that is not to loopback or a unix socket."""
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"the corpus recorder is offline; refused a connection to {address!r}")
        return connect(self, address)

    socket.socket.connect = guarded  # type: ignore[method-assign]


# --- the capturing OTLP endpoint ---------------------------------------------------------------------------------

class _Capture(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        n = int(self.headers.get("Content-Length") or 0)
        assert self.headers.get("Content-Encoding") == "gzip", "the recorder's exporter sends gzip"
        _Capture.bodies.append(self.rfile.read(n))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _provider(name: str, exporter: Any) -> Any:
    """The SDK's provider as a program sets it up; every span goes out in one batch, at the flush."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"agentlog-corpus-{name}"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000,
                                                   max_export_batch_size=512))
    return provider


def _capturing_provider(name: str) -> tuple[Any, ThreadingHTTPServer]:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces",
                                compression=Compression.Gzip)
    return _provider(name, exporter), server


def _checked(exporter: Any, save: Path | None) -> Any:
    """``exporter``, remembering each export's result (and, with ``save``, writing each request body there)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter

    class Checked(SpanExporter):
        def __init__(self) -> None:
            self.results: list[Any] = []

        def export(self, spans: Any) -> Any:
            if save is not None:
                (save / f"request-{len(self.results)}.pb").write_bytes(encode_spans(spans).SerializeToString())
            result = exporter.export(spans)
            self.results.append(result)
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Checked()


# --- OpenAI Agents SDK --------------------------------------------------------------------------------------------

def _openai_agents(provider: Any, instrumentation: str) -> None:
    import agents
    from agents import Agent, ModelResponse, RunConfig, Runner, function_tool
    from agents.models.interface import Model
    from agents.models.openai_responses import Converter
    from agents.tracing import response_span
    from agents.usage import Usage, model_usage_to_span_usage
    from openai.types.responses import (
        Response,
        ResponseUsage,
    )
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

    from tests.otel_corpus.programs import agents_output_item

    # The SDK's own exporter sends traces to OpenAI: gone before any instrumentor adds its processor.
    agents.set_trace_processors([])
    if instrumentation == "openllmetry":
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor as Instrumentor
    else:
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor as Instrumentor
    Instrumentor().instrument(tracer_provider=provider)

    calls = iter(enumerate(s.AGENTS_CALLS))

    class Scripted(Model):
        """Answers the next scripted call (and checks it is the agent the script expects).

        Traces the call the way the SDK's own ``OpenAIResponsesModel`` does: a ``response_span``
        holding the request input, the ``Response`` object and the usage.
        """

        def __init__(self, agent: str) -> None:
            self.agent = agent

        async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                               tools: Any, output_schema: Any, handoffs: Any, tracing: Any,
                               **kwargs: Any) -> ModelResponse:
            with response_span(disabled=tracing.is_disabled()) as span:
                response, usage = self._answer(system_instructions, tools, handoffs)
                span.span_data.usage = model_usage_to_span_usage(usage)
                if tracing.include_data():
                    span.span_data.response = response
                    span.span_data.input = input
            return ModelResponse(output=response.output, usage=usage, response_id=response.id)

        def _answer(self, system_instructions: str | None, tools: Any, handoffs: Any) -> tuple[Any, Any]:
            i, (agent, kind, tokens_in, tokens_out) = next(calls)
            assert agent == self.agent, f"call {i}: the script expects {agent}, {self.agent} called"
            item = agents_output_item(i, kind)
            usage = Usage(requests=1, input_tokens=tokens_in, output_tokens=tokens_out,
                          total_tokens=tokens_in + tokens_out)
            response = Response(
                id=f"resp_{i}", created_at=1_700_000_000, model=s.AGENTS_MODEL, object="response", output=[item],
                instructions=system_instructions, parallel_tool_calls=False, tool_choice="auto",
                tools=Converter.convert_tools(tools, handoffs).tools, status="completed",
                usage=ResponseUsage(input_tokens=tokens_in, output_tokens=tokens_out,
                                    total_tokens=tokens_in + tokens_out,
                                    input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                                    output_tokens_details=OutputTokensDetails(reasoning_tokens=0)))
            return response, usage

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the corpus programs do not stream")

    @function_tool(name_override=s.LOOKUP_TOOL)
    def lookup_order(order_id: str) -> str:
        """Look an order up by its id."""
        assert order_id == s.LOOKUP_ARGS["order_id"]
        return s.LOOKUP_RESULT

    specialist = Agent(name=s.SPECIALIST, instructions=s.SPECIALIST_INSTRUCTIONS, model=Scripted(s.SPECIALIST))
    triage = Agent(name=s.TRIAGE, instructions=s.TRIAGE_INSTRUCTIONS, tools=[lookup_order], handoffs=[specialist],
                   model=Scripted(s.TRIAGE))
    result = asyncio.run(Runner.run(triage, s.AGENTS_USER, run_config=RunConfig(
        workflow_name=s.AGENTS_WORKFLOW, group_id=s.AGENTS_GROUP, tracing_disabled=False)))
    assert result.final_output == s.SPECIALIST_ANSWER, result.final_output
    assert next(calls, None) is None, "the program made fewer model calls than scripted"
    agents.flush_traces()


# --- LangGraph ---------------------------------------------------------------------------------------------------

def _instrument_langchain(provider: Any, instrumentation: str) -> None:
    if instrumentation == "openllmetry":
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor
        LangchainInstrumentor().instrument(tracer_provider=provider)
    else:
        from openinference.instrumentation.langchain import LangChainInstrumentor
        LangChainInstrumentor().instrument(tracer_provider=provider)


def _langgraph(provider: Any, instrumentation: str) -> None:
    _instrument_langchain(provider, instrumentation)

    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from tests.otel_corpus.programs import supervisor_graph_answer

    calls = iter(enumerate(s.GRAPH_CALLS))

    class Scripted(BaseChatModel):
        """A chat model that answers the next scripted call, with usage like a provider's."""

        node: str
        model_name: str

        @property
        def _llm_type(self) -> str:
            return "scripted"

        @property
        def _identifying_params(self) -> dict[str, Any]:
            return {"model_name": self.model_name}

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            # As provider chat models do: the tools in OpenAI's function format.
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools])

        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            i, (node, kind, tokens_in, tokens_out) = next(calls)
            assert node == self.node, f"call {i}: the script expects {node}, {self.node} called"
            usage = {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
            meta = {"model_name": self.model_name, "finish_reason": "tool_calls" if "tool" in kind or kind == "route"
                    else "stop"}
            if kind == "route":
                msg = AIMessage(content="", tool_calls=[{"name": s.ROUTE_TOOL, "args": {}, "id": f"call_{i}"}],
                                usage_metadata=usage, response_metadata=meta)
            elif kind == "tool_call":
                msg = AIMessage(content="", tool_calls=[{"name": s.SEARCH_TOOL, "args": s.SEARCH_ARGS,
                                                         "id": f"call_{i}"}], usage_metadata=usage,
                                response_metadata=meta)
            else:
                text = s.RESEARCHER_ANSWER if node == s.RESEARCHER else s.SUPERVISOR_ANSWER
                msg = AIMessage(content=text, usage_metadata=usage, response_metadata=meta)
            return ChatResult(generations=[ChatGeneration(message=msg)],
                              llm_output={"model_name": self.model_name, "token_usage": {
                                  "prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                                  "total_tokens": tokens_in + tokens_out}})

    @tool(s.SEARCH_TOOL)
    def search_papers(query: str) -> str:
        """Search papers."""
        assert query == s.SEARCH_ARGS["query"]
        return s.SEARCH_RESULT

    answer = supervisor_graph_answer(Scripted(node=s.SUPERVISOR, model_name=s.SUPERVISOR_MODEL),
                                     Scripted(node=s.RESEARCHER, model_name=s.RESEARCHER_MODEL), [search_papers])
    assert answer.content == s.SUPERVISOR_ANSWER, answer
    assert next(calls, None) is None, "the program made fewer model calls than scripted"


# --- LangGraph, every way one agent hands control to another (script.LANGGRAPH_SHAPES) ----------------------------
# The graphs' node functions leave their state parameter unannotated: LangGraph reads a node's annotations with
# get_type_hints, which cannot resolve names these functions import locally.

def _scripted_chat_model(calls: list[tuple[str, dict[str, Any], int, int, str | None]]) -> Any:
    """A chat model class whose instances answer their agent's next scripted call (:data:`script.LANGGRAPH_SHAPES`).

    Each instance speaks for one agent; the calls of concurrent workers of one agent are told apart by the text
    of their last user message (``when``). Usage is reported as a provider reports it.
    """
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool

    answered: set[int] = set()
    lock = threading.Lock()

    class Scripted(BaseChatModel):
        agent: str
        model_name: str

        @property
        def _llm_type(self) -> str:
            return "scripted"

        @property
        def _identifying_params(self) -> dict[str, Any]:
            return {"model_name": self.model_name}

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools])

        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            asked = next((str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
            with lock:
                i = next((n for n, (agent, _, _, _, when) in enumerate(calls) if n not in answered
                          and agent == self.agent and (when is None or when in asked)), None)
                assert i is not None, f"{self.agent} made a call the script does not have: {asked!r}"
                answered.add(i)
            _, reply, tokens_in, tokens_out, _ = calls[i]
            usage = {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
            meta = {"model_name": self.model_name, "finish_reason": "tool_calls" if "tool" in reply else "stop"}
            if "tool" in reply:
                msg = AIMessage(content="", tool_calls=[{"name": reply["tool"], "args": reply["args"],
                                                         "id": f"call_{i}"}], usage_metadata=usage,
                                response_metadata=meta)
            else:
                msg = AIMessage(content=reply["text"], usage_metadata=usage, response_metadata=meta)
            return ChatResult(generations=[ChatGeneration(message=msg)],
                              llm_output={"model_name": self.model_name, "token_usage": {
                                  "prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                                  "total_tokens": tokens_in + tokens_out}})

    Scripted.answered = answered  # type: ignore[attr-defined]
    return Scripted


def _search_tool(results: dict[str, str] | None = None) -> Any:
    from langchain_core.tools import tool

    @tool(s.SEARCH_TOOL)
    def search_papers(query: str) -> str:
        """Search papers."""
        return (results or {s.SEARCH_ARGS["query"]: s.SEARCH_RESULT})[query]

    return search_papers


def _researcher_graph(model: Any) -> Any:
    """The researcher's graph, not compiled: its model calls the search tool (a ToolNode) until it answers."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    search = _search_tool()
    researcher_model = model(agent=s.RESEARCHER, model_name=s.RESEARCHER_MODEL).bind_tools([search])

    def call_model(state) -> dict[str, Any]:
        return {"messages": [researcher_model.invoke(state["messages"])]}

    inner = StateGraph(MessagesState)
    inner.add_node("llm", call_model)
    inner.add_node("tools", ToolNode([search]))
    inner.add_edge(START, "llm")
    inner.add_conditional_edges("llm", tools_condition, {"tools": "tools", END: END})
    inner.add_edge("tools", "llm")
    return inner


def _transfer_tool(agent: str) -> Any:
    """The supervisor's transfer_to_<agent> tool as the model sees it (the graph routes on the call; it never runs)."""
    from langchain_core.tools import tool

    @tool(f"transfer_to_{agent}")
    def transfer() -> str:
        """Hand the conversation to this agent."""
        return f"Transferred to {agent}"

    return transfer


def _routed(model: Any) -> Any:
    """add_conditional_edges: supervisor → researcher (a compiled StateGraph) → supervisor → writer
    (create_react_agent) → supervisor → formatter (a plain node)."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import create_react_agent

    supervisor_model = model(agent=s.SUPERVISOR, model_name=s.SUPERVISOR_MODEL).bind_tools(
        [_transfer_tool(s.RESEARCHER), _transfer_tool(s.WRITER)])

    def supervisor(state) -> dict[str, Any]:
        reply = supervisor_model.invoke(state["messages"])
        done = [ToolMessage(content=f"Transferred to {c['name'].removeprefix('transfer_to_')}", tool_call_id=c["id"],
                            name=c["name"]) for c in reply.tool_calls]
        return {"messages": [reply, *done]}

    def route(state) -> str:
        reply = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        return reply.tool_calls[0]["name"].removeprefix("transfer_to_") if reply.tool_calls else s.FORMATTER

    def formatter(state) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"Report: {state['messages'][-1].content}")]}

    inner = _researcher_graph(model)
    writer = create_react_agent(model(agent=s.WRITER, model_name=s.WRITER_MODEL), [], name=s.WRITER)

    graph = StateGraph(MessagesState)
    graph.add_node(s.SUPERVISOR, supervisor)
    graph.add_node(s.RESEARCHER, inner.compile())
    graph.add_node(s.WRITER, writer)
    graph.add_node(s.FORMATTER, formatter)
    graph.add_edge(START, s.SUPERVISOR)
    graph.add_conditional_edges(s.SUPERVISOR, route, [s.RESEARCHER, s.WRITER, s.FORMATTER])
    graph.add_edge(s.RESEARCHER, s.SUPERVISOR)
    graph.add_edge(s.WRITER, s.SUPERVISOR)
    graph.add_edge(s.FORMATTER, END)
    return graph.compile()


def _parent(model: Any) -> Any:
    """Command(graph=Command.PARENT, goto=...): the researcher subgraph's own hand_off node sends the parent graph
    on to the writer."""
    from langchain_core.messages import ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, create_react_agent
    from langgraph.types import Command

    search = _search_tool()
    researcher_model = model(agent=s.RESEARCHER, model_name=s.RESEARCHER_MODEL).bind_tools(
        [search, _transfer_tool(s.WRITER)])

    def call_model(state) -> dict[str, Any]:
        return {"messages": [researcher_model.invoke(state["messages"])]}

    def next_step(state) -> str:
        calls = state["messages"][-1].tool_calls
        return END if not calls else "hand_off" if calls[0]["name"] == s.TO_WRITER else "tools"

    def hand_off(state):
        call = state["messages"][-1].tool_calls[0]
        done = ToolMessage(content=f"Transferred to {s.WRITER}", tool_call_id=call["id"], name=call["name"])
        return Command(graph=Command.PARENT, goto=s.WRITER, update={"messages": [*state["messages"], done]})

    inner = StateGraph(MessagesState)
    inner.add_node("llm", call_model)
    inner.add_node("tools", ToolNode([search]))
    inner.add_node("hand_off", hand_off)
    inner.add_edge(START, "llm")
    inner.add_conditional_edges("llm", next_step, ["tools", "hand_off", END])
    inner.add_edge("tools", "llm")

    graph = StateGraph(MessagesState)
    graph.add_node(s.RESEARCHER, inner.compile(), destinations=(s.WRITER,))
    graph.add_node(s.WRITER, create_react_agent(model(agent=s.WRITER, model_name=s.WRITER_MODEL), [],
                                                name=s.WRITER))
    graph.add_edge(START, s.RESEARCHER)
    graph.add_edge(s.WRITER, END)
    return graph.compile()


def _supervisor_package(model: Any) -> Any:
    """langgraph_supervisor.create_supervisor over one create_react_agent researcher."""
    from langgraph.prebuilt import create_react_agent
    from langgraph_supervisor import create_supervisor

    researcher = create_react_agent(model(agent=s.RESEARCHER, model_name=s.RESEARCHER_MODEL), [_search_tool()],
                                    name=s.RESEARCHER)
    return create_supervisor([researcher], model=model(agent=s.SUPERVISOR, model_name=s.SUPERVISOR_MODEL),
                             supervisor_name=s.SUPERVISOR).compile()


def _swarm(model: Any) -> Any:
    """langgraph_swarm.create_swarm: a researcher that searches and hands off, a writer that answers."""
    from langgraph.prebuilt import create_react_agent
    from langgraph_swarm import create_handoff_tool, create_swarm

    researcher = create_react_agent(model(agent=s.RESEARCHER, model_name=s.RESEARCHER_MODEL),
                                    [_search_tool(), create_handoff_tool(agent_name=s.WRITER)], name=s.RESEARCHER)
    writer = create_react_agent(model(agent=s.WRITER, model_name=s.WRITER_MODEL),
                                [create_handoff_tool(agent_name=s.RESEARCHER)], name=s.WRITER)
    return create_swarm([researcher, writer], default_active_agent=s.RESEARCHER).compile()


def _send(model: Any) -> Any:
    """Send fan-out: a planner node sends each topic to a worker agent; the workers run in one step; a join node."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import create_react_agent
    from langgraph.types import Send

    planner_model = model(agent=s.PLANNER, model_name=s.SUPERVISOR_MODEL)
    worker = create_react_agent(model(agent=s.WORKER, model_name=s.RESEARCHER_MODEL),
                                [_search_tool(s.TOPIC_RESULTS)], name=s.WORKER)

    def planner(state) -> dict[str, Any]:
        return {"messages": [planner_model.invoke(state["messages"])]}

    def fan_out(state):
        return [Send(s.WORKER, {"messages": [HumanMessage(content=f"Search: {topic}")]}) for topic in s.TOPICS]

    def join(state) -> dict[str, Any]:
        found = sorted(str(m.content) for m in state["messages"] if isinstance(m, AIMessage)
                       and str(m.content).startswith("Found"))
        return {"messages": [AIMessage(content=" ".join(found))]}

    graph = StateGraph(MessagesState)
    graph.add_node(s.PLANNER, planner)
    graph.add_node(s.WORKER, worker)
    graph.add_node(s.JOINER, join)
    graph.add_edge(START, s.PLANNER)
    graph.add_conditional_edges(s.PLANNER, fan_out, [s.WORKER])
    graph.add_edge(s.WORKER, s.JOINER)
    graph.add_edge(s.JOINER, END)
    return graph.compile()


def _invoked(model: Any) -> Any:
    """Compiled graphs invoked inside node functions: supervisor → researcher (a function running the researcher's
    own graph, model → ToolNode → model) → supervisor → formatter (a function running a graph that calls no model)."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    supervisor_model = model(agent=s.SUPERVISOR, model_name=s.SUPERVISOR_MODEL).bind_tools(
        [_transfer_tool(s.RESEARCHER)])

    def supervisor(state) -> dict[str, Any]:
        reply = supervisor_model.invoke(state["messages"])
        done = [ToolMessage(content=f"Transferred to {c['name'].removeprefix('transfer_to_')}", tool_call_id=c["id"],
                            name=c["name"]) for c in reply.tool_calls]
        return {"messages": [reply, *done]}

    def route(state) -> str:
        reply = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        return s.RESEARCHER if reply.tool_calls else s.FORMATTER

    inner = _researcher_graph(model)
    research = inner.compile()

    def researcher(state) -> dict[str, Any]:
        return {"messages": research.invoke({"messages": state["messages"]})["messages"][len(state["messages"]):]}

    def report(state) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"Report: {state['messages'][-1].content}")]}

    plain = StateGraph(MessagesState)
    plain.add_node("report", report)
    plain.add_edge(START, "report")
    formatting = plain.compile()

    def formatter(state) -> dict[str, Any]:
        return {"messages": formatting.invoke({"messages": state["messages"]})["messages"][len(state["messages"]):]}

    graph = StateGraph(MessagesState)
    graph.add_node(s.SUPERVISOR, supervisor)
    graph.add_node(s.RESEARCHER, researcher)
    graph.add_node(s.FORMATTER, formatter)
    graph.add_edge(START, s.SUPERVISOR)
    graph.add_conditional_edges(s.SUPERVISOR, route, [s.RESEARCHER, s.FORMATTER])
    graph.add_edge(s.RESEARCHER, s.SUPERVISOR)
    graph.add_edge(s.FORMATTER, END)
    return graph.compile()


_SHAPES = {"lg_routed": _routed, "lg_parent": _parent, "lg_supervisor": _supervisor_package, "lg_swarm": _swarm,
           "lg_send": _send, "lg_invoked": _invoked}


def _langgraph_shape(program: str, provider: Any, instrumentation: str) -> None:
    """One program of :data:`script.LANGGRAPH_SHAPES`, run on its thread id; every scripted call is made."""
    _instrument_langchain(provider, instrumentation)
    thread, calls = s.LANGGRAPH_SHAPES[program]
    model = _scripted_chat_model(calls)
    graph = _SHAPES[program](model)
    graph.invoke({"messages": [("user", s.GRAPH_USER)]}, config={"configurable": {"thread_id": thread}})
    assert model.answered == set(range(len(calls))), f"calls made: {sorted(model.answered)} of {len(calls)}"


# --- Google ADK ---------------------------------------------------------------------------------------------------

def _adk(provider: Any, instrumentation: str) -> None:
    """The support program as ADK writes it, traced by ADK's own instrumentation or by OpenInference's.

    ADK traces through the global tracer provider, under either.

    ``genai``: ADK's own instrumentation (GenAI semantic conventions). Content goes on the spans with
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY`` and the experimental GenAI
    conventions (``gen_ai.input/output.messages``, tool arguments and results); without them ADK
    records no messages.

    ``openinference``: OpenInference's ADK instrumentor (its own AGENT, CHAIN and TOOL spans). It writes
    a model call's attributes onto ADK's own ``call_llm`` span, which ADK opens only in its legacy
    telemetry schema (``ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1``); in the default schema there is none,
    and every call of an agent lands on its one ``invoke_agent`` span, each overwriting the last.
    """
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    if instrumentation == "genai":
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    else:
        assert instrumentation == "openinference", instrumentation
        os.environ["ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN"] = "1"
        from openinference.instrumentation.google_adk import GoogleADKInstrumentor

        GoogleADKInstrumentor().instrument(tracer_provider=provider)

    from collections.abc import AsyncGenerator

    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    calls = iter(enumerate(s.ADK_CALLS))

    class Scripted(BaseLlm):
        """Answers the next scripted call (and checks it is the agent the script expects)."""

        agent: str

        async def generate_content_async(self, llm_request: LlmRequest,
                                         stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
            i, (agent, kind, tokens_in, tokens_out) = next(calls)
            assert agent == self.agent, f"call {i}: the script expects {agent}, {self.agent} called"
            if kind == "tool_call":
                part = types.Part(function_call=types.FunctionCall(id=f"call_{i}", name=s.LOOKUP_TOOL,
                                                                   args=dict(s.LOOKUP_ARGS)))
            elif kind == "handoff":
                part = types.Part(function_call=types.FunctionCall(id=f"call_{i}", name=s.ADK_TRANSFER_TOOL,
                                                                   args={"agent_name": s.SPECIALIST}))
            else:
                part = types.Part(text=s.SPECIALIST_ANSWER)
            yield LlmResponse(content=types.Content(role="model", parts=[part]), model_version=self.model,
                              finish_reason=types.FinishReason.STOP,
                              usage_metadata=types.GenerateContentResponseUsageMetadata(
                                  prompt_token_count=tokens_in, candidates_token_count=tokens_out,
                                  total_token_count=tokens_in + tokens_out))

    def lookup_order(order_id: str) -> str:
        """Look an order up by its id."""
        assert order_id == s.LOOKUP_ARGS["order_id"]
        return s.LOOKUP_RESULT

    specialist = LlmAgent(name=s.SPECIALIST, model=Scripted(model=s.ADK_MODEL, agent=s.SPECIALIST),
                          instruction=s.SPECIALIST_INSTRUCTIONS, description="Issues refunds.")
    triage = LlmAgent(name=s.TRIAGE, model=Scripted(model=s.ADK_MODEL, agent=s.TRIAGE),
                      instruction=s.TRIAGE_INSTRUCTIONS, tools=[lookup_order], sub_agents=[specialist])

    async def run() -> str:
        runner = InMemoryRunner(agent=triage, app_name=s.ADK_APP)
        await runner.session_service.create_session(app_name=s.ADK_APP, user_id="user-1", session_id=s.ADK_SESSION)
        text = ""
        async for event in runner.run_async(user_id="user-1", session_id=s.ADK_SESSION, new_message=types.Content(
                role="user", parts=[types.Part(text=s.AGENTS_USER)])):
            if event.content and event.content.parts and event.content.parts[0].text:
                text = event.content.parts[0].text
        return text

    answer = asyncio.run(run())
    assert answer == s.SPECIALIST_ANSWER, answer
    assert next(calls, None) is None, "the program made fewer model calls than scripted"


def _framework(name: str, **options: Any) -> Any:
    """The program of ``tests/otel_corpus/recorders/<name>.py`` (run in the framework's own environment)."""
    def run(provider: Any, instrumentation: str) -> None:
        importlib.import_module(f"tests.otel_corpus.recorders.{name}").run(provider, instrumentation, **options)
    return run


PROGRAMS = {"openai_agents": _openai_agents, "langgraph": _langgraph, "adk": _adk,
            **{name: functools.partial(_langgraph_shape, name) for name in s.LANGGRAPH_SHAPES},
            **{name: _framework(name) for name in fw.FRAMEWORKS},
            "autogen_spanned": _framework("autogen", root_span=True)}
#: The module a case beside the grid needs (the frameworks extra installs it; without it the rest is recorded).
_NEEDS = {"adk.genai": "google.adk", "adk.openinference": "openinference.instrumentation.google_adk"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def record_one(program: str, instrumentation: str) -> list[Path]:
    """Run one program under one instrumentation and write its request bodies next to this file."""
    _forbid_network()
    os.environ.setdefault("OPENAI_API_KEY", "sk-offline")  # some clients insist on one; nothing is sent
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    name = f"{program}.{instrumentation}"
    provider, server = _capturing_provider(name)
    PROGRAMS[program](provider, instrumentation)
    provider.force_flush()
    provider.shutdown()
    server.shutdown()
    for old in HERE.glob(f"{name}*.pb.gz"):
        old.unlink()
    bodies = _Capture.bodies
    paths = [HERE / (f"{name}.pb.gz" if len(bodies) == 1 else f"{name}.{i + 1}.pb.gz") for i in range(len(bodies))]
    for path, body in zip(paths, bodies, strict=True):
        path.write_bytes(body)
    return paths


def export_live(program: str, instrumentation: str, save: Path | None = None) -> None:
    """Run one program, its spans exported as ``OTEL_EXPORTER_OTLP_*`` say (each request's body saved in ``save``).

    Raises:
        SystemExit: an export did not succeed (the exporter gave up or was refused).
    """
    _forbid_network()
    os.environ.setdefault("OPENAI_API_KEY", "sk-offline")
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    exporter = _checked(OTLPSpanExporter(), save)  # configured by the environment only, as a user's is
    provider = _provider(f"{program}.{instrumentation}", exporter)
    PROGRAMS[program](provider, instrumentation)
    provider.force_flush()
    provider.shutdown()
    results = [r.name for r in exporter.results]
    if not results or set(results) != {"SUCCESS"}:
        raise SystemExit(f"exports: {results}")
    print(f"exports: {results}")


def show(name: str) -> str:
    from google.protobuf import json_format

    from agentlog.worker.otlp import decode_request

    return "\n".join(json_format.MessageToJson(decode_request(p.read_bytes(), "application/x-protobuf", "gzip"))
                     for p in sorted(HERE.glob(f"{name}*.pb.gz")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--one", help="program.instrumentation: record this one in this process")
    parser.add_argument("--show", help="program.instrumentation: print the fixture as OTLP JSON")
    parser.add_argument("--live", help="program.instrumentation: run it, exporting as OTEL_EXPORTER_OTLP_* say")
    parser.add_argument("--save", type=Path, help="with --live: write each request body sent into this directory")
    parser.add_argument("--frameworks", nargs="*", metavar="NAME",
                        help=f"record these frameworks' cases (all without a name), each in its own environment: "
                             f"{', '.join(fw.FRAMEWORKS)}")
    args = parser.parse_args()
    if args.show:
        print(show(args.show))
        return
    if args.live:
        program, instrumentation = args.live.split(".")
        export_live(program, instrumentation, args.save)
        return
    if args.one:
        program, instrumentation = args.one.split(".")
        for path in record_one(program, instrumentation):
            print(f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}: "
                  f"{path.stat().st_size} bytes")
        return
    selected = fw.FRAMEWORKS if args.frameworks == [] else args.frameworks
    if selected is not None:  # each in the framework's own environment (tests/otel_corpus/envs.py)
        from tests.otel_corpus import envs

        for program, instrumentation, framework in (*((p, i, p) for p, i in fw.CASES), *fw.SPANNED_CASES):
            if framework in selected:
                subprocess.run([str(envs.ensure(framework)), "-m", "tests.otel_corpus.record", "--one",
                                f"{program}.{instrumentation}"], check=True, cwd=HERE.parents[1],
                               env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})
        return
    cases = [(p, i) for p in (*s.PROGRAMS, *s.LANGGRAPH_SHAPES) for i in s.INSTRUMENTATIONS]
    for program, instrumentation in s.EXTRA_CASES:
        need = _NEEDS[f"{program}.{instrumentation}"]
        if not _installed(need):
            print(f"{program}.{instrumentation}: not recorded, {need} is not installed here")
        else:
            cases.append((program, instrumentation))
    for program, instrumentation in cases:
        subprocess.run([sys.executable, "-m", "tests.otel_corpus.record", "--one",
                        f"{program}.{instrumentation}"], check=True)


if __name__ == "__main__":
    main()
