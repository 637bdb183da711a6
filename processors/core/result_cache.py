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

A call whose event the sequencer redacted (``$redactions`` in its payload) is also keyed by the cache key of its
request *as stored*: the host computed ``cacheKey`` over the original text, and a replay that reads the recorded
(redacted) input asks the redacted request, whose key is the stored one once the replay's request is redacted by
the same policy (:meth:`ResultCache.redacted_key`, which a lookup that misses tries).

A miss must say *why*: the most common complaint about record/replay tools is "why did my
request miss?". The cache therefore also keeps each recorded call's request (the LLM request
with its recipe, or the tool name and arguments) by (runId, nodeId, attempt), and
:meth:`ResultCache.diagnose` names the nearest recorded call for that node and attempt with a
field-level diff of the two requests — of their cache-key *projections* for LLM calls (RFC
0041 §A), since only projected fields change the key. Nearest is decided the same way every
time, never by which tied call comes first: fewest differing fields, then the recorded call at
the position the replay asks from (its n-th call of that kind at the node is held against the
recorded n-th), then the one whose differing values are most alike. Those requests are not part of
:meth:`ResultCache.to_json` (format 1 stays as it is): a cache read back from JSON still answers
lookups, and its misses say that no request was kept to diff against.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentlog.schemas.cachekey import cache_key, project_request
from agentlog.schemas.canonical import jcs, sha256_hex
from agentlog.schemas.content import REDACTIONS
from agentlog.schemas.errors import AgentlogError, ReplayError
from agentlog.schemas.stability import Segment, format_path

__all__ = ["CacheKey", "ReplayCacheMiss", "ResultCache", "args_digest", "request_diff", "tool_cache_key"]

#: At most this many differing fields are listed in a miss diagnosis (the first, in JCS key order).
MAX_DIFF_FIELDS = 20
#: How much of each differing value (its JCS text) is read to tell how alike two tied calls are: enough to
#: tell prompts apart, and the similarity costs up to the square of it.
_ALIKE_CHARS = 2000

#: Serialisation format version of :meth:`ResultCache.to_json`.
FORMAT_VERSION = 1

CacheKey = tuple[str, str | None, int, str]


def tool_cache_key(tool: Any, args: Any) -> str:
    """Cache key of a tool call: the digest of what was called with what."""
    return sha256_hex(jcs({"tool": tool, "args": args}))


def args_digest(args: Any) -> str:
    """Digest of a tool call's arguments alone, so a host in any language can name a call in a URL."""
    return sha256_hex(jcs(args))


class ReplayCacheMiss(ReplayError):
    """A mock replay asked for a call the original never made; ``diagnosis`` says what it did make.

    Compare the request with ``diagnosis["nearest"]``: ``diagnosis["diff"]`` lists the fields
    that made the key differ. A replay that must make a new call cannot run in mock mode; replay
    it live instead.
    """

    code = "replay_cache_miss"

    def __init__(self, message: str, *, diagnosis: dict[str, Any]) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


