"""Audit records of a realistic multi-agent run, built by hand from the story in tests/unit/core/runs.py.

Transitions are written here from the check-mode chain events (not produced by the
fold), so the query tests do not depend on the handoff processor being right.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from agentlog.core.fold import states_by_index
from agentlog.core.sealing import seal_event
from agentlog.schemas.canonical import GENESIS, chain_hash
from tests.unit.core.runs import child_runs, event_id, realistic_run

INGEST_TOPIC = "t.ingest"

_PHASE_STATES = {
    "dispatch.began": ("pending", "dispatching"),
    "dispatch.succeeded": ("dispatching", "running"),
    "dispatch.failed": ("dispatching", "failed"),
    "child.completed": ("running", "completed"),
    "child.failed": ("running", "failed"),
    "child.cancelled": ("running", "cancelled"),
    "output.harvested": ("completed", "harvested"),
}


def _ms(ts: str) -> int:
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


def committed(docs: list[dict[str, Any]], *, partition: int = 0, first_offset: int = 0) -> list[dict[str, Any]]:
    """Wrap a run's docs as CommittedEvents with the contract's hash chain and the state hash at each index."""
    out, prev = [], GENESIS
    for i, (doc, (_, s_hash)) in enumerate(zip(docs, states_by_index(docs), strict=True)):
        h = chain_hash(prev, doc)
        out.append({
            "doc": doc,
            "prevHash": prev,
            "hash": h,
            "source": {"topic": INGEST_TOPIC, "partition": partition, "offset": first_offset + i,
                       "timestampMs": _ms(doc["timestamp"]) + 50},
            "stateHash": s_hash,
        })
        prev = h
    return out


def transitions(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Transition records for the check-mode chain events of a run."""
    began: dict[str, str] = {}
    out = []
    for doc in docs:
        if doc["type"] != "core.workflowChain.event":
            continue
        p = doc["payload"]
        worker, phase = p["workerId"], p["phase"]
        if phase == "dispatch.began":
            began[worker] = doc["eventId"]
        frm, to = _PHASE_STATES[phase]
        out.append({
            "parentRunId": doc["runId"], "workerId": worker, "dispatchId": began[worker],
            "childRunId": p.get("childRunId"), "phase": phase, "from": frm, "to": to,
            "eventId": doc["eventId"], "causationId": doc.get("causationId"), "sequence": doc["sequence"],
            "derived": False, "timestamp": doc["timestamp"], "harvestedKeys": p.get("harvestedKeys"),
            "error": p.get("error"),
        })
    return out


LLM_RUN = "run-llm"


def llm_run() -> list[dict[str, Any]]:
    """A run with LLM calls: two models answer, three refusals (one with no paired start)."""
    specs: list[tuple[str, dict[str, Any], int | None]] = [
        ("run.started", {"bindings": {}}, None),                                                          # 0
        ("agent.invocation.started", {"cacheKey": "k1", "recipe": "openwop-semantic-request-v2",
                                      "request": {"provider": "anthropic", "model": "claude-x"}}, None),  # 1
        ("agent.invocation.completed", {"cacheKey": "k1", "envelope": {"kind": "text"}}, 1),             # 2
        ("provider.usage", {"provider": "anthropic", "model": "claude-x", "inputTokens": 100,
                            "outputTokens": 20, "costCents": 1.5}, 2),                                    # 3
        ("agent.invocation.started", {"cacheKey": "k2", "recipe": "openwop-semantic-request-v2",
                                      "request": {"provider": "anthropic", "model": "claude-x"}}, None),  # 4
        ("envelope.refusal", {"cacheKey": "k2", "reason": "policy"}, 4),                                  # 5
        ("agent.invocation.started", {"cacheKey": "k3", "recipe": "openwop-semantic-request-v2",
                                      "request": {"provider": "openai", "model": "gpt-y"}}, None),        # 6
        ("agent.invocation.completed", {"cacheKey": "k3", "envelope": {"kind": "text"}}, 6),             # 7
        ("provider.usage", {"provider": "openai", "model": "gpt-y", "inputTokens": 50,
                            "outputTokens": 5, "costCents": 0.25}, 7),                                    # 8
        ("agent.invocation.started", {"cacheKey": "k1", "recipe": "openwop-semantic-request-v2",
                                      "request": {"provider": "anthropic", "model": "claude-x"}}, None),  # 9
        ("envelope.refusal", {"cacheKey": "k1", "reason": "safety"}, 9),                                  # 10
        ("envelope.refusal", {"cacheKey": "k-orphan", "reason": "policy"}, None),                         # 11
        ("provider.usage", {"provider": "mistral", "model": "m-small", "inputTokens": 10,
                            "outputTokens": 0}, 11),                                                      # 12
        ("run.completed", {"status": "completed"}, None),                                                 # 13
    ]
    docs = []
    for seq, (type_, payload, cause) in enumerate(specs):
        doc: dict[str, Any] = {"eventId": event_id(LLM_RUN, seq), "runId": LLM_RUN, "type": type_,
                               "payload": payload, "timestamp": f"2025-01-15T11:00:{seq:02d}.000Z",
                               "sequence": seq, "nodeId": "llm"}
        if cause is not None:
            doc["causationId"] = event_id(LLM_RUN, cause)
        docs.append(doc)
    return docs


