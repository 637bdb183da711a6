"""Fast, deterministic RunEventDoc generators for the fault suite, and the independent oracle.

The oracle never asks the worker: the expected head hash of a run is the chain recomputed
here from the published docs, and the expected state is the offline fold of the same docs.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC
from typing import Any

from agentlog.schemas.canonical import GENESIS, chain_hash
from tests.unit.core.runs import child_runs, realistic_run

_BASE_MS = 1_736_935_200_000  # 2025-01-15T10:00:00Z


def _ts(ms: int) -> str:
    from datetime import datetime

    seconds, millis = divmod(ms, 1000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis:03d}Z"


def synthetic_run(run_id: str, n: int, rng: random.Random) -> list[dict[str, Any]]:
    """``n`` events: run.started, a mix of variable/channel writes and tool calls, run.completed."""
    docs: list[dict[str, Any]] = []

    def add(type_: str, payload: Any, cause: int | None = None) -> int:
        seq = len(docs)
        doc: dict[str, Any] = {
            "eventId": f"{run_id}:{seq:05d}",
            "runId": run_id,
            "type": type_,
            "payload": payload,
            "timestamp": _ts(_BASE_MS + seq * 10),
            "sequence": seq,
            "nodeId": f"node-{seq % 3}",
        }
        if cause is not None:
            doc["causationId"] = docs[cause]["eventId"]
        docs.append(doc)
        return seq

    add("run.started", {"bindings": {"engineVersion": "1.0.0"}})
    while len(docs) < n - 1:
        roll = rng.random()
        room = n - 1 - len(docs)
        if roll < 0.25 and room >= 2:
            call = add("agent.toolCalled", {"callId": f"c{len(docs)}", "tool": "search",
                                            "args": {"q": f"q{rng.randrange(1000)}"}})
            add("agent.toolReturned", {"callId": f"c{call}", "result": {"hits": rng.randrange(50)}}, cause=call)
        elif roll < 0.65:
            add("variable.changed", {"name": f"v{rng.randrange(8)}", "value": rng.randrange(10_000)})
        else:
            add("channel.written", {"channel": f"ch{rng.randrange(3)}", "value": f"m{rng.randrange(10_000)}"})
    add("run.completed", {})
    return docs


def realistic_family(run_id: str) -> list[list[dict[str, Any]]]:
    """A planner run in check mode plus its child runs (the handoff story of tests/unit/core/runs.py)."""
    return [realistic_run(run_id, mode="check"), *child_runs(run_id).values()]


def interleave(runs: list[list[dict[str, Any]]], rng: random.Random) -> list[dict[str, Any]]:
    """Merge runs into one stream, as many hosts would; each run keeps its own order."""
    cursors = [0] * len(runs)
    live = [i for i, r in enumerate(runs) if r]
    out: list[dict[str, Any]] = []
    while live:
        k = rng.randrange(len(live))
        i = live[k]
        out.append(runs[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(runs[i]):
            live[k] = live[-1]
            live.pop()
    return out


def head_hash(docs: list[dict[str, Any]]) -> str:
    head = GENESIS
    for doc in docs:
        head = chain_hash(head, doc)
    return head


def chain_of(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(prevHash, hash) of every doc, recomputed from the docs alone."""
    out, head = [], GENESIS
    for doc in docs:
        h = chain_hash(head, doc)
        out.append((head, h))
        head = h
    return out


def mixed_stream(rng: random.Random, *, events: int, families: int, per_run: int,
                 name: str) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """``families`` realistic handoff families plus synthetic runs of ``per_run`` events, ``events`` in all.

    Returns the runs by id and their interleaved stream. Run ids carry a fresh tag, so two tests (or
    two runs of one) on the same topics never share a run; the synthetic ones are ``<name>-<tag>-<i>``.
    """
    tag = uuid.uuid4().hex[:6]
    runs: dict[str, list[dict[str, Any]]] = {}
    for f in range(families):
        for docs in realistic_family(f"fam-{tag}-{f}"):
            runs[docs[0]["runId"]] = docs
    budget = events - sum(len(d) for d in runs.values())
    i = 0
    while budget > 0:
        n = max(2, budget if budget < 2 * per_run else per_run)
        run_id = f"{name}-{tag}-{i}"
        runs[run_id] = synthetic_run(run_id, n, rng)
        budget -= n
        i += 1
    return runs, interleave(list(runs.values()), rng)