@dataclass
class ResultCache:
    """Recorded observable results by (runId, nodeId, attempt, cacheKey).

    Results are ``{"kind": "valid", "envelope", "usage"?}``, ``{"kind": "refusal", "reason"?}``
    or ``{"kind": "tool", "tool", "result"}``. Lookups return copies: a caller mutating a
    result never changes what the next replay gets.
    """

    _entries: dict[CacheKey, list[dict[str, Any]]] = field(default_factory=dict)
    _calls: dict[tuple[str, str | None, int], list[dict[str, Any]]] = field(default_factory=dict)

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
        pending_stored: dict[str | None, str] = {}  # the key of a redacted request as stored
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
                    stored = _stored_key(payload)
                    if stored is not None:
                        pending_stored[node] = stored
                    self._call(run_id, node, attempt, {
                        "kind": "llm", "cacheKey": payload["cacheKey"], "request": payload.get("request"),
                        "recipe": payload.get("recipe")})
            elif kind in ("agent.invocation.completed", "envelope.refusal"):
                key = payload.get("cacheKey") or pending_llm.get(node)
                pending_llm.pop(node, None)
                stored = pending_stored.pop(node, None)
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
                if stored is not None and stored != key:
                    self._add((run_id, node, attempt, stored), result)
            elif kind == "agent.toolCalled":
                tool, args = payload.get("tool"), payload.get("args")
                pending_tools[payload.get("callId")] = (node, attempt, tool_cache_key(tool, args), tool)
                self._call(run_id, node, attempt, {"kind": "tool", "cacheKey": tool_cache_key(tool, args),
                                                   "tool": tool, "args": args, "argsDigest": args_digest(args)})
            elif kind == "agent.toolReturned":
                call = pending_tools.pop(payload.get("callId"), None)
                if call is None:
                    continue  # a return without its call cannot be keyed
                call_node, call_attempt, key, tool = call
                self._add((run_id, call_node, call_attempt, key),
                          {"kind": "tool", "tool": tool, "result": payload.get("result")})

    def _add(self, key: CacheKey, result: dict[str, Any]) -> None:
        self._entries.setdefault(key, []).append(copy.deepcopy(result))

    def _call(self, run_id: str, node: str | None, attempt: int, call: dict[str, Any]) -> None:
        self._calls.setdefault((run_id, node, attempt), []).append(copy.deepcopy(call))

    def tool_key(self, run_id: str, node_id: str | None, attempt: int, tool: str, digest: str) -> str | None:
        """The cache key of the recorded call of ``tool`` whose arguments digest to ``digest`` (for URLs)."""
        for call in self._calls.get((run_id, node_id, attempt), []):
            if call["kind"] == "tool" and call["tool"] == tool and call["argsDigest"] == digest:
                key: str = call["cacheKey"]
                return key
        return None

    def diagnose(
        self,
        run_id: str,
        node_id: str | None,
        attempt: int,
        cache_key: str | None,
        *,
        occurrence: int = 0,
        request: Any = None,
        tool: Any = None,
        args: Any = None,
        position: int | None = None,
    ) -> dict[str, Any]:
        """Why ``lookup`` missed: the nearest recorded call for this node and attempt, and what differs.

        Pass the request (``request`` for an LLM call, ``tool``/``args`` for a tool call) to get a
        field-level ``diff``; with only a key, the nearest call is named without one. ``position``:
        how many calls of this kind the replay made at this node and attempt before this one.
        Nearest is the recorded call of the same kind looked for at the same node and attempt first,
        then at the node's other attempts, chosen by, in turn: the fewest differing fields; the
        position nearest ``position`` among the recorded calls of its kind at its attempt; the
        differing values most alike (their JCS texts, by :class:`difflib.SequenceMatcher`); the
        earliest recorded.
        """
        kind = "tool" if tool is not None else "llm" if request is not None else None
        out: dict[str, Any] = {"sourceRunId": run_id, "nodeId": node_id, "attempt": attempt, "cacheKey": cache_key,
                               "occurrence": occurrence}
        recorded = self._entries.get((run_id, node_id, attempt, cache_key or ""))
        if recorded is not None:
            out["reason"] = (f"this call was recorded {len(recorded)} time(s) at this node and attempt; "
                             f"the replay is asking for occurrence {occurrence} (counted from 0)")
            out["nearest"], out["diff"] = None, []
            return out
        elsewhere = sorted((k[1] or "", k[2]) for k in self._entries if k[0] == run_id and k[3] == cache_key)

        def of_kind(calls: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
            return list(enumerate(c for c in calls if kind in (None, c["kind"])))  # (position at its attempt, call)

        candidates = of_kind(self._calls.get((run_id, node_id, attempt), []))
        where = "this node and attempt"
        if not candidates:
            candidates = [pc for (r, n, _a), calls in sorted(self._calls.items(), key=lambda kv: kv[0][2])
                          if r == run_id and n == node_id for pc in of_kind(calls)]
            where = "another attempt of this node"
        if not candidates:
            out["reason"] = (f"the original made no {'call' if kind is None else kind + ' call'} at node {node_id!r}"
                             + (f"; this key was recorded at (node, attempt) {elsewhere}" if elsewhere else ""))
            out["nearest"], out["diff"] = None, []
            return out
        # Without the arguments (a URL names a tool call by their digest) there is nothing to diff.
        asked = ({"tool": tool, "args": args} if args is not None else None) if kind == "tool" else request
        scored = []
        for order, (at, call) in enumerate(candidates):
            diff = _request_diff(call, asked) if asked is not None else None
            rank = (len(diff) if diff is not None else 0, abs(at - position) if position is not None else 0,
                    _unlike(diff or []), order)
            scored.append((rank, call, diff))
        scored.sort(key=lambda s: s[0])
        (best, nearest, diff) = scored[0]
        tied = sum(1 for s in scored if s[0][0] == best[0])
        out["nearest"] = {k: copy.deepcopy(v) for k, v in nearest.items() if k != "argsDigest"}
        out["diff"] = diff if diff is not None else []
        reason = f"no call with this key was recorded at node {node_id!r}, attempt {attempt}; nearest is at {where}"
        if tied > 1 and diff is not None:
            reason += (f" (of {tied} recorded calls differing in as few fields, the one "
                       + ("at the replay's position, then " if position is not None else "")
                       + "whose differing values are most alike)")
        if elsewhere:
            reason += f"; this key was recorded at (node, attempt) {elsewhere}"
        if diff is None:
            reason += "; send the request itself for a field-level diff"
        elif diff:
            reason += f"; the key differs because of {', '.join(d['path'] for d in diff[:3])}"
        else:
            reason += "; that call is the same request, but the original recorded no result for it (it never returned)"
        out["reason"] = reason
        return out

    def lookup(
        self, run_id: str, node_id: str | None, attempt: int, cache_key: str, *, occurrence: int = 0
    ) -> dict[str, Any] | None:
        """The recorded observable result, or ``None`` when the original never made this call."""
        results = self._entries.get((run_id, node_id, attempt, cache_key))
        if results is None or occurrence >= len(results):
            return None
        return copy.deepcopy(results[occurrence])

    def redacted_key(self, run_id: str, node_id: str | None, attempt: int, request: dict[str, Any],
                     redact: Callable[[dict[str, Any]], dict[str, Any]], *, recipe: str = "v2",
                     occurrence: int = 0) -> str | None:
        """The key this cache keeps an LLM call under when its recording was redacted: the key of ``request``
        redacted by ``redact`` (the deployment's policy), if a result is recorded under it; None otherwise."""
        try:
            key = cache_key(redact(request), recipe)
        except AgentlogError:  # a request the recipe cannot key
            return None
        return key if self.lookup(run_id, node_id, attempt, key, occurrence=occurrence) is not None else None

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


def _stored_key(payload: Mapping[str, Any]) -> str | None:
    """The cache key of a redacted call's request as stored (None: not redacted, or no request to key)."""
    request, recipe = payload.get("request"), payload.get("recipe")
    if REDACTIONS not in payload or not isinstance(request, dict):
        return None
    try:
        return cache_key(request, recipe if isinstance(recipe, str) else "v2")
    except AgentlogError:  # a request the recipe cannot key was never keyed by the host either
        return None


def _node_id(doc: Mapping[str, Any]) -> str | None:
    node = doc.get("nodeId")
    if node is None and isinstance(doc.get("payload"), Mapping):
        node = doc["payload"].get("nodeId")
    return node if isinstance(node, str) else None


def _request_diff(call: Mapping[str, Any], asked: Any) -> list[dict[str, Any]]:
    """The fields in which a recorded call's request and the asked one differ (what changes the key)."""
    if call["kind"] == "tool":
        return _field_diff({"tool": call["tool"], "args": call["args"]}, asked)
    return request_diff(call.get("request"), asked, call.get("recipe") or "v2")


def request_diff(recorded: Any, asked: Any, recipe: str = "v2") -> list[dict[str, Any]]:
    """The fields in which two LLM requests differ where their cache key sees them, first :data:`MAX_DIFF_FIELDS`.

    Each is ``{path, recorded, requested, note?}``, the path into the ``recipe``'s projection (RFC 0041 §A:
    ``request.messages[0].parts[0].content`` under v2), so transport fields never count. A request the recipe
    cannot project has no key to compare: the two are diffed whole.
    """
    try:
        return _field_diff(project_request(recorded, recipe), project_request(asked, recipe))
    except (AgentlogError, TypeError, AttributeError):
        return _field_diff(recorded, asked)


def _field_diff(recorded: Any, asked: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    _walk_diff(recorded, asked, (), out)
    return out


def _walk_diff(recorded: Any, asked: Any, at: tuple[Segment, ...], out: list[dict[str, Any]]) -> None:
    if len(out) >= MAX_DIFF_FIELDS:
        return
    if isinstance(recorded, dict) and isinstance(asked, dict):
        for key in sorted(recorded.keys() | asked.keys()):
            if key not in recorded or key not in asked:
                out.append({"path": format_path(at + (key,)), "recorded": recorded.get(key),
                            "requested": asked.get(key),
                            "note": "absent in the request" if key not in asked else "absent in the recording"})
            else:
                _walk_diff(recorded[key], asked[key], at + (key,), out)
            if len(out) >= MAX_DIFF_FIELDS:
                return
    elif isinstance(recorded, list) and isinstance(asked, list):
        for i, (r, a) in enumerate(zip(recorded, asked, strict=False)):
            _walk_diff(r, a, at + (i,), out)
        if len(recorded) != len(asked):
            out.append({"path": format_path(at + ("length",)), "recorded": len(recorded), "requested": len(asked)})
    elif jcs(recorded) != jcs(asked):
        out.append({"path": format_path(at) or "(whole request)", "recorded": recorded, "requested": asked})


def _unlike(diff: list[dict[str, Any]]) -> float:
    """How unlike the differing values are, summed over the fields (0 alike … 1 per field nothing in common)."""
    total = 0.0
    for d in diff:
        recorded, requested = (jcs(d.get(side)).decode()[:_ALIKE_CHARS] for side in ("recorded", "requested"))
        total += 1.0 - difflib.SequenceMatcher(None, recorded, requested, autojunk=False).ratio()
    return total
