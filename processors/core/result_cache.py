"""The observable-result cache of RFC 0041 §C, pure core.

A host replaying in ``mock`` mode must get back the *observable result* the original run
recorded — the LLM envelope (or the refusal), the tool's return value — not a fresh call. The
cache is filled from a recorded run's events, so it needs nothing but the committed log, and it
is keyed the way the RFC's reference host keys it: (runId, nodeId, attempt, cacheKey).

``attempt`` is counted, not read: it is the number of ``node.retried`` events seen for the node
before the call (0 for the first try), so a host that numbers attempts from 1 and one that
numbers from 0 get the same keys. LLM calls are keyed by their recorded ``cacheKey`` (RFC 0041
§A); tool calls by ``sha256(JCS({"tool", "args"}))`` (:func:`tool_cache_key`). The same call
made twice in one attempt keeps both results, in order (``occurrence``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.canonical import jcs, sha256_hex
from schemas.errors import ReplayError

__all__ = ["CacheKey", "ResultCache", "tool_cache_key"]

#: Serialisation format version of :meth:`ResultCache.to_json`.
FORMAT_VERSION = 1

CacheKey = tuple[str, str | None, int, str]


def tool_cache_key(tool: Any, args: Any) -> str:
    """Cache key of a tool call: the digest of what was called with what."""
    return sha256_hex(jcs({"tool": tool, "args": args}))


@dataclass
class ResultCache:
    """Recorded observable results by (runId, nodeId, attempt, cacheKey).

    Results are ``{"kind": "valid", "envelope", "usage"?}``, ``{"kind": "refusal", "reason"?}``
    or ``{"kind": "tool", "tool", "result"}``. Lookups return copies: a caller mutating a
    result never changes what the next replay gets.
    """

    _entries: dict[CacheKey, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def from_events(cls, events: Iterable[Mapping[str, Any]]) -> ResultCache:
        """Fill a cache from one or more recorded runs' events (any order; sorted per run)."""
        cache = cls()
        by_run: dict[str, list[Mapping[str, Any]]] = {}
        for doc in events:
            by_run.setdefault(doc.get("runId", ""), []).append(doc)
        for run_id, docs in by_run.items():
            cache._fill_run(run_id, sorted(docs, key=lambda d: d.get("sequence", 0)))
        return cache

    def _fill_run(self, run_id: str, docs: list[Mapping[str, Any]]) -> None:
        retries: dict[str | None, int] = {}
        pending_llm: dict[str | None, str] = {}
        pending_tools: dict[Any, tuple[str | None, int, str, Any]] = {}
        for doc in docs:
            kind = doc.get("type")
            node = _node_id(doc)
            raw_payload = doc.get("payload")
            payload: Mapping[str, Any] = raw_payload if isinstance(raw_payload, Mapping) else {}
            attempt = retries.get(node, 0)
            if kind == "node.retried":
                retries[node] = attempt + 1
            elif kind == "agent.invocation.started":
                if isinstance(payload.get("cacheKey"), str):
                    pending_llm[node] = payload["cacheKey"]
            elif kind in ("agent.invocation.completed", "envelope.refusal"):
                key = payload.get("cacheKey") or pending_llm.get(node)
                pending_llm.pop(node, None)
                if not isinstance(key, str):
                    continue  # no key recorded anywhere: nothing a replay could look up
                if kind == "agent.invocation.completed":
                    result: dict[str, Any] = {"kind": "valid", "envelope": payload.get("envelope")}
                    if "usage" in payload:
                        result["usage"] = payload["usage"]
                else:
                    result = {"kind": "refusal"}
                    reason = payload.get("reason", payload.get("refusalText"))
                    if reason is not None:
                        result["reason"] = reason
                self._add((run_id, node, attempt, key), result)
            elif kind == "agent.toolCalled":
                tool, args = payload.get("tool"), payload.get("args")
                pending_tools[payload.get("callId")] = (node, attempt, tool_cache_key(tool, args), tool)
            elif kind == "agent.toolReturned":
                call = pending_tools.pop(payload.get("callId"), None)
                if call is None:
                    continue  # a return without its call cannot be keyed
                call_node, call_attempt, key, tool = call
                self._add((run_id, call_node, call_attempt, key),
                          {"kind": "tool", "tool": tool, "result": payload.get("result")})

    def _add(self, key: CacheKey, result: dict[str, Any]) -> None:
        self._entries.setdefault(key, []).append(copy.deepcopy(result))

    def lookup(
        self, run_id: str, node_id: str | None, attempt: int, cache_key: str, *, occurrence: int = 0
    ) -> dict[str, Any] | None:
        """The recorded observable result, or ``None`` when the original never made this call."""
        results = self._entries.get((run_id, node_id, attempt, cache_key))
        if results is None or occurrence >= len(results):
            return None
        return copy.deepcopy(results[occurrence])

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def keys(self) -> list[CacheKey]:
        return list(self._entries)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, entries in a stable order (so equal caches serialise to equal JCS bytes)."""
        entries = [
            {"runId": k[0], "nodeId": k[1], "attempt": k[2], "cacheKey": k[3], "results": copy.deepcopy(v)}
            for k, v in sorted(self._entries.items(), key=lambda kv: jcs(list(kv[0])))
        ]
        return {"version": FORMAT_VERSION, "entries": entries}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResultCache:
        """Inverse of :meth:`to_json`.

        Raises:
            ReplayError: unknown format version or a malformed entry.
        """
        if not isinstance(data, Mapping) or data.get("version") != FORMAT_VERSION:
            raise ReplayError(f"result cache format must be version {FORMAT_VERSION}; re-export the cache")
        cache = cls()
        for entry in data.get("entries", []):
            try:
                key = (entry["runId"], entry["nodeId"], int(entry["attempt"]), entry["cacheKey"])
                results = list(entry["results"])
            except (KeyError, TypeError, ValueError) as e:
                raise ReplayError(f"malformed result cache entry {entry!r}: {e}") from e
            for result in results:
                cache._add(key, result)
        return cache


def _node_id(doc: Mapping[str, Any]) -> str | None:
    node = doc.get("nodeId")
    if node is None and isinstance(doc.get("payload"), Mapping):
        node = doc["payload"].get("nodeId")
    return node if isinstance(node, str) else None