def rejections() -> list[dict[str, Any]]:
    def rej(offset: int, reason: str, run_id: str | None, seq: int | None) -> dict[str, Any]:
        return {"reason": reason, "detail": f"{reason} at {offset}", "runId": run_id,
                "eventId": None if run_id is None else f"{run_id}:x{offset}", "sequence": seq,
                "source": {"topic": INGEST_TOPIC, "partition": 1, "offset": offset,
                           "timestampMs": 1736935200000 + offset},
                "raw": base64.b64encode(b"{bad").decode("ascii")}
    return [rej(100, "sequence_gap", "run-1", 25), rej(101, "sequence_gap", "run-1", 27),
            rej(102, "decode_error", None, None), rej(103, "dangling_causation", LLM_RUN, 14)]


def violations() -> list[dict[str, Any]]:
    return [{"runId": "run-1", "code": "wrong_causation", "detail": "began points at a non-decision",
             "eventId": "run-1:0099", "sequence": 99, "workerId": "worker-x", "phase": "dispatch.began",
             "dispatchId": None}]


def verdicts() -> list[dict[str, Any]]:
    return [
        {"replayRunId": "run-1.replay-1", "sourceRunId": "run-1", "mode": "verify", "verdict": "match",
         "errorCode": None, "firstDivergence": None, "events": [], "comparedThrough": 19},
        {"replayRunId": "run-1.replay-2", "sourceRunId": "run-1", "mode": "live", "verdict": "diverged_at_refusal",
         "errorCode": "replay_diverged_at_refusal", "firstDivergence": {"atSequence": 7},
         "events": [{"type": "replay.divergedAtRefusal"}], "comparedThrough": 7},
    ]


def snapshots(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = records[-1]
    return [{"runId": last["doc"]["runId"], "atSequence": last["doc"]["sequence"], "logOffset": len(records) - 1,
             "logPartition": 0, "state": {"status": "completed", "variables": {}, "channels": {}},
             "stateHash": "s" * 64, "headHash": last["hash"]}]


def audit_batches() -> dict[str, list[dict[str, Any]]]:
    """Every record kind of the scenario, keyed by the kind ``Store.insert_records`` takes."""
    parent = realistic_run("run-1", "check")
    events = committed(parent)
    offset = len(events)
    for docs in child_runs("run-1").values():
        events += committed(docs, first_offset=offset)
        offset += len(docs)
    events += committed(llm_run(), partition=1)
    return {
        "committed": events,
        "transition": transitions(parent),
        "violation": violations(),
        "rejection": rejections(),
        "verdict": verdicts(),
        "snapshot": snapshots(committed(parent)),
    }


def store_sealed(store: Any, docs: list[dict[str, Any]], keyring: Any) -> None:
    """``docs`` (one run) committed to ``store`` as the worker stores them: sealed under a key minted in ``keyring``,
    hash-chained, with the transitions they make."""
    key, _ = keyring.mint(docs[0]["runId"], "subject", None)
    records, prev = [], GENESIS
    for i, doc in enumerate(docs):
        stored = seal_event(doc, key)
        h = chain_hash(prev, stored)
        records.append({"doc": stored, "prevHash": prev, "hash": h, "stateHash": "0" * 64,
                        "source": {"topic": INGEST_TOPIC, "partition": 0, "offset": i, "timestampMs": 0}})
        prev = h
    store.insert_records("committed", records)
    store.insert_records("transitions", transitions(docs))
