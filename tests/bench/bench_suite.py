"""``agentlog replay-suite`` of 1,000 recorded runs with a pydantic-ai program, 2 jobs, in ``recorded`` mode.

The runs are the support program of :mod:`tests.unit.replay.suite_program` (a pydantic-ai agent with scripted
models: four order lookups, a refund for every third run; 20-24 events each), recorded live with varied inputs
and exported one file per run, as ``agentlog export`` writes them. The suite replays every run from its file, each
model call and tool answered as recorded (``--tools run``: the tools run again), in two processes, as a user runs
the CLI (a process, its ``--json`` report timed from outside). The baseline is recording the same runs in one
process: the program's own cost, with no comparison, no pool, no files. The goal is absolute: at most 60 s.

    .venv/bin/python -m tests.bench.bench_suite [--runs 1000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench import BenchContext

REPO = Path(__file__).resolve().parents[2]
PROGRAM = "tests.unit.replay.suite_program:support"


def measure(runs: int, jobs: int) -> dict[str, Any]:
    from agentlog.replay.regression import record
    from agentlog.replay.suite import Suite, file_run
    from tests.unit.replay import suite_program

    out = Path(tempfile.mkdtemp(prefix="agentlog-bench-suite-"))
    asked = suite_program.inputs(runs, orders=4)
    started = time.monotonic()
    recorded = [record(suite_program.support, run_id=f"bench-suite-{i}", input=a) for i, a in enumerate(asked)]
    record_s = time.monotonic() - started
    members = []
    for docs in recorded:
        path = out / f"{docs[0]['runId']}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
        members.append(file_run(path)[0])
    Suite("bench", tuple(members)).write(out / "suite.json")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agentlog", "replay-suite", str(out / "suite.json"), "--program",
                           PROGRAM, "--jobs", str(jobs), "--json"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    suite_s = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"agentlog replay-suite failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    events = sum(len(docs) for docs in recorded)
    return {
        "ours": suite_s,
        "baseline": record_s,
        "unit": f"s to replay {runs} runs with {jobs} jobs (lower is better; baseline: recording them in one "
                "process)",
        "goal_ratio": None,
        "details": {"goal_s": 60.0, "runs": runs, "jobs": jobs, "events": events, "counts": report["counts"],
                    "report_seconds": report["seconds"], "runs_per_s": round(runs / suite_s, 1)},
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    return measure(100 if ctx.quick else 1000, 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.runs, args.jobs), indent=1))


if __name__ == "__main__":
    main()
