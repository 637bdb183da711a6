"""Recorded results over HTTP: mock-mode replay for a host written in any language.

:class:`agentlog.replay.mock.MockReplaySession` serves a Python host in-process; the worker's
web server (:mod:`agentlog.worker.web`) serves the same observable-result cache at
``/replay/<sourceRunId>/results`` so any host can replay in mock mode with an HTTP client.
HTTP is stateless, so the host says which ``occurrence`` of a repeated call it wants (the
Python session counts them itself).

This module is the answer without the transport — parameters in, ``(status, body)`` out — so
the rules are tested without a web server and the web view stays a thin adapter:

* a hit is ``200 {"sourceRunId", "nodeId", "attempt", "cacheKey", "occurrence", "result"}`` with
  the recorded envelope / refusal / tool result as the cache stores it;
* a miss is ``404 {"error": {"code": "replay_cache_miss", "message"}, "diagnosis"}`` with the
  nearest recorded call for that node and attempt and, when the request was sent (POST), the
  field-level diff that made the key differ (:meth:`ResultCache.diagnose`; ``position``, the
  number of calls of that kind the host made at the node and attempt before, picks among calls
  that differ as little);
* parameters that name no call are ``400 bad_request``; a run with no committed events is
  ``404 replay_source_missing``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from agentlog.core.result_cache import ResultCache, tool_cache_key
from agentlog.replay.mock import describe_miss
from agentlog.schemas.cachekey import cache_key
from agentlog.schemas.errors import AgentlogError

__all__ = ["TERMINAL_TYPES", "ServedResults", "results_answer"]

#: Once a run has one of these, its recorded results can no longer change (safe to keep cached).
TERMINAL_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled"})


def _bad(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"code": "bad_request", "message": message}}


def _int(params: Mapping[str, Any], name: str) -> int | None:
    raw = params.get(name, 0)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def results_answer(cache: ResultCache, source_run_id: str, params: Mapping[str, Any],
                   redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
    """Answer one lookup: ``node``, ``attempt`` (default 0), ``occurrence`` (default 0) and one of
    ``cacheKey`` (an LLM call, or a tool call's key), ``tool`` + ``argsDigest`` (sha256 of the
    JCS arguments) or, in a POST body, ``tool`` + ``args`` / ``request`` (for a field-level diff;
    a request without ``cacheKey`` is keyed with ``recipe``, default v2, RFC 0041 §A); ``position``
    (optional) for the diagnosis of a miss. ``redact``: the deployment's redaction of a request, tried on a miss
    of a call whose request came along (the recording keeps a redacted call under its stored request's key too)."""
    node = params.get("node") or None
    attempt, occurrence = _int(params, "attempt"), _int(params, "occurrence")
    position = _int(params, "position") if params.get("position") is not None else None
    if attempt is None or occurrence is None or (params.get("position") is not None and position is None):
        return _bad("attempt, occurrence and position must be integers >= 0")
    if node is not None and not isinstance(node, str):
        return _bad("node must be a string")
    key, tool, args, request = params.get("cacheKey"), params.get("tool"), params.get("args"), params.get("request")
    if tool is not None:
        if not isinstance(tool, str):
            return _bad("tool must be a string")
        if key is None and isinstance(params.get("argsDigest"), str):
            key = cache.tool_key(source_run_id, node, attempt, tool, params["argsDigest"])
        if key is None and "args" in params:
            key = tool_cache_key(tool, args)
    if key is None and tool is None and isinstance(request, dict):
        try:
            key = cache_key(request, str(params.get("recipe") or "v2"))
        except AgentlogError as e:
            return _bad(f"cannot compute the cache key of this request: {e}")
    if key is not None and not isinstance(key, str):
        return _bad("cacheKey must be a string")
    if key is None and tool is None:
        return _bad("name the call: cacheKey, or tool with argsDigest (or args in a POST body)")
    found = cache.lookup(source_run_id, node, attempt, key, occurrence=occurrence) if key is not None else None
    if found is None and redact is not None and tool is None and isinstance(request, dict):
        stored = cache.redacted_key(source_run_id, node, attempt, request, redact,
                                    recipe=str(params.get("recipe") or "v2"), occurrence=occurrence)
        if stored is not None:
            key, found = stored, cache.lookup(source_run_id, node, attempt, stored, occurrence=occurrence)
    if found is not None:
        return 200, {"sourceRunId": source_run_id, "nodeId": node, "attempt": attempt, "cacheKey": key,
                     "occurrence": occurrence, "result": found}
    diagnosis = cache.diagnose(source_run_id, node, attempt, key, occurrence=occurrence, request=request,
                               tool=tool, args=args, position=position)
    return 404, {"error": {"code": "replay_cache_miss", "message": describe_miss(diagnosis)}, "diagnosis": diagnosis}


class ServedResults:
    """The client of ``/replay/<sourceRunId>/results``: recorded results from a worker, for a Python host
    that has no access to the log (the same lookups as :class:`agentlog.replay.mock.MockReplaySession`).

    Each call is POSTed with its request, so a miss carries the field-level diff; the occurrence of a
    repeated call is counted here, as the in-process session counts it.
    """

    def __init__(self, base_url: str, source_run_id: str, *, timeout_s: float = 30.0) -> None:
        self.url = f"{base_url.rstrip('/')}/replay/{urllib.parse.quote(source_run_id, safe='')}/results"
        self.source_run_id = source_run_id
        self.timeout_s = timeout_s
        self._occurrences: dict[tuple[str | None, int, str], int] = {}
        self._positions: dict[tuple[str | None, int, str], int] = {}

    def _ask(self, node_id: str | None, attempt: int, ident: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        from agentlog.core.result_cache import ReplayCacheMiss
        from agentlog.schemas.errors import ReplayError

        n = self._occurrences.get((node_id, attempt, ident), 0)
        position = self._positions.get((node_id, attempt, kind), 0)
        self._positions[(node_id, attempt, kind)] = position + 1
        data = json.dumps({"node": node_id, "attempt": attempt, "occurrence": n, "position": position,
                           **body}).encode()
        req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            answer = json.loads(e.read() or b"{}")
            error = answer.get("error") or {}
            if e.code == 404 and error.get("code") == "replay_cache_miss":
                raise ReplayCacheMiss(f"mock replay of {self.source_run_id} (served by {self.url}): "
                                      f"{error.get('message')}", diagnosis=answer.get("diagnosis") or {}) from e
            raise ReplayError(f"{self.url} answered {e.code}: {error.get('message') or answer}",
                              code=error.get("code")) from e
        except (OSError, ValueError) as e:
            raise ReplayError(f"cannot ask {self.url} for recorded results ({e}); is the worker's web server "
                              "running (`agentlog worker`, AGENTLOG_WEB_PORT)?") from e
        self._occurrences[(node_id, attempt, ident)] = n + 1
        result: dict[str, Any] = answer["result"]
        return result

    def recorded_llm(self, node_id: str | None, attempt: int, cache_key: str,
                     request: dict[str, Any] | None = None) -> dict[str, Any]:
        """As :meth:`MockReplaySession.recorded_llm`, over HTTP."""
        body: dict[str, Any] = {"cacheKey": cache_key}
        if request is not None:
            body["request"] = request
        return self._ask(node_id, attempt, cache_key, "llm", body)

    def recorded_tool(self, node_id: str | None, attempt: int, tool: str, args: Any) -> Any:
        """As :meth:`MockReplaySession.recorded_tool`, over HTTP."""
        return self._ask(node_id, attempt, tool_cache_key(tool, args), "tool",
                         {"tool": tool, "args": args})["result"]
