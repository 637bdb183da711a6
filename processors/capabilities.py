"""The OpenWOP capability document, claiming only what works here and now.

A capability document is a promise to other hosts, so every flag is computed when it is asked
for by exercising the code that backs it — the same fold, comparison engine and cache-key
function the store runs — never read from a constant:

* ``executionModel.supported``: a tiny planner→worker run folds into the RFC 0037
  transitions, and an illegal transition is caught as a violation;
* ``replayDeterminism.supported``: ``compare_runs`` says ``match`` for a replay whose
  only differences are volatile fields, and ``diverged`` at the right index when a
  tool result changes;
* ``llmCacheKeyRecipe: "spec-rfc-0041"``: recipe v2 reproduces every known-answer
  vector of ``semantic-request-digest-v2.json`` (canonical bytes and digest); without
  the vector file the recipe is not claimed;
* ``refusalDivergenceEmission``: a valid envelope vs a refusal (both directions)
  yields ``diverged_at_refusal``, error ``replay_diverged_at_refusal`` and a
  ``replay.divergedAtRefusal`` event.

``version`` is 4 (RFC 0041) only when replay determinism holds, else 1 (RFC 0037).
``agentlog capabilities`` (:mod:`agentlog.cli.capabilities`) prints the result.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlog.core.fold import fold_all
from agentlog.replay.compare import compare_runs
from agentlog.schemas.cachekey import cache_key, canonical_request
from agentlog.schemas.upstream import UPSTREAM_DIR

__all__ = ["Check", "capability_document", "find_vectors", "run_checks"]

_VECTORS_NAME = "semantic-request-digest-v2.json"
# The copy bundled with the package (schemas/upstream, with its source and sha256).
_VECTOR_CANDIDATES = (UPSTREAM_DIR / "openwop" / "conformance" / "vectors" / _VECTORS_NAME,)


@dataclass(frozen=True)
class Check:
    """One exercised claim: ``ok`` and a one-line ``detail`` saying what was run."""

    name: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


# -- tiny built-in runs ------------------------------------------------------------------------


def _doc(run_id: str, seq: int, type_: str, payload: Any, cause: int | None = None, node: str = "n") -> dict[str, Any]:
    doc = {"eventId": f"{run_id}-{seq}", "runId": run_id, "type": type_, "payload": payload,
           "timestamp": f"2025-01-01T00:00:{seq:02d}.000Z", "sequence": seq, "nodeId": node}
    if cause is not None:
        doc["causationId"] = f"{run_id}-{cause}"
    return doc


def _handoff_run(run_id: str) -> list[dict[str, Any]]:
    def chain(seq: int, phase: str, worker: str, cause: int, **extra: Any) -> dict[str, Any]:
        return _doc(run_id, seq, "core.workflowChain.event",
                    {"phase": phase, "workerId": worker, "parentRunId": run_id, **extra}, cause)

    return [
        _doc(run_id, 0, "run.started", {}),
        _doc(run_id, 1, "runOrchestrator.decided", {"agentId": "planner", "decision": {
            "kind": "next-worker", "nextWorkerIds": ["w1", "w2"], "outputMapping": {"w1": {"out": "result"}}}}),
        chain(2, "dispatch.began", "w1", 1),
        chain(3, "dispatch.succeeded", "w1", 2, childRunId="c1"),
        chain(4, "dispatch.began", "w2", 1),
        chain(5, "dispatch.failed", "w2", 4, error={"code": "busy", "message": "no capacity"}),
        chain(6, "child.completed", "w1", 3, childRunId="c1"),
        chain(7, "output.harvested", "w1", 6, childRunId="c1", harvestedKeys=["result"]),
        _doc(run_id, 8, "run.completed", {"status": "completed"}),
    ]


def _llm_tool_run(run_id: str, *, tool_result: Any = "42", refuse: bool = False) -> list[dict[str, Any]]:
    docs = [
        _doc(run_id, 0, "run.started", {}),
        _doc(run_id, 1, "agent.toolCalled", {"callId": f"{run_id}-call", "tool": "calc", "args": {"q": "6*7"}}),
        _doc(run_id, 2, "agent.toolReturned", {"callId": f"{run_id}-call", "result": tool_result}, 1),
        _doc(run_id, 3, "agent.invocation.started", {"request": {}, "cacheKey": "k", "recipe": "r"}),
    ]
    if refuse:
        docs.append(_doc(run_id, 4, "envelope.refusal", {"cacheKey": "k", "reason": "policy"}, 3))
    else:
        docs.append(_doc(run_id, 4, "agent.invocation.completed", {"cacheKey": "k", "envelope": {"text": "ok"}}, 3))
    docs.append(_doc(run_id, 5, "variable.changed", {"name": "answer", "value": "done"}))
    docs.append(_doc(run_id, 6, "run.completed", {"status": "completed"}))
    return docs


# -- checks ------------------------------------------------------------------------------------


def _check_handoff() -> Check:
    run = _handoff_run("cap-h")
    _, outputs = fold_all(run, handoff_mode="check")
    phases = [(o["workerId"], o["phase"]) for o in outputs if o["kind"] == "transition"]
    expected = [("w1", "dispatch.began"), ("w1", "dispatch.succeeded"), ("w2", "dispatch.began"),
                ("w2", "dispatch.failed"), ("w1", "child.completed"), ("w1", "output.harvested")]
    clean = not [o for o in outputs if o["kind"] == "violation"]
    bad = [d for d in run if d["sequence"] != 3]  # child.completed without dispatch.succeeded
    bad = [dict(d, sequence=i) for i, d in enumerate(bad)]
    _, bad_out = fold_all(bad, handoff_mode="check")
    caught = any(o["kind"] == "violation" for o in bad_out)
    ok = phases == expected and clean and caught
    return Check("handoff", ok, f"RFC 0037 machine: {len(phases)} transitions folded, "
                               f"illegal transition {'caught' if caught else 'NOT caught'}")


def _check_replay() -> Check:
    original = _llm_tool_run("cap-o")
    same = compare_runs(original, _llm_tool_run("cap-r"))
    changed = compare_runs(original, _llm_tool_run("cap-x", tool_result="41"))
    at = changed.first_divergence.at_sequence if changed.first_divergence else None
    ok = same.verdict == "match" and changed.verdict == "diverged" and at == 2
    return Check("replay", ok, f"volatile-only replay → {same.verdict}; changed tool result → "
                               f"{changed.verdict} at {at} (expected 2)")


def _check_refusal() -> Check:
    valid, refused = _llm_tool_run("cap-v"), _llm_tool_run("cap-f", refuse=True)
    results = [compare_runs(valid, refused), compare_runs(refused, valid)]
    ok = all(
        r.verdict == "diverged_at_refusal" and r.error_code == "replay_diverged_at_refusal"
        and r.events and r.events[0]["type"] == "replay.divergedAtRefusal"
        and r.first_divergence is not None and r.first_divergence.at_sequence == 4
        for r in results
    )
    return Check("refusal", ok, "valid↔refusal in both directions → "
                                + ", ".join(f"{r.verdict}/{r.error_code}" for r in results))


def find_vectors(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The cache-key vector file: ``explicit`` (``--vectors``), else the copy bundled in ``schemas/upstream``."""
    for candidate in (explicit, *_VECTOR_CANDIDATES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _check_cache_key(vectors: Path | None) -> Check:
    if vectors is None:
        return Check("cacheKey", False, f"vector file {_VECTORS_NAME} not found (pass --vectors FILE); "
                                        "recipe not claimed")
    try:
        data = json.loads(vectors.read_text("utf-8"))
        cases = data["vectors"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Check("cacheKey", False, f"cannot read vectors from {vectors}: {e}")
    failed = []
    for case in cases:
        try:
            canon = canonical_request(case["input"], recipe="v2").decode("utf-8")
            ok = canon == case["canonical"] and cache_key(case["input"], recipe="v2") == case["digest"]
        except Exception as e:  # noqa: BLE001 - a vector that raises is a failed vector, reported by id
            ok = False
            del e
        if not ok:
            failed.append(str(case.get("id")))
    ok = bool(cases) and not failed
    detail = f"{len(cases) - len(failed)}/{len(cases)} vectors reproduced from {vectors}"
    if failed:
        detail += f"; failed: {', '.join(failed)}"
    return Check("cacheKey", ok, detail)


def run_checks(vectors: str | os.PathLike[str] | None = None) -> list[Check]:
    """Run every check; never raises (a check that crashes is a failed check)."""
    checks = []
    runners: list[tuple[str, Callable[[], Check]]] = [
        ("handoff", _check_handoff),
        ("replay", _check_replay),
        ("cacheKey", lambda: _check_cache_key(find_vectors(vectors))),
        ("refusal", _check_refusal),
    ]
    for name, runner in runners:
        try:
            checks.append(runner())
        except Exception as e:  # noqa: BLE001 - the claim is withdrawn, and the reason shown
            checks.append(Check(name, False, f"check crashed: {type(e).__name__}: {e}"))
    return checks


def capability_document(checks: list[Check]) -> dict[str, Any]:
    """The ``multiAgent`` discovery block implied by ``checks`` (RFC 0037 §C, RFC 0041 §D)."""
    ok = {c.name: c.ok for c in checks}
    handoff, replay = ok.get("handoff", False), ok.get("replay", False)
    determinism: dict[str, Any] = {"supported": replay}
    if replay and ok.get("cacheKey"):
        determinism["llmCacheKeyRecipe"] = "spec-rfc-0041"
    determinism["refusalDivergenceEmission"] = bool(replay and ok.get("refusal"))
    model: dict[str, Any] = {"supported": handoff, "version": 4 if handoff and replay else 1}
    if handoff:
        model["replayDeterminism"] = determinism
    return {"multiAgent": {"executionModel": model}}
