"""``agentlog compare`` of two exported run trees: peak memory against a raw read of the same files.

The runs are :func:`realistic_tree`: :func:`tests.bench.workload.long_run` (a supervisor run repeating the
planner tree's body: decisions, LLM and tool calls, usage, dispatch chains with child runs, channel writes,
harvests) whose LLM calls carry 2–8 KB of content in the request and in the answer and whose tool calls carry
0.5–2 KB of arguments and results, with the child runs of every round beside it. The replay is what an honest
replay host writes for it (:func:`tests.unit.replay.runs.as_replay`: every id and clock new), so the verdict is
``match`` and every event is compared.

Measured: the peak resident set of ``agentlog compare SOURCE REPLAY --json`` as a user runs it (a process of its
own, whose ``VmHWM`` is read as it exits: ``ru_maxrss`` would count the pages of the parent it was forked from),
and of the baseline: a process that imports the same CLI and reads both files line by line,
parsing every event once and keeping none — what any tool that looks at every event pays at least. The ratio
``ours / baseline`` is the claim; the absolute figures stand beside it. Wall time is reported, not judged.

``python -m tests.bench.bench_compare [--events N ...]`` runs it alone; the harness calls ``run(ctx)``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentlog.schemas.canonical import jcs
from tests.bench.workload import long_run
from tests.unit.core.runs import child_runs
from tests.unit.replay.runs import as_replay

REPO = Path(__file__).resolve().parents[2]

#: Run sizes (events of the root run; its child runs add ~18%).
SIZES = (2_000, 20_000, 200_000)
QUICK_SIZES = (2_000,)

_WORDS = ("incident", "latency", "region", "rollback", "the", "deploy", "p95", "budget", "owner", "error", "queue",
          "replica", "cache", "timeout", "a", "of", "and", "retry", "quota", "alert")

#: Prints the process's peak resident set (bytes) on stderr as it exits, then runs the command given.
_PEAK = """
import atexit, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\npeak-rss {kb * 1024}\\n")
atexit.register(_peak)
"""

_COMPARE = _PEAK + """
from agentlog.cli import main
sys.argv = ["agentlog", "compare", *sys.argv[1:], "--json"]
main()
"""

_RAW_READ = _PEAK + """
import agentlog.cli.compare  # the same interpreter and imports as the command measured
from agentlog.schemas.canonical import loads_strict
for name in sys.argv[1:]:
    with open(name, "rb") as f:
        for line in f:
            if line.strip():
                loads_strict(line.decode("utf-8"))
"""


def _text(rng: random.Random, low: int, high: int) -> str:
    size = rng.randrange(low, high)
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def realistic_tree(run_id: str, events: int, *, seed: int = 7) -> list[dict[str, Any]]:
    """A root run of ``events`` events with realistic content, then the child runs its dispatches name."""
    rng = random.Random(seed)
    root = long_run(run_id, events)
    children: list[str] = []
    for doc in root:
        payload = doc["payload"]
        if doc["type"] == "agent.invocation.started":
            payload["request"]["messages"] = [
                {"role": "system", "content": _text(rng, 1_000, 3_000)},
                {"role": "user", "content": _text(rng, 1_000, 5_000)},
            ]
        elif doc["type"] == "agent.invocation.completed":
            payload["envelope"] = {**payload["envelope"], "answer": _text(rng, 2_000, 8_000)}
        elif doc["type"] == "agent.toolCalled":
            payload["args"] = {**payload["args"], "q": _text(rng, 500, 2_000)}
        elif doc["type"] == "agent.toolReturned":
            payload["result"] = {**payload["result"], "snippets": [_text(rng, 200, 700) for _ in range(3)]}
        child = payload.get("childRunId") if isinstance(payload, dict) else None
        if isinstance(child, str) and child not in children:
            children.append(child)
    docs = list(root)
    templates = child_runs(run_id)
    for child in children:
        template = next((docs_ for name, docs_ in templates.items() if child.startswith(name)), None)
        if template is None:
            continue  # a dispatch that created no child run (worker-b fails)
        for doc in template:
            docs.append({**doc, "runId": child, "eventId": f"{child}:{doc['sequence']:04d}"})
    return docs


def replay_tree(docs: list[dict[str, Any]], replay_run_id: str) -> list[dict[str, Any]]:
    """What a replay host writes for the tree: each run through :func:`as_replay`, child ids paired."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        runs.setdefault(doc["runId"], []).append(doc)
    root = docs[0]["runId"]
    out = as_replay(runs.pop(root), replay_run_id=replay_run_id)
    for child, child_docs in runs.items():
        out.extend(as_replay(child_docs, replay_run_id=child.replace(root, f"{replay_run_id}-fresh")))
    return out


