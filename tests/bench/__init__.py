"""Benchmarks: ``python -m tests.bench [--only NAME] [--quick]``.

Each ``tests/bench/bench_<name>.py`` exposes ``run(ctx: BenchContext) -> dict`` returning
``{"ours", "baseline", "unit", "goal_ratio", "details"}``; the harness starts (or
finds) a real broker, runs them and prints one table. Figures are measured on this
machine against its own baseline, so the ratio — not the absolute number — is the
claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.settings import Settings


@dataclass(frozen=True)
class BenchContext:
    """What a benchmark gets: settings pointing at a running broker, and the size knob."""

    settings: Settings
    quick: bool = False
