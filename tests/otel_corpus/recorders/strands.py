"""Strands ``Swarm``: triage looks the order up and hands off to the refund specialist (``handoff_to_agent``).

``genai``: Strands' own telemetry (GenAI conventions, through the global tracer provider; the latest experimental
conventions put the messages in ``gen_ai.client.inference.operation.details`` events). ``openinference``:
OpenInference's span processor rewriting the same spans to its conventions before they are exported.
"""

from __future__ import annotations

import os
from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as f
from tests.otel_corpus.fake_openai import FakeOpenAI
from tests.otel_corpus.recorders import replies


def run(provider: Any, instrumentation: str) -> None:
    from opentelemetry import trace

    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    if instrumentation == "openinference":
        from openinference.instrumentation.strands_agents import StrandsAgentsToOpenInferenceProcessor

        provider.add_span_processor(StrandsAgentsToOpenInferenceProcessor())
    else:
        assert instrumentation == "genai", instrumentation
    trace.set_tracer_provider(provider)
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel
    from strands.multiagent import Swarm

    fake = FakeOpenAI(replies("strands"))

    @tool
    def lookup_order(order_id: str) -> str:
        """Look an order up by its id."""
        assert order_id == s.LOOKUP_ARGS["order_id"]
        return s.LOOKUP_RESULT

    def model(agent: str) -> Any:
        return OpenAIModel(client_args={"base_url": fake.base_url, "api_key": "sk-offline"}, model_id=f.model(agent))

    triage = Agent(name=s.TRIAGE, model=model(s.TRIAGE), system_prompt=s.TRIAGE_INSTRUCTIONS, tools=[lookup_order],
                   callback_handler=None)
    specialist = Agent(name=s.SPECIALIST, model=model(s.SPECIALIST), system_prompt=s.SPECIALIST_INSTRUCTIONS,
                       callback_handler=None)
    try:
        result = Swarm([triage, specialist], entry_point=triage)(s.AGENTS_USER)
    finally:
        fake.close()
    assert str(result.status) == "Status.COMPLETED", result.status
    answer = str(result.results[s.SPECIALIST].result).strip()
    assert answer == s.SPECIALIST_ANSWER, answer
    fake.check_done()
