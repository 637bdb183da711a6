"""Redaction's cost on the sequencer's per-event work: the default policy against no policy (CPU only, no broker).

    .venv/bin/python -m tests.bench.bench_redaction [--trees 300] [--reps 5]

Per event, both sides run what the sequencer does for an ingest record in-process: decode, validate and decide
(:func:`agentlog.core.sequencing.sequence`), then the chain hash of the doc it commits
(:func:`agentlog.schemas.canonical.chain_link`). Ours redacts the doc with the default policy (every built-in
detector, masking) between the two, where the sequencer applies it: before hashing. The events are the bench
workload's multi-agent trees (:mod:`tests.bench.workload`: LLM calls with their messages, tool calls and returns,
usage, variables), and, as a second figure, the redaction corpus's events, each with a planted secret.

Kafka I/O is left out on both sides, so the ratio here is a floor for the log's throughput ratio: a broker round
trip per batch only adds the same time to both. Rate = events per second of CPU time (``time.process_time``,
which moves less than wall time on a shared machine); the best of ``reps`` runs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from agentlog.core.redaction import BUILTIN_DETECTORS, Redactor, parse_policy
from agentlog.core.sequencing import Accepted, Source, sequence
from agentlog.schemas.canonical import chain_link
from agentlog.schemas.validate import DEFAULT_MAX_BYTES
from agentlog.streams.codec import encode_json
from tests.bench import BenchContext
from tests.bench.workload import tree
from tests.unit.redaction import corpus

GOAL_RATIO = 0.85
SOURCE = Source(topic="bench.ingest", partition=0, offset=0, timestamp_ms=0)


def workload_records(trees: int) -> list[bytes]:
    return [encode_json(doc) for i in range(trees) for run in tree(f"bench-{i}") for doc in run]


def corpus_records() -> list[bytes]:
    docs = [json.loads(line)["doc"] for line in corpus.PLANTED.read_text("utf-8").splitlines()]
    return [encode_json({**doc, "sequence": 0}) for doc in docs]


def _pass(records: list[bytes], redact: Callable[[dict[str, Any]], dict[str, Any]] | None) -> float:
    """CPU seconds for one pass over ``records``: sequence each (a fresh run head per run), redact, chain-hash."""
    heads: dict[str, dict[str, Any]] = {}
    index: dict[str, dict[str, list[Any]]] = {}
    t0 = time.process_time()
    for raw in records:
        decoded = sequence(raw, heads.get, lambda run: index.setdefault(run, {}).get, SOURCE,
                           max_bytes=DEFAULT_MAX_BYTES)
        doc = decoded.doc
        if not isinstance(decoded.decision, Accepted) or doc is None:
            raise AssertionError(f"the bench's record was not accepted: {decoded.decision}")
        if redact is not None:
            doc = redact(doc)
        head = heads.get(doc["runId"])
        digest, _ = chain_link(head["hash"] if head else "", doc)
        heads[doc["runId"]] = {"next": doc["sequence"] + 1, "hash": digest}
        index[doc["runId"]][doc["eventId"]] = [doc["sequence"], digest, 0, -1]
    return time.process_time() - t0


def measure(records: list[bytes], reps: int) -> dict[str, float]:
    def redact_with_a_new_redactor() -> Callable[[dict[str, Any]], dict[str, Any]]:
        redactor = Redactor()  # each pass starts with an empty phone memo, as a worker does

        def redact(doc: dict[str, Any]) -> dict[str, Any]:
            return redactor.stored(doc)  # what the sequencer stores: redacted, with its $redactions record

        return redact

    plain = min(_pass(records, None) for _ in range(reps))
    redacted = min(_pass(records, redact_with_a_new_redactor()) for _ in range(reps))
    n = len(records)
    return {"events": n, "plain_us": plain / n * 1e6, "redacted_us": redacted / n * 1e6,
            "redaction_us": (redacted - plain) / n * 1e6, "ratio": plain / redacted}


def _agent_pass(records: list[bytes], redactor: Redactor) -> float:
    """CPU seconds for the sequencer agent (:mod:`agentlog.worker.sequencer` in
    :class:`agentlog.worker.memory.MemoryWorker`, as the unit tests run it) to commit ``records`` in batches of 500:
    decode, validate, decide, redact, seal, chain, fold, the log record, its table writes (RocksDB)."""
    import asyncio
    import tempfile
    from pathlib import Path

    from agentlog.streams.settings import Settings
    from agentlog.worker.memory import MemoryWorker, memory_wiring

    with tempfile.TemporaryDirectory() as home:
        worker = MemoryWorker(memory_wiring(Settings(home=Path(home)), redactor=redactor))
        worker.sequencer()

        async def go() -> float:
            await worker.take("sequencer")  # its tables opened before the clock starts
            t0 = time.process_time()
            for i in range(0, len(records), 500):
                await worker.feed("sequencer", records[i:i + 500])
            return time.process_time() - t0

        try:
            return asyncio.run(go())
        finally:
            for table in worker.wiring.tables.values():
                table.close_all()  # type: ignore[attr-defined]


#: No policy: every detector off (what the sequencer did before redaction, but for the call).
NO_POLICY = parse_policy("[detectors]\n" + "".join(f'{d} = "off"\n' for d in BUILTIN_DETECTORS)).default


def measure_agent(records: list[bytes], reps: int) -> dict[str, float]:
    """The sequencer agent with the default policy against every detector off, alternated, best of ``reps``."""
    plain, redacted = [], []
    for _ in range(reps):
        plain.append(_agent_pass(records, Redactor(NO_POLICY)))
        redacted.append(_agent_pass(records, Redactor()))
    n = len(records)
    return {"events": n, "plain_us": min(plain) / n * 1e6, "redacted_us": min(redacted) / n * 1e6,
            "redaction_us": (min(redacted) - min(plain)) / n * 1e6, "ratio": min(plain) / min(redacted)}


def run(ctx: BenchContext) -> dict[str, Any]:
    workload = measure(workload_records(30 if ctx.quick else 300), reps=2 if ctx.quick else 5)
    planted = measure(corpus_records(), reps=2 if ctx.quick else 5)
    agent = measure_agent(workload_records(30 if ctx.quick else 300), reps=2 if ctx.quick else 3)
    return {"ours": 1e6 / agent["redacted_us"], "baseline": 1e6 / agent["plain_us"], "unit": "events/CPU-s",
            "goal_ratio": GOAL_RATIO, "details": {"workload": workload, "planted_corpus": planted,
                                                  "sequencer_agent": agent}}


def _show(name: str, m: dict[str, float]) -> None:
    print(f"{name}: {m['events']} events; no policy {m['plain_us']:.1f} µs/event, default policy "
          f"{m['redacted_us']:.1f} µs/event (redaction {m['redaction_us']:.1f} µs); ratio {m['ratio']:.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_redaction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, default=300, help="workload trees (33 events each)")
    parser.add_argument("--reps", type=int, default=5, help="passes per side; the best counts")
    args = parser.parse_args(argv)
    _show("workload", measure(workload_records(args.trees), args.reps))
    _show("planted corpus", measure(corpus_records(), args.reps))
    _show("sequencer agent, workload", measure_agent(workload_records(args.trees), args.reps))


if __name__ == "__main__":
    main()
