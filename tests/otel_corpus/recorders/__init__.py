"""The CrewAI, LlamaIndex, smolagents, Strands and AutoGen corpus programs, one module per framework.

Each module's ``run(provider, instrumentation)`` sets the instrumentation up on ``provider``, runs its program
against :class:`~tests.otel_corpus.fake_openai.FakeOpenAI` answering :func:`replies` and checks that every scripted
call was made. They run in the framework's own environment (:mod:`tests.otel_corpus.envs`), started by
:mod:`tests.otel_corpus.record`.
"""

from __future__ import annotations

from typing import Any

from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as f
from tests.otel_corpus.fake_openai import Reply


def replies(framework: str) -> list[Reply]:
    """The fake model's answers for ``framework``'s program, call by call, from the script."""
    out = []
    for i, (agent, kind, tokens_in, tokens_out) in enumerate(f.CALLS[framework]):
        call = f"call_{i}"
        text: str | None = None
        calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()
        if kind == "tool_call":
            calls = ((call, s.SEARCH_TOOL, dict(s.SEARCH_ARGS)),) if agent == s.RESEARCHER else (
                (call, s.LOOKUP_TOOL, dict(s.LOOKUP_ARGS)),)
        elif kind == "delegate":
            args = ({"task": f.CREW_TASK, "context": f.DELEGATE_CONTEXT, "coworker": s.RESEARCHER}
                    if framework == "crewai" else {"task": f.CREW_TASK})
            calls = ((call, f.HANDOFF_TOOL[framework], args),)
        elif kind == "handoff":
            args = {"llama_index": {"to_agent": s.SPECIALIST, "reason": f.HANDOFF_REASON},
                    "strands": {"agent_name": s.SPECIALIST, "message": f.STRANDS_HANDOFF_MESSAGE}}.get(framework, {})
            calls = ((call, f.HANDOFF_TOOL[framework], args),)
        else:
            text = {s.RESEARCHER: s.RESEARCHER_ANSWER, s.SUPERVISOR: s.SUPERVISOR_ANSWER,
                    s.SPECIALIST: s.SPECIALIST_ANSWER, s.TRIAGE: f.STRANDS_AFTER_HANDOFF}[agent]
            if framework == "smolagents":  # a ToolCallingAgent answers by calling final_answer
                text, calls = None, ((call, f.FINAL_ANSWER_TOOL, {"answer": text}),)
        out.append(Reply(f.model(agent), tokens_in, tokens_out, text=text, tool_calls=calls))
    return out
