"""smolagents under OpenInference: a supervisor ToolCallingAgent with the researcher as its managed agent."""

from __future__ import annotations

from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as f
from tests.otel_corpus.fake_openai import FakeOpenAI
from tests.otel_corpus.recorders import replies


def run(provider: Any, instrumentation: str) -> None:
    assert instrumentation == "openinference", instrumentation
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    fake = FakeOpenAI(replies("smolagents"))

    @tool
    def search_papers(query: str) -> str:
        """Search papers.

        Args:
            query: what to search for
        """
        assert query == s.SEARCH_ARGS["query"]
        return s.SEARCH_RESULT

    def model(agent: str) -> Any:
        return OpenAIServerModel(model_id=f.model(agent), api_base=fake.base_url, api_key="sk-offline")

    researcher = ToolCallingAgent(tools=[search_papers], model=model(s.RESEARCHER), name=s.RESEARCHER,
                                  description="Searches papers.", max_steps=3, verbosity_level=0)
    supervisor = ToolCallingAgent(tools=[], model=model(s.SUPERVISOR), managed_agents=[researcher],
                                  name=s.SUPERVISOR, max_steps=3, verbosity_level=0)
    try:
        answer = supervisor.run(f.CREW_TASK)
    finally:
        fake.close()
    assert answer == s.SUPERVISOR_ANSWER, answer
    fake.check_done()
