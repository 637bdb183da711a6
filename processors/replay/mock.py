"""Mock mode (RFC 0041 §C): the recorded observable results for a replaying host.

A host replaying a run in mock mode asks the session instead of the model or the
tool, and gets what the original run observed, keyed as RFC 0041 §C keys it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentlog.core.result_cache import ReplayCacheMiss, ResultCache, tool_cache_key
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import ReplayError
from agentlog.streams.reader import read_run
from agentlog.streams.settings import Settings

__all__ = ["MockReplaySession", "ReplayCacheMiss", "describe_miss", "load_result_cache", "open_mock_session"]


async def load_result_cache(settings: Settings, source_run_id: str) -> ResultCache:
    """The observable-result cache of a recorded run, read back from its committed log.

    Raises:
        ReplayError: the run has no committed events.
    """
    committed = await read_run(settings, source_run_id, refuse_erased=True)
    if not committed:
        raise ReplayError(f"run {source_run_id} has no committed events in {settings.topic_prefix}.log; "
                          "nothing to replay in mock mode")
    return ResultCache.from_events([c["doc"] for c in committed])


class MockReplaySession:
    """What a host replaying ``source_run_id`` in mock mode asks instead of the model or the tool.

    Lookups are by (nodeId, attempt, cacheKey) as RFC 0041 §C keys them; the same call made
    again in the same attempt gets the next recorded result (the session counts occurrences).
    A call the original never made raises: in mock mode there is nothing honest to return. The
    session also counts the calls of each kind asked at a node and attempt, so a miss is held
    against the recorded call at the same position first (:meth:`ResultCache.diagnose`).
    """

    def __init__(self, cache: ResultCache, source_run_id: str,
                 redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.cache = cache
        self.source_run_id = source_run_id
        #: The deployment's redaction of a request, for a recording the sequencer redacted: a call that misses
        #: by its key is looked up by the key of its request redacted, which is how the recording keeps it.
        self.redact = redact
        self._occurrences: dict[tuple[str | None, int, str], int] = {}
        self._positions: dict[tuple[str | None, int, str], int] = {}

    def _next(self, node_id: str | None, attempt: int, key: str, what: str, kind: str,
              **asked: Any) -> dict[str, Any]:
        ident = (node_id, attempt, key)
        n = self._occurrences.get(ident, 0)
        position = self._positions.get((node_id, attempt, kind), 0)
        self._positions[(node_id, attempt, kind)] = position + 1
        found = self.cache.lookup(self.source_run_id, node_id, attempt, key, occurrence=n)
        if found is None:
            diagnosis = self.cache.diagnose(self.source_run_id, node_id, attempt, key, occurrence=n,
                                            position=position, **asked)
            raise ReplayCacheMiss(
                f"mock replay of {self.source_run_id}: no recorded {what} for node {node_id!r}, attempt {attempt}, "
                f"key {key[:12]}… (occurrence {n}): {describe_miss(diagnosis)}", diagnosis=diagnosis)
        self._occurrences[ident] = n + 1
        return found

    def recorded_llm(
        self, node_id: str | None, attempt: int, cache_key: str, request: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """``{"kind": "valid", "envelope", "usage"?}`` or ``{"kind": "refusal", "reason"?}``.

        Pass the ``request`` the key was computed from and a miss says which field changed the key.
        """
        if (self.redact is not None and request is not None
                and self.cache.lookup(self.source_run_id, node_id, attempt, cache_key) is None):
            cache_key = self.cache.redacted_key(self.source_run_id, node_id, attempt, request,
                                                self.redact) or cache_key
        return self._next(node_id, attempt, cache_key, "LLM result", "llm", request=request)

    def recorded_tool(self, node_id: str | None, attempt: int, tool: str, args: Any) -> Any:
        """The tool's recorded return value for this call."""
        return self._next(node_id, attempt, tool_cache_key(tool, args), f"result of tool {tool!r}", "tool",
                          tool=tool, args=args)["result"]


def describe_miss(diagnosis: dict[str, Any]) -> str:
    """One paragraph for a human: why the call missed and the first differing fields."""
    text = str(diagnosis.get("reason", "no recorded call"))
    for d in diagnosis.get("diff", [])[:5]:
        text += f"; {d['path']}: recorded {jcs(d['recorded']).decode()} ≠ requested {jcs(d['requested']).decode()}"
    return text


async def open_mock_session(settings: Settings, source_run_id: str) -> MockReplaySession:
    """A :class:`MockReplaySession` over the recorded results of ``source_run_id``."""
    return MockReplaySession(await load_result_cache(settings, source_run_id), source_run_id)
