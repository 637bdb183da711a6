"""``agentlog report`` on an embedded store no worker holds: the records come straight from ClickHouse."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentlog.audit.migrations import migrate
from agentlog.audit.store import open_store
from agentlog.cli import app
from agentlog.schemas.errors import StoreError
from tests.unit.audit.data import audit_batches


def test_report_reads_the_run_from_the_store_and_writes_one_page(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    batches = audit_batches()
    with open_store(url) as store:
        migrate(store)
        for kind, records in batches.items():
            store.insert_records(kind, records)
    run_events = [r for r in batches["committed"] if r["doc"]["runId"] == "run-1"]
    out = tmp_path / "run-1.html"

    result = CliRunner().invoke(app, ["report", "--run", "run-1", "--out", str(out), "--json"],
                                env={"AGENTLOG_CLICKHOUSE_URL": url, "AGENTLOG_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary == {
        "out": str(out), "runId": "run-1", "events": len(run_events),
        "transitions": len(batches["transition"]),
        "violations": len([v for v in batches["violation"] if v["runId"] == "run-1"]),
        "headHash": run_events[-1]["hash"], "source": "ClickHouse (events, transitions, violations)",
    }
    assert out.read_text("utf-8").startswith("<!DOCTYPE html>")


def test_report_of_an_unknown_run_is_an_unknown_run_error(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    with open_store(url) as store:
        migrate(store)
    result = CliRunner().invoke(app, ["report", "--run", "nope", "--out", str(tmp_path / "x.html")],
                                env={"AGENTLOG_CLICKHOUSE_URL": url, "AGENTLOG_HOME": str(tmp_path / "home")})
    # agentlog.cli.main prints an AgentlogError as one line and exits 2; CliRunner sees the error itself.
    assert isinstance(result.exception, StoreError) and result.exception.code == "unknown_run"


def test_the_report_draws_the_run_trees_agents(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    with open_store(url) as store:
        migrate(store)
        for kind, records in audit_batches().items():
            store.insert_records(kind, records)
    out = tmp_path / "run-1.html"
    result = CliRunner().invoke(app, ["report", "--run", "run-1", "--out", str(out)],
                                env={"AGENTLOG_CLICKHOUSE_URL": url, "AGENTLOG_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    page = out.read_text("utf-8")
    assert "<h2>Agents</h2>" in page and page.count('class="agent"') == 4
    assert 'data-from="run-1" data-to="worker-a" data-count="1" data-failed="0"' in page
    assert "<code>run-1.child-a</code>" in page  # a file links nowhere: the child runs are named
