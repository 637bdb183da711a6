"""CrewAI under OpenInference: a hierarchical crew whose manager (the supervisor) delegates to a researcher with a
tool. CrewAI's model calls go through the ``openai`` client, which OpenInference's OpenAI instrumentor records."""

from __future__ import annotations

import os
from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as f
from tests.otel_corpus.fake_openai import FakeOpenAI
from tests.otel_corpus.recorders import replies


def run(provider: Any, instrumentation: str) -> None:
    assert instrumentation == "openinference", instrumentation
    # CrewAI's own telemetry and tracing go to CrewAI's service: off (the recorder is offline anyway).
    os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
    os.environ["CREWAI_TRACING_ENABLED"] = "false"
    from openinference.instrumentation.crewai import CrewAIInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor

    CrewAIInstrumentor().instrument(tracer_provider=provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    from crewai import LLM, Agent, Crew, Process, Task
    from crewai.tools import tool

    fake = FakeOpenAI(replies("crewai"))

    @tool(s.SEARCH_TOOL)
    def search_papers(query: str) -> str:
        """Search papers."""
        assert query == s.SEARCH_ARGS["query"]
        return s.SEARCH_RESULT

    def llm(agent: str) -> Any:
        return LLM(model=f"openai/{f.model(agent)}", base_url=fake.base_url, api_key="sk-offline")

    researcher = Agent(role=s.RESEARCHER, goal="Find papers.", backstory="You search papers.", tools=[search_papers],
                       llm=llm(s.RESEARCHER), allow_delegation=False)
    supervisor = Agent(role=s.SUPERVISOR, goal="Answer with the researcher's help.", backstory="You delegate research.",
                       llm=llm(s.SUPERVISOR), allow_delegation=True)
    crew = Crew(agents=[researcher], tasks=[Task(description=f.CREW_TASK, expected_output="A one-line summary.")],
                process=Process.hierarchical, manager_agent=supervisor)
    try:
        answer = str(crew.kickoff())
    finally:
        fake.close()
    assert answer == s.SUPERVISOR_ANSWER, answer
    fake.check_done()
