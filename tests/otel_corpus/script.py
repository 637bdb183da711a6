"""What the corpus programs do, written once: the recorder drives the fake models from it and
the corpus tests take their expectations from it (never from the mapping).

No framework imports here: the unit tests read this module without the frameworks installed.
"""

from __future__ import annotations

# --- OpenAI Agents SDK: a triage agent looks an order up, then hands off to a refund specialist --------------
AGENTS_GROUP = "support-conv-7"  # RunConfig.group_id: the SDK's conversation/thread id
AGENTS_WORKFLOW = "support"  # RunConfig.workflow_name: the name of the trace's root span
AGENTS_USER = "I want a refund for order 42."
TRIAGE, SPECIALIST = "triage", "refund_specialist"
TRIAGE_INSTRUCTIONS = "Look the order up, then hand refunds to the refund specialist."
SPECIALIST_INSTRUCTIONS = "Issue the refund and confirm it."
LOOKUP_TOOL = "lookup_order"
LOOKUP_ARGS = {"order_id": "42"}
LOOKUP_RESULT = "order 42: blue kettle, 39 EUR, delivered"
HANDOFF_TOOL = "transfer_to_refund_specialist"  # the SDK's default handoff tool name
SPECIALIST_ANSWER = "Refund of 39 EUR issued for order 42."
AGENTS_MODEL = "scripted-gpt"
#: The model calls in order: (agent, what it answers, input tokens, output tokens).
AGENTS_CALLS = [
    (TRIAGE, "tool_call", 31, 7),
    (TRIAGE, "handoff", 58, 9),
    (SPECIALIST, "text", 64, 12),
]

# --- LangGraph: a supervisor routes to a researcher subgraph (a ReAct agent with a tool) ---------------------
GRAPH_THREAD = "thread-research-3"  # config["configurable"]["thread_id"]
GRAPH_USER = "Find work on event sourcing for agents."
SUPERVISOR, RESEARCHER = "supervisor", "researcher"
ROUTE_TOOL = "transfer_to_researcher"
SEARCH_TOOL = "search_papers"
SEARCH_ARGS = {"query": "event sourcing agents"}
SEARCH_RESULT = "3 papers: Replaying agent runs; Event logs for LLMs; Handoffs as events"
RESEARCHER_ANSWER = "Found 3 papers on event sourcing for agents."
SUPERVISOR_ANSWER = "The researcher found 3 papers."
SUPERVISOR_MODEL, RESEARCHER_MODEL = "scripted-supervisor", "scripted-researcher"
#: The model calls in order: (node, what it answers, input tokens, output tokens).
GRAPH_CALLS = [
    (SUPERVISOR, "route", 20, 5),
    (RESEARCHER, "tool_call", 25, 8),
    (RESEARCHER, "text", 40, 11),
    (SUPERVISOR, "text", 52, 9),
]

PROGRAMS = ("openai_agents", "langgraph")
INSTRUMENTATIONS = ("openllmetry", "openinference")

# --- Google ADK: the support program again, as ADK writes it: a root agent with a tool and a sub-agent it
# transfers to (ADK's built-in transfer_to_agent tool) ------------------------------------------------------
ADK_APP = "support"  # the Runner's app name
ADK_SESSION = "support-session-9"  # the session id: ADK's gen_ai.conversation.id
ADK_MODEL = "scripted-gemini"
ADK_TRANSFER_TOOL = "transfer_to_agent"
#: The model calls in order: the OpenAI Agents program's (the handoff is ADK's transfer_to_agent call).
ADK_CALLS = AGENTS_CALLS
#: Recorded beside the 2 × 2 grid above: (program, instrumentation). ADK's own OpenTelemetry
#: instrumentation (GenAI semantic conventions) and OpenInference's ADK instrumentor (on ADK's
#: legacy telemetry schema, see tests/otel_corpus/record.py).
EXTRA_CASES = (("adk", "genai"), ("adk", "openinference"))

# --- LangGraph, every way one agent hands control to another --------------------------------------------------
# Each program is recorded under both LangChain instrumentations (``<program>.<instrumentation>.pb.gz``) and
# checked by tests/unit/core/test_otel_langgraph.py. A model call is (agent, reply, input tokens, output tokens,
# when): the reply is {"tool": name, "args": {...}} (one tool call, id ``call_<index in the list>``) or {"text":
# ...}; ``when``, if not None, is text the agent's last user message holds (concurrent workers of one agent are
# told apart by it, not by the order they call in). The scripted model answers each agent's calls in order.
WRITER = "writer"
WRITER_MODEL = "scripted-writer"
WRITER_ANSWER = "Summary: replaying agent runs needs their events."
ROUTED_FINAL = "The researcher and the writer are done."
SEARCH_CALL = {"tool": SEARCH_TOOL, "args": SEARCH_ARGS}
TO_RESEARCHER, TO_WRITER = "transfer_to_researcher", "transfer_to_writer"
FORMATTER = "formatter"  # a plain node (no model, no subgraph): it stays a node of the run it is in
FORMATTED = "Report: The researcher and the writer are done."

