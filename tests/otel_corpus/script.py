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
