"""Fold throughput on a generated long multi-agent run (not a test: no thresholds).

    .venv/bin/python -m tests.unit.core.bench_fold [--events 100000] [--mode check|derive] [--hash-every 0]

The run repeats planner turns: a decision naming two workers, their dispatches
(host chain events in check mode, node.dispatched in derive mode), and between
them the bulk of a real run: LLM invocations, provider usage, tool calls,
variable changes over a bounded set of names, and channel writes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from agentlog.core.fold import fold, state_hash

from .runs import RunLog


def generate(n_events: int, mode: str = "check", filler_per_dispatch: int = 40, run_id: str = "bench") -> list[dict]:
    log = RunLog(run_id)
    log.add("run.started", {"bindings": {"engineVersion": "1"}})
    turn = 0

    def filler(k: int) -> None:
        for i in range(k):
            r = (len(log.docs) + i) % 10
            if r in (0, 1):
                log.add("agent.invocation.started", {"request": {"model": "m", "messages": [{"role": "user", "content": "q"}]},
                                                     "cacheKey": f"k{i}", "recipe": "spec-rfc-0041"})
            elif r == 2:
                log.add("agent.invocation.completed", {"cacheKey": f"k{i}", "envelope": {"kind": "valid", "text": "ok"}})
            elif r == 3:
                log.add("provider.usage", {"provider": "p", "model": "m", "inputTokens": 100, "outputTokens": 20})
            elif r == 4:
                log.add("agent.toolCalled", {"callId": f"c{i}", "tool": "search", "args": {"q": "x"}})
            elif r == 5:
                log.add("agent.toolReturned", {"callId": f"c{i}", "result": {"hits": 3}})
            elif r in (6, 7):
                log.add("variable.changed", {"name": f"v{(len(log.docs) * 7) % 50}", "value": {"n": len(log.docs)}})
            elif r == 8:
                log.add("channel.written", {"channel": f"ch{len(log.docs) % 4}", "value": len(log.docs)})
            else:
                log.add("node.completed", {"nodeId": "n"})

    while len(log.docs) < n_events:
        turn += 1
        workers = [f"w{turn % 7}", f"w{(turn + 3) % 7}"]
        d = log.add("runOrchestrator.decided", {"agentId": "agent.planner",
                                                "decision": {"nextWorkerIds": workers, "outputMapping": {"out": f"r{turn}"}}})
        for w in workers:
            if mode == "check":
                b = log.chain("dispatch.began", w, d)
                ok = log.chain("dispatch.succeeded", w, b, childRunId=f"{run_id}.{turn}.{w}")
                filler(filler_per_dispatch)
                done = log.chain("child.completed", w, ok, childRunId=f"{run_id}.{turn}.{w}")
                log.chain("output.harvested", w, done, childRunId=f"{run_id}.{turn}.{w}", harvestedKeys=[f"r{turn}"])
            else:
                log.add("node.dispatched", {"childRunId": f"{run_id}.{turn}.{w}", "childWorkflowId": w})
                filler(filler_per_dispatch)
    return log.docs[:n_events]


def measure(events: list[dict[str, Any]], mode: str, hash_every: int) -> dict[str, Any]:
    state = None
    n_out = 0
    hashes = 0
    t0 = time.perf_counter()
    for i, e in enumerate(events):
        state, out = fold(state, e, handoff_mode=mode)
        n_out += len(out)
        if hash_every and i % hash_every == 0:
            state_hash(state)
            hashes += 1
    dt = time.perf_counter() - t0
    return {
        "events": len(events), "seconds": round(dt, 3), "events_per_s": round(len(events) / dt),
        "outputs": n_out, "hashes": hashes, "machines": len(state["handoffs"]),
        "channel_values": sum(len(v) for v in state["channels"].values()),
        "final_state_hash_ms": round(_time_hash(state) * 1000, 2),
    }


def _time_hash(state: dict) -> float:
    t0 = time.perf_counter()
    state_hash(state)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--mode", choices=["check", "derive"], default="check")
    ap.add_argument("--filler", type=int, default=40, help="opaque/state events between dispatch and child outcome")
    ap.add_argument("--hash-every", type=int, default=0, help="also compute state_hash every N events (0 = never)")
    args = ap.parse_args()
    events = generate(args.events, args.mode, args.filler)
    print(measure(events, args.mode, args.hash_every))


if __name__ == "__main__":
    main()
