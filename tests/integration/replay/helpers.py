"""Helpers for the live replay tests: wait for a worker's output, or write a log by hand.

Hand-written logs let a test put an altered record *first* at its (runId, sequence) — what
readers keep — which a running worker would never do. The state hash each record carries, and
the snapshots written next to them, are what an honest worker records for the *original* docs:
the fold of them (the same pure fold the worker calls) and the chain over them.
"""

from __future__ import annotations

import copy
from typing import Any

from aiokafka import AIOKafkaProducer

from agentlog.core.fold import states_by_index
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import encode_record
from agentlog.streams.reader import read_run, read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name


async def records_of(settings: Settings, short: str, run_id: str, field: str = "runId") -> list[dict]:
    return [v async for _, _, _, v in read_topic(settings, short, key=run_id) if v.get(field) == run_id]


async def logged(settings: Settings, run_id: str, n: int) -> dict[int, dict] | None:
    """What the run's log records carry at each sequence (first copy), once all ``n`` are there (else None).

    ``{"stateHash", "headHash" (the record's hash), "logPartition", "logOffset"}`` per sequence.
    """
    found: dict[int, dict] = {}
    async for partition, offset, _, v in read_topic(settings, "log", key=run_id):
        doc = v.get("doc") or {}
        if doc.get("runId") == run_id:
            found.setdefault(doc["sequence"], {"stateHash": v["stateHash"], "headHash": v["hash"],
                                               "logPartition": partition, "logOffset": offset})
    return found if len(found) >= n else None


async def terminal_snapshot(settings: Settings, run_id: str, last_seq: int) -> dict[int, dict] | None:
    snaps = {s["atSequence"]: s for s in await records_of(settings, "snapshots", run_id)}
    return snaps if last_seq in snaps else None


async def committed(settings: Settings, run_id: str, n: int):
    run = await read_run(settings, run_id)
    return run if len(run) >= n else None


def chained(docs: list[dict], *, recorded: list[dict] | None = None) -> list[dict]:
    """CommittedEvents for ``docs`` with a correct hash chain, each with the state hash at its index.

    The state hashes are the fold of ``recorded`` (default ``docs``): given the original docs, a
    forger's chain over altered ``docs`` that kept the state hashes the worker committed. The
    source fields are placeholders.
    """
    states = states_by_index(recorded if recorded is not None else docs)
    out, head = [], GENESIS
    for i, (doc, (_, s_hash)) in enumerate(zip(docs, states, strict=False)):
        h = chain_hash(head, doc)
        out.append({"doc": copy.deepcopy(doc), "prevHash": head, "hash": h,
                    "source": {"topic": "hand-written", "partition": 0, "offset": i, "timestampMs": 0},
                    "stateHash": s_hash})
        head = h
    return out


class HandLog:
    """Writes a run's committed log and snapshots straight to the topics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")

    async def __aenter__(self) -> HandLog:
        await ensure_topics(self.settings)
        await self.producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()

    async def send(self, short: str, key: str, value: dict) -> Any:
        return await self.producer.send_and_wait(
            topic_name(self.settings, short), key=key.encode(), value=encode_record(value))

    async def log(self, records: list[dict]) -> list[tuple[int, int]]:
        """Append CommittedEvents in order; returns (partition, offset) of each."""
        where = []
        for rec in records:
            meta = await self.send("log", rec["doc"]["runId"], rec)
            where.append((meta.partition, meta.offset))
        return where

    async def snapshots(self, original_docs: list[dict], where: dict[int, tuple[int, int]], *,
                        at: tuple[int, ...]) -> None:
        """The snapshots at the sequences ``at`` an honest worker records for ``original_docs``.

        ``where`` maps a sequence to the (partition, offset) its log record was written at.
        """
        run_id = original_docs[0]["runId"]
        head = GENESIS
        for doc, (state, s_hash) in zip(original_docs, states_by_index(original_docs), strict=False):
            head = chain_hash(head, doc)
            seq = doc["sequence"]
            if seq in at:
                partition, offset = where.get(seq, (0, -1))
                await self.send("snapshots", run_id, {
                    "runId": run_id, "atSequence": seq, "logPartition": partition, "logOffset": offset,
                    "state": state, "stateHash": s_hash, "headHash": head})
