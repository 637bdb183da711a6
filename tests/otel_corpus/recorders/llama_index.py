"""LlamaIndex ``AgentWorkflow`` under OpenInference: triage looks the order up and hands off to the refund agent.

The model is ``OpenAILike`` (LlamaIndex's client for OpenAI-compatible servers), streaming as ``FunctionAgent``
does by default; ``stream_options.include_usage`` asks for the token counts a stream otherwise leaves out.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as f
from tests.otel_corpus.fake_openai import FakeOpenAI
from tests.otel_corpus.recorders import replies


def run(provider: Any, instrumentation: str) -> None:
    assert instrumentation == "openinference", instrumentation
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
    from llama_index.llms.openai_like import OpenAILike

    fake = FakeOpenAI(replies("llama_index"))

    def lookup_order(order_id: str) -> str:
        """Look an order up by its id."""
        assert order_id == s.LOOKUP_ARGS["order_id"]
        return s.LOOKUP_RESULT

    def llm(agent: str) -> Any:
        return OpenAILike(model=f.model(agent), api_base=fake.base_url, api_key="sk-offline", is_chat_model=True,
                          is_function_calling_model=True, context_window=8000,
                          additional_kwargs={"stream_options": {"include_usage": True}})

    triage = FunctionAgent(name=s.TRIAGE, description="Looks orders up.", system_prompt=s.TRIAGE_INSTRUCTIONS,
                           tools=[lookup_order], llm=llm(s.TRIAGE), can_handoff_to=[s.SPECIALIST])
    specialist = FunctionAgent(name=s.SPECIALIST, description="Issues refunds.",
                               system_prompt=s.SPECIALIST_INSTRUCTIONS, tools=[], llm=llm(s.SPECIALIST))
    workflow = AgentWorkflow(agents=[triage, specialist], root_agent=s.TRIAGE)
    async def support() -> Any:
        return await workflow.run(user_msg=s.AGENTS_USER)

    try:
        answer = str(asyncio.run(support()))
    finally:
        fake.close()
    assert answer == s.SPECIALIST_ANSWER, answer
    fake.check_done()