def write_jsonl(path: Path, docs: list[dict[str, Any]]) -> int:
    """The docs as ``agentlog export`` writes them: one JCS line each."""
    with path.open("wb") as f:
        for doc in docs:
            f.write(jcs(doc) + b"\n")
    return path.stat().st_size


def _peak_rss(program: str, *args: str) -> tuple[int, float, int, str]:
    """(peak RSS in bytes, wall seconds, exit code, stdout) of ``python -c program args…``."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, cwd=REPO)
    peak = int(done.stderr.rsplit("peak-rss ", 1)[1].split()[0])
    return peak, time.perf_counter() - t0, done.returncode, done.stdout


def _write(events: int, home: Path) -> dict[str, int]:
    """Writes the source and replay files (in a process of their own, so this one stays small)."""
    src, rep = home / f"src-{events}.jsonl", home / f"rep-{events}.jsonl"
    original = realistic_tree("bench-src", events)
    replay = replay_tree(original, "bench-rep")
    return {"events": len(original) + len(replay), "file_bytes": write_jsonl(src, original) + write_jsonl(rep, replay)}


def measure(events: int, home: Path) -> dict[str, Any]:
    written = subprocess.run([sys.executable, "-m", "tests.bench.bench_compare", "--write", str(home), "--events",
                              str(events)], capture_output=True, text=True, cwd=REPO, check=True)
    sizes = json.loads(written.stdout)
    count, size = sizes["events"], sizes["file_bytes"]
    src, rep = str(home / f"src-{events}.jsonl"), str(home / f"rep-{events}.jsonl")
    ours, ours_s, code, out = _peak_rss(_COMPARE, src, rep)
    verdict = json.loads(out)["verdict"] if out.strip() else None
    assert code == 0 and verdict == "match", (code, out[:300])
    raw, raw_s, raw_code, _ = _peak_rss(_RAW_READ, src, rep)
    assert raw_code == 0
    return {"events": count, "root_events": events, "file_bytes": size, "peak_rss_bytes": ours,
            "raw_read_rss_bytes": raw, "ratio": round(ours / raw, 2), "compare_s": round(ours_s, 2),
            "raw_read_s": round(raw_s, 2)}


def run(ctx: Any) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="agentlog-bench-compare-"))
    try:
        rows = [measure(n, home) for n in (QUICK_SIZES if ctx.quick else SIZES)]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    largest = rows[-1]
    return {"ours": largest["peak_rss_bytes"] / 2**20, "baseline": largest["raw_read_rss_bytes"] / 2**20,
            "unit": f"MB peak RSS (compare of {largest['events']:,} events)", "goal_ratio": None,
            "details": {"sizes": rows}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_compare", description=__doc__)
    parser.add_argument("--events", type=int, nargs="+", default=list(SIZES), help="root-run sizes to measure")
    parser.add_argument("--write", type=Path, help="only write the files of each size into this folder")
    args = parser.parse_args(argv)
    if args.write is not None:
        for n in args.events:
            print(json.dumps(_write(n, args.write)), flush=True)
        return 0
    home = Path(tempfile.mkdtemp(prefix="agentlog-bench-compare-"))
    try:
        for n in args.events:
            print(json.dumps(measure(n, home)), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
