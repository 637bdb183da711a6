"""The demo's instrumented agents (pydantic-ai, offline on ``TestModel``).

A module of its own because pydantic-ai, an optional dependency, reads a tool's
``RunContext`` annotation from the module's globals: it is imported here at the top, and
this module only when the OpenTelemetry demo (or its tests) run.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.test import TestModel


def run_planner(provider: Any, prompt: str = "plan a trip to Lisbon") -> Any:
    """Run planner → ``delegate`` tool → researcher once; spans go to ``provider``'s processors.

    pydantic-ai gives each agent run its own ``gen_ai.conversation.id``, so the researcher's
    run is a child run of the planner's.
    """
    settings = InstrumentationSettings(tracer_provider=provider, include_content=True)
    researcher = Agent(TestModel(custom_output_text="Lisbon: trams, tiles, pastel de nata"), name="researcher")
    planner = Agent(TestModel(), name="planner")
    researcher.instrument = settings
    planner.instrument = settings

    @planner.tool
    async def delegate(ctx: RunContext[object], question: str) -> str:
        """Ask the researcher agent."""
        result = await researcher.run(question, usage=ctx.usage)
        return str(result.output)

    return planner.run_sync(prompt)
