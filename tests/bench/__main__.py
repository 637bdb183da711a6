"""The bench harness: find the benchmarks, make sure a broker runs, print one table, save JSON."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import json
import os
import pkgutil
import platform
import socket
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import tests.bench as bench
from agentlog.infra.kafka.local import KAFKA_VERSION
from agentlog.schemas.errors import AgentlogError
from agentlog.streams.settings import Settings, load_settings
from tests.bench import BenchContext

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
BENCH_HOME = REPO / ".agentlog" / "bench"
# A broker the harness starts itself listens here, away from `agentlog infra up` (19092) and tests (19192).
BENCH_PORT = 19292


def _answers(bootstrap: str) -> bool:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except (OSError, ValueError):
        return False


def _broker(console: Console) -> tuple[Settings, Settings | None]:
    """Settings for a running broker; the second value is set when we started it (to stop it after)."""
    configured = load_settings()
    if _answers(configured.kafka_bootstrap):
        console.print(f"using the broker at {configured.kafka_bootstrap}")
        return configured, None
    from agentlog.infra.kafka import local

    own = load_settings(home=BENCH_HOME, kafka_bootstrap=f"127.0.0.1:{BENCH_PORT}")
    console.print(f"no broker at {configured.kafka_bootstrap}; starting one under {BENCH_HOME} …")
    nodes = local.start(own, nodes=1)
    started = any(n.started for n in nodes)
    return own.replace(kafka_bootstrap=local.bootstrap_servers(nodes)), own if started else None


#: Events of the warm-up pass (:func:`_warm`).
WARM_EVENTS = 100_000


def _warm(ctx: BenchContext) -> dict[str, float]:
    """Load the broker before anything is measured: bare consume -> produce, without and with transactions.

    A broker's JVM compiles its hot paths under load. Measured first on a broker just started, bare aiokafka moved
    25-35k events/s where it moves 75k once the broker has carried a minute of traffic, and every ratio to it
    moved with it. Each bench then starts on the same warm broker, whichever runs first.
    """
    from tests.bench.bench_runtime import baselines, variants

    n = 5_000 if ctx.quick else WARM_EVENTS
    bare, bare_tx = baselines(variants(ctx, BENCH_HOME / "warm", "benchwarm", n), n)
    return {"events": n, "bare_events_per_s": bare, "bare_tx_events_per_s": bare_tx}


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _machine(settings: Settings) -> dict:
    import aiokafka

    return {
        "nproc": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka_version": KAFKA_VERSION,
        "aiokafka": aiokafka.__version__,
    }


def _discover(only: str | None) -> list[str]:
    names = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    if only is not None:
        if only not in names:
            raise SystemExit(f"no benchmark {only!r}; known: {', '.join(names)}")
        names = [only]
    return names


def _topics(settings: Settings) -> set[str]:
    from agentlog.streams.admin import list_topic_names

    return asyncio.run(list_topic_names(settings))


def _clean_up_topics(console: Console, settings: Settings, before: set[str]) -> dict[str, int]:
    """Delete the topics this run's benches created (their prefixes: :data:`tests.bench.OWN_PREFIXES`); report the counts.

    A broker that keeps every run's topics grows to thousands, and every all-topics metadata response
    a client decodes lists them all: the figures of later runs would then pay for earlier ones.
    """
    from agentlog.streams.admin import delete_topics
    from tests.bench import OWN_PREFIXES

    during = _topics(settings)
    created = sorted(t for t in during - before
                     if any(t.startswith((prefix + ".", prefix + "-")) for prefix in OWN_PREFIXES))
    deleted = asyncio.run(delete_topics(settings, created)) if created else 0
    counts = {"while_measuring": len(during), "created": len(created), "deleted": deleted,
              "after": len(during) - deleted}
    console.print(f"broker topics: {counts['while_measuring']} while measuring; the bench's "
                  f"{len(created)} deleted ({deleted} accepted), {counts['after']} left")
    return counts


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--only", help="run one benchmark (name without bench_)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    console = Console()
    load_at_start = os.getloadavg()  # a shared machine: figures mean little without it
    names = _discover(args.only)
    try:
        settings, started = _broker(console)
    except AgentlogError as e:
        console.print(f"error[{e.code}]: {e}")
        return 2
    ctx = BenchContext(settings=settings, quick=args.quick)
    results: dict[str, dict] = {}
    warm: dict[str, float] = {}
    try:
        console.print("[bold]warming the broker[/] …")
        before = _topics(settings)
        warm = _warm(ctx)
        _clean_up_topics(console, settings, before)
        for name in names:
            console.print(f"[bold]bench {name}[/] …")
            t0 = time.perf_counter()
            before = _topics(settings)
            try:
                module = importlib.import_module(f"tests.bench.bench_{name}")
                result = module.run(ctx)
            except Exception as e:  # one broken benchmark must not hide the others' figures
                console.print_exception(max_frames=5)
                result = {"error": f"{type(e).__name__}: {e}", "ours": None, "baseline": None,
                          "unit": "", "goal_ratio": None}
            result["wall_s"] = round(time.perf_counter() - t0, 2)
            result["broker_topics"] = _clean_up_topics(console, settings, before)
            results[name] = result
    finally:
        if started is not None:
            from agentlog.infra.kafka import local

            local.stop(started)

    table = Table(title="agentlog benchmarks" + (" (--quick)" if args.quick else ""))
    for col in ("name", "ours", "baseline", "unit", "ratio", "goal", "met"):
        table.add_column(col, justify="right" if col not in ("name", "unit") else "left")
    for name, r in results.items():
        if "error" in r:
            table.add_row(name, "-", "-", "", "-", "-", f"[red]error[/]: {r['error'][:60]}")
            continue
        ratio = r["ours"] / r["baseline"] if r.get("baseline") else None
        r["ratio"] = ratio
        goal = r.get("goal_ratio")
        met = None if goal is None else ratio is not None and ratio >= goal
        r["met"] = met
        table.add_row(
            name, _fmt(r["ours"]), _fmt(r.get("baseline")), r["unit"],
            "-" if ratio is None else f"{ratio:.4f}×" if ratio < 0.01 else f"{ratio:.2f}×",
            "—" if goal is None else f"≥ {goal}×",
            "—" if met is None else "[green]yes[/]" if met else "[red]no[/]",
        )
    console.print(table)

    RESULTS.mkdir(exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    # One file per run (several runs a day must not overwrite each other), plus latest.json.
    out = RESULTS / f"{now:%Y-%m-%d-%H%M%S}.json"
    record = {"at": now.isoformat(), "quick": args.quick, "argv": sys.argv[1:], "machine": _machine(settings),
              "load_average": {"start": load_at_start, "end": os.getloadavg()}, "warm_up": warm, "results": results}
    text = json.dumps(record, indent=2, default=str) + "\n"
    out.write_text(text)
    (RESULTS / "latest.json").write_text(text)
    console.print(f"results → {out} (and {RESULTS / 'latest.json'})")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
