"""One demo per module for the console's browser tests: the real broker, a real worker process, the demo run.

The demo (:func:`agentlog.demo.tour.run_demo`, what ``tests/integration/demo`` checks end to end) leaves
its worker running, and that worker serves the console; the fixture stops it afterwards.
Expected values are read from the audit history the demo queried (its run-timeline rows), never
from the console itself.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console

from agentlog.demo.tour import DemoSummary, run_demo, stop_worker
from agentlog.streams.settings import Settings, load_settings
from tests.tools import free_port


@dataclass(frozen=True)
class DemoConsole:
    settings: Settings
    summary: DemoSummary
    url: str  # the worker's base URL
    timeline: list[dict[str, Any]]  # run-timeline rows of the demo run, from ClickHouse
    printed: str  # what the demo printed

    def index_of(self, type_: str, node: str | None = None) -> int:
        return next(r["sequence"] for r in self.timeline
                    if r["type"] == type_ and (node is None or r["node_id"] == node))


@pytest.fixture(scope="module")
def demo_console(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoConsole]:
    home = tmp_path_factory.mktemp("console-demo")
    settings = load_settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=f"c{uuid.uuid4().hex[:8]}", home=home,
                             clickhouse_url=f"chdb://{home / 'ch'}", replication_factor=1, partitions=2,
                             web_port=free_port())
    try:
        out = io.StringIO()
        summary = run_demo(settings, Console(file=out, width=200, color_system=None))
        timeline = summary.queries["run-timeline"]
        rows = [dict(zip(timeline["columns"], row, strict=False)) for row in timeline["rows"]]
        yield DemoConsole(settings, summary, str(summary.worker["url"]), rows, out.getvalue())
    finally:
        stop_worker(settings)
