"""AutoGen AgentChat ``Swarm``: triage looks the order up and hands off (``transfer_to_refund_specialist``).

``genai``: AutoGen's own spans (``invoke_agent``, ``execute_tool``; through the global tracer provider) and, for
the model calls, which AutoGen does not trace, OpenLLMetry's OpenAI instrumentor, as AutoGen's tracing guide sets
it up. ``openinference``: OpenInference's AgentChat instrumentor (AutoGen's own spans come along).

Under ``genai`` the program opens a span around the team's run, as AutoGen's tracing guide does: without it each
message of AutoGen's runtime starts a trace of its own. OpenInference's instrumentor opens one itself (the team's
``run_stream``), so the program adds only the instrumentor lines; ``root_span=True`` opens the guide's span there
too (the ``autogen_spanned`` program).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as f
from tests.otel_corpus.fake_openai import FakeOpenAI
from tests.otel_corpus.recorders import replies


def run(provider: Any, instrumentation: str, *, root_span: bool | None = None) -> None:
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    if instrumentation == "openinference":
        from openinference.instrumentation.autogen_agentchat import AutogenAgentChatInstrumentor

        AutogenAgentChatInstrumentor().instrument(tracer_provider=provider)
    else:
        assert instrumentation == "genai", instrumentation
        os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import SourceMatchTermination
    from autogen_agentchat.teams import Swarm
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    if root_span is None:
        root_span = instrumentation == "genai"
    fake = FakeOpenAI(replies("autogen"))

    async def lookup_order(order_id: str) -> str:
        """Look an order up by its id."""
        assert order_id == s.LOOKUP_ARGS["order_id"]
        return s.LOOKUP_RESULT

    info = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
            "structured_output": False}

    def client(agent: str) -> Any:
        return OpenAIChatCompletionClient(model=f.model(agent), base_url=fake.base_url, api_key="sk-offline",
                                          model_info=info)

    triage = AssistantAgent(s.TRIAGE, model_client=client(s.TRIAGE), system_message=s.TRIAGE_INSTRUCTIONS,
                            tools=[lookup_order], handoffs=[s.SPECIALIST])
    specialist = AssistantAgent(s.SPECIALIST, model_client=client(s.SPECIALIST),
                                system_message=s.SPECIALIST_INSTRUCTIONS)
    team = Swarm([triage, specialist], termination_condition=SourceMatchTermination([s.SPECIALIST]))

    async def spanned() -> Any:
        with trace.get_tracer("agentlog-corpus").start_as_current_span(f.AUTOGEN_ROOT_SPAN):
            return await team.run(task=s.AGENTS_USER)

    try:
        result = asyncio.run(spanned() if root_span else team.run(task=s.AGENTS_USER))
    finally:
        fake.close()
    answer = result.messages[-1].content
    assert answer == s.SPECIALIST_ANSWER, answer
    fake.check_done()