#: ``add_conditional_edges``: a supervisor node (a function calling its model) routes to a researcher that is a
#: compiled StateGraph of its own (model → ToolNode → model), then to a writer made by ``create_react_agent``,
#: then to a plain formatter node; the routing function reads the supervisor's transfer_to_<agent> tool call.
ROUTED_THREAD = "thread-routed-1"
ROUTED_CALLS = [
    (SUPERVISOR, {"tool": TO_RESEARCHER, "args": {}}, 20, 5, None),
    (RESEARCHER, SEARCH_CALL, 25, 8, None),
    (RESEARCHER, {"text": RESEARCHER_ANSWER}, 40, 11, None),
    (SUPERVISOR, {"tool": TO_WRITER, "args": {}}, 52, 6, None),
    (WRITER, {"text": WRITER_ANSWER}, 60, 14, None),
    (SUPERVISOR, {"text": ROUTED_FINAL}, 70, 9, None),
]

#: ``Command(graph=Command.PARENT, goto=...)``: the researcher, a subgraph and the graph's first node, searches,
#: then one of its own nodes hands control to the writer (a sibling in the parent graph) from inside it.
PARENT_THREAD = "thread-parent-2"
PARENT_CALLS = [
    (RESEARCHER, SEARCH_CALL, 25, 8, None),
    (RESEARCHER, {"tool": TO_WRITER, "args": {}}, 40, 6, None),
    (WRITER, {"text": WRITER_ANSWER}, 60, 14, None),
]

#: ``langgraph_supervisor.create_supervisor``: the supervisor agent calls its transfer_to_researcher handoff tool;
#: the researcher (``create_react_agent``) searches and answers; control returns to the supervisor, which answers.
SUPERVISOR_THREAD = "thread-supervisor-4"
SUPERVISOR_CALLS = [
    (SUPERVISOR, {"tool": TO_RESEARCHER, "args": {}}, 20, 5, None),
    (RESEARCHER, SEARCH_CALL, 25, 8, None),
    (RESEARCHER, {"text": RESEARCHER_ANSWER}, 40, 11, None),
    (SUPERVISOR, {"text": SUPERVISOR_ANSWER}, 52, 9, None),
]

#: ``langgraph_swarm.create_swarm``: the researcher (the default active agent) searches, then hands off with the
#: tool ``create_handoff_tool(agent_name="writer")`` made; the writer answers.
SWARM_THREAD = "thread-swarm-5"
SWARM_CALLS = PARENT_CALLS

#: ``Send`` fan-out: a planner node (a function calling its model) sends each topic to a ``worker`` agent
#: (``create_react_agent``), the workers run in one step, concurrently, each searching its topic and answering; a
#: plain node joins their answers.
SEND_THREAD = "thread-send-6"
PLANNER, WORKER, JOINER = "planner", "worker", "join"
TOPICS = ("event logs", "handoffs")
PLAN = "Two topics: event logs, handoffs."
SEND_CALLS = [
    (PLANNER, {"text": PLAN}, 18, 6, None),
    (WORKER, {"tool": SEARCH_TOOL, "args": {"query": TOPICS[0]}}, 22, 7, TOPICS[0]),
    (WORKER, {"tool": SEARCH_TOOL, "args": {"query": TOPICS[1]}}, 23, 8, TOPICS[1]),
    (WORKER, {"text": f"Found papers on {TOPICS[0]}."}, 30, 10, TOPICS[0]),
    (WORKER, {"text": f"Found papers on {TOPICS[1]}."}, 31, 12, TOPICS[1]),
]
#: What the search tool answers for each topic of the fan-out.
TOPIC_RESULTS = {TOPICS[0]: "2 papers on event logs", TOPICS[1]: "1 paper on handoffs"}

#: Compiled graphs invoked inside node functions (``def researcher(state): return research.invoke(state)``), not
#: added as nodes: the supervisor node calls transfer_to_researcher, a conditional edge routes to the researcher
#: node, whose function runs the researcher's own graph (model → ToolNode → model); control returns to the
#: supervisor, which answers; the formatter node's function runs a graph of one plain node (no model).
INVOKED_THREAD = "thread-invoked-7"
INVOKED_CALLS = [
    (SUPERVISOR, {"tool": TO_RESEARCHER, "args": {}}, 20, 5, None),
    (RESEARCHER, SEARCH_CALL, 25, 8, None),
    (RESEARCHER, {"text": RESEARCHER_ANSWER}, 40, 11, None),
    (SUPERVISOR, {"text": SUPERVISOR_ANSWER}, 52, 9, None),
]

#: program → (thread id, model calls). Recorded under INSTRUMENTATIONS.
LANGGRAPH_SHAPES = {
    "lg_routed": (ROUTED_THREAD, ROUTED_CALLS),
    "lg_parent": (PARENT_THREAD, PARENT_CALLS),
    "lg_supervisor": (SUPERVISOR_THREAD, SUPERVISOR_CALLS),
    "lg_swarm": (SWARM_THREAD, SWARM_CALLS),
    "lg_send": (SEND_THREAD, SEND_CALLS),
    "lg_invoked": (INVOKED_THREAD, INVOKED_CALLS),
}
