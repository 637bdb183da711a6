"""Benchmarks: ``python -m tests.bench [--only NAME] [--quick]``.

Each ``tests/bench/bench_<name>.py`` exposes ``run(ctx: BenchContext) -> dict`` returning
``{"ours", "baseline", "unit", "goal_ratio", "details"}``; the harness starts (or
finds) a real broker, runs them and prints one table. Figures are measured on this
machine against its own baseline, so the ratio — not the absolute number — is the
claim.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlog.streams.settings import Settings

#: How a bench starts Faust's pass-through agent (:mod:`tests.bench.passthrough_faust`). Faust's ``worker``
#: command turns its web server on (port 6066) unless told otherwise, so two benches on one
#: machine collided on the port without ``--without-web``.
PASSTHROUGH_ARGS = ["-m", "tests.bench.passthrough_faust", "worker", "-l", "warn", "--without-web"]


#: The topic prefixes this process's benches used: the harness deletes their topics at the end, and
#: no other's (another bench run on the same broker may be creating its own meanwhile).
OWN_PREFIXES: set[str] = set()


def own(prefix: str) -> str:
    """``prefix``, noted as this process's (:data:`OWN_PREFIXES`)."""
    OWN_PREFIXES.add(prefix)
    return prefix


@dataclass(frozen=True)
class BenchContext:
    """What a benchmark gets: settings pointing at a running broker, and the size knob."""

    settings: Settings
    quick: bool = False

    def on_own_topics(self, prefix: str, home: Path, **changes: Any) -> Settings:
        """The broker's settings for one path of a bench: its own topic prefix and home, 4 partitions, no web.

        ``changes`` override any of these (``otlp_port`` to turn the OTLP receiver on).
        """
        return self.settings.replace(**{"topic_prefix": own(prefix), "home": home, "partitions": 4,
                                        "replication_factor": 1, "otlp_port": 0, **changes})


def store_main(prog: str, doc: str, measure: Callable[..., dict[str, Any]], show: Callable[[dict[str, Any]], None],
               *, reps: int, reps_help: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The stand-alone entry of a bench over a generated store (``--events N --reps R``): measure, print, return."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000, help="committed events to generate")
    parser.add_argument("--reps", type=int, default=reps, help=reps_help)
    args = parser.parse_args(argv)
    result = measure(args.events, reps=args.reps)
    show(result)
    return result
