"""What the CrewAI, LlamaIndex, smolagents, Strands and AutoGen corpus programs do, written once: the recorder's
fake OpenAI server answers from it and the corpus tests take their expectations from it (never from the mapping).

Two stories, both from :mod:`tests.otel_corpus.script`:

* **delegation** (CrewAI's hierarchical crew, smolagents' managed agent): a supervisor delegates a search to a
  researcher, who calls ``search_papers`` and answers; the supervisor sums up;
* **handoff** (LlamaIndex ``AgentWorkflow``, Strands ``Swarm``, AutoGen ``Swarm``): triage looks the order up with
  ``lookup_order`` and hands off to the refund specialist, who confirms the refund.

Every agent has a model of its own, ``scripted-<agent>``, so the fake knows which agent asks. No framework
imports here: the unit tests read this module without the frameworks installed.
"""

from __future__ import annotations

from tests.otel_corpus import script as s

MODEL_PREFIX = "scripted-"


def model(agent: str) -> str:
    return f"{MODEL_PREFIX}{agent}"


#: Each case's instrumentation: (framework, instrumentation). ``genai``: the framework's own telemetry.
CASES = (
    ("crewai", "openinference"),
    ("llama_index", "openinference"),
    ("smolagents", "openinference"),
    ("strands", "genai"),
    ("strands", "openinference"),
    ("autogen", "genai"),
    ("autogen", "openinference"),
)
FRAMEWORKS = tuple(dict.fromkeys(f for f, _ in CASES))

# --- the delegation story ------------------------------------------------------------------------------------------
CREW_TASK = "Find work on event sourcing for agents."
DELEGATE_TOOL = "delegate_work_to_coworker"  # CrewAI's delegation tool as the model calls it
DELEGATE_CONTEXT = "For a survey of agent logs."
FINAL_ANSWER_TOOL = "final_answer"  # smolagents' ToolCallingAgent answers through this tool

#: The model calls in order: (agent, what it answers, input tokens, output tokens). ``delegate``: the supervisor's
#: call of its delegation tool (CrewAI) or of the researcher as a managed agent (smolagents).
DELEGATION_CALLS = [
    (s.SUPERVISOR, "delegate", 20, 5),
    (s.RESEARCHER, "tool_call", 25, 8),
    (s.RESEARCHER, "text", 40, 11),
    (s.SUPERVISOR, "text", 52, 9),
]

# --- the handoff story ---------------------------------------------------------------------------------------------
LLAMA_HANDOFF_TOOL = "handoff"  # AgentWorkflow's handoff tool: handoff(to_agent, reason)
HANDOFF_REASON = "The customer wants a refund."
STRANDS_HANDOFF_TOOL = "handoff_to_agent"  # Swarm's handoff tool: handoff_to_agent(agent_name, message)
STRANDS_HANDOFF_MESSAGE = "Refund order 42."
STRANDS_AFTER_HANDOFF = "The refund specialist takes it from here."
AUTOGEN_HANDOFF_TOOL = f"transfer_to_{s.SPECIALIST}"  # AssistantAgent(handoffs=[...])'s tool

HANDOFF_CALLS = s.AGENTS_CALLS  # triage: lookup, then the handoff; the specialist: the answer
#: Strands' triage agent answers once more after its handoff tool returns, before the swarm moves on.
STRANDS_CALLS = [*HANDOFF_CALLS[:2], (s.TRIAGE, "text", 70, 6), HANDOFF_CALLS[2]]

CALLS = {"crewai": DELEGATION_CALLS, "smolagents": DELEGATION_CALLS, "llama_index": HANDOFF_CALLS,
         "strands": STRANDS_CALLS, "autogen": HANDOFF_CALLS}
#: (the agent handing off or delegating, the agent taking over) per framework.
AGENTS = {"crewai": (s.SUPERVISOR, s.RESEARCHER), "smolagents": (s.SUPERVISOR, s.RESEARCHER),
          "llama_index": (s.TRIAGE, s.SPECIALIST), "strands": (s.TRIAGE, s.SPECIALIST),
          "autogen": (s.TRIAGE, s.SPECIALIST)}
#: The model's handoff or delegation tool per framework, as the model calls it.
HANDOFF_TOOL = {"crewai": DELEGATE_TOOL, "smolagents": s.RESEARCHER, "llama_index": LLAMA_HANDOFF_TOOL,
                "strands": STRANDS_HANDOFF_TOOL, "autogen": AUTOGEN_HANDOFF_TOOL}
#: AutoGen's team run inside a span the program opens, as AutoGen's tracing guide does (its runtime's spans
#: are otherwise each a trace of their own): under its own telemetry always, under OpenInference (whose
#: instrumentor opens the team's span itself) in the ``autogen_spanned`` program.
AUTOGEN_ROOT_SPAN = "support"
#: Programs beside the grid, (program, instrumentation, framework whose environment and script they use).
SPANNED_CASES = (("autogen_spanned", "openinference", "autogen"),)
