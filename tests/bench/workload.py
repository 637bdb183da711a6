"""The realistic workload: multi-agent runs as hosts send them, many at once, each one finishing.

One *tree* is a planner run (``tests.unit.replay.runs.llm_run``: 28 events — run.started, a
variable, the orchestrator's decision, usage records, an LLM call with its messages and cache
key, tool calls and returns, a retried node, two workers dispatched with their handoff
transitions, a channel write, a harvest, run.completed) and its two child runs (3 and 2
events, each with its own terminal status): 33 events, three runs, every one of which ends.
``concurrent`` trees are in flight at once; each event is taken from a random one of them, so
runs interleave as concurrent hosts interleave them, and a finished tree is replaced by a new
one. Values are JSON, as a non-SDK host publishes them, keyed by runId.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Iterator

from aiokafka import AIOKafkaProducer

from agentlog.streams.codec import encode_json
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from tests.unit.core.runs import child_runs
from tests.unit.replay.runs import llm_run

#: Events in one tree (a planner run and its two child runs).
TREE_EVENTS = 33


def tree(run_id: str) -> list[list[dict]]:
    """The runs of one tree, each a list of docs in sequence order."""
    return [llm_run(run_id), *child_runs(run_id).values()]


def events(prefix: str, total: int, *, concurrent: int = 1000, seed: int = 7) -> Iterator[tuple[str, bytes]]:
    """``total`` events as (runId, JSON value), runs of ``concurrent`` trees interleaved."""
    rng = random.Random(seed)
    active: list[Iterator[dict]] = []
    started = 0
    for _ in range(total):
        while len(active) < concurrent * 3:
            active.extend(iter(run) for run in tree(f"{prefix}-{started}"))
            started += 1
        i = rng.randrange(len(active))
        doc = next(active[i], None)
        while doc is None:  # that run is done: another one takes its place
            active[i] = active[-1]
            active.pop()
            i = rng.randrange(len(active))
            doc = next(active[i], None)
        yield doc["runId"], encode_json(doc)


async def publish(settings: Settings, prefix: str, total: int, *, concurrent: int = 1000, rate: float = 0.0) -> None:
    """Publish ``total`` workload events to ingest (acks=all), at most ``rate`` per second when set."""
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True, linger_ms=5,
                                max_batch_size=1 << 20)
    await producer.start()
    topic = topic_name(settings, "ingest")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        pending = []
        for i, (run_id, value) in enumerate(events(prefix, total, concurrent=concurrent)):
            pending.append(await producer.send(topic, value, key=run_id.encode()))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
            if rate and i % 100 == 99 and (ahead := t0 + (i + 1) / rate - loop.time()) > 0:
                await asyncio.sleep(ahead)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def long_run(run_id: str, total: int) -> list[dict]:
    """One run of ``total`` events (sequences 0..total-1), as a long supervisor run sends them: ``run.started``,
    then the planner tree's body (decisions, LLM and tool calls, usage, dispatch chains, channel writes,
    harvests) over and over, each round with its own event, call and child run ids, then ``run.completed``.
    Its child runs are not included (``tree`` gives those of one round)."""
    body = llm_run(run_id)
    first, middle, last = body[0], body[1:-1], body[-1]
    docs: list[dict] = []

    def renumbered(doc: dict, ids: dict[str, str], round_: int) -> dict:
        seq = len(docs)
        out = copy.deepcopy(doc)
        out["sequence"], out["eventId"] = seq, f"{run_id}:{seq:06d}"
        out["timestamp"] = f"2025-01-15T{10 + seq // 3_600_000:02d}:{seq // 60_000 % 60:02d}:{seq // 1000 % 60:02d}." \
                           f"{seq % 1000:03d}Z"
        ids[doc["eventId"]] = out["eventId"]
        if "causationId" in out:
            out["causationId"] = ids.get(out["causationId"], out["causationId"])
        payload = out.get("payload")
        if isinstance(payload, dict) and round_:
            for key in ("childRunId", "callId"):
                if isinstance(payload.get(key), str):
                    payload[key] = f"{payload[key]}.r{round_}"
        return out

    docs.append(renumbered(first, {}, 0))
    round_ = 0
    while len(docs) < total - 1:
        ids: dict[str, str] = {body[0]["eventId"]: docs[0]["eventId"]}
        for doc in middle[: total - 1 - len(docs)]:
            docs.append(renumbered(doc, ids, round_))
        round_ += 1
    docs.append(renumbered(last, {}, 0))
    return docs
