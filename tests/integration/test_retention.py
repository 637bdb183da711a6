"""Retention by run class on a real broker and worker: a ``ci`` run tree with a short retention leaves the console
and the queries together once its time is up, and its keys leave the keyring (the log keeps metadata and ciphertext
no key opens); a ``prod`` run published beside it stays whole."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import pytest

from agentlog.audit.server import query_via_worker
from agentlog.core.sealing import ERASED
from agentlog.streams.keyring import load_keyring
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run
from tests.integration.worker.worker_proc import wait_until
from tests.tools import all_committed, http_get
from tests.unit.core.runs import child_runs, realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

#: Long enough for the sink to store the run and the test to see it, short enough to wait out.
CI_RETENTION_S = 30


def _tree(run_id: str, run_class: str) -> dict[str, list[dict]]:
    """A realistic run of ``run_class`` with its children (who name their parent), timed now."""
    runs = {run_id: realistic_run(run_id), **child_runs(run_id)}
    runs[run_id][0]["payload"]["runClass"] = run_class
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for child, docs in runs.items():
        if child != run_id:
            docs[0]["payload"]["parentRunId"] = run_id
        for doc in docs:
            doc["timestamp"] = now
    return runs


def _sql(settings, query: str) -> list[list]:
    answer = query_via_worker(settings, {"sql": query})
    assert answer is not None
    return [list(row) for row in answer["rows"]]


@pytest.fixture
def settings(settings):
    return settings.replace(retention=f"ci={CI_RETENTION_S}s,prod=forever")


def test_a_ci_run_leaves_the_console_and_the_queries_together_and_prod_stays(settings, web_worker):
    worker = web_worker
    settings = worker.settings
    ci_run, prod_run = f"ci-{uuid.uuid4().hex[:8]}", f"prod-{uuid.uuid4().hex[:8]}"
    ci, prod = _tree(ci_run, "ci"), _tree(prod_run, "prod")
    ids = ", ".join(f"'{r}'" for r in [*ci, *prod])

    async def stored() -> None:
        docs = [d for run in (*ci.values(), *prod.values()) for d in run]
        assert (await publish_docs(settings, docs)).accepted == len(docs)
        await wait_until(lambda: all_committed(settings, {**ci, **prod}), timeout=180, what="every run committed",
                         worker=worker)

        async def in_the_store():
            rows = _sql(settings, f"SELECT run_id, count() FROM events WHERE run_id IN ({ids}) GROUP BY run_id")
            return {r[0]: int(r[1]) for r in rows} == {r: len(d) for r, d in {**ci, **prod}.items()} or None

        await wait_until(in_the_store, timeout=CI_RETENTION_S, what="both trees in the audit store", worker=worker)

    published_at = time.monotonic()
    asyncio.run(stored())
    assert http_get(worker, f"/runs/{ci_run}")[0] == 200
    assert ci_run in http_get(worker, "/?limit=500")[1]

    async def ci_gone():
        return http_get(worker, f"/runs/{ci_run}")[0] == 404 or None

    asyncio.run(wait_until(ci_gone, timeout=CI_RETENTION_S + 120, what="the ci run leaving the console",
                           worker=worker))
    assert time.monotonic() - published_at >= CI_RETENTION_S - 5  # not before its time (the clock is the host's)
    # gone from every query at once: the events, the rollups, the transitions, the run list
    for table, column in [("events", "run_id"), ("run_rollup", "run_id"), ("usage_hourly", "run_id"),
                          ("transitions", "parent_run_id"), ("handoff_steps", "parent_run_id")]:
        assert _sql(settings, f"SELECT count() FROM {table} WHERE {column} IN "
                              f"({', '.join(repr(r) for r in ci)})") == [[0]], table
    for child in ci:
        assert http_get(worker, f"/runs/{child}")[0] == 404
    assert ci_run not in http_get(worker, "/?limit=500")[1]
    # the prod tree is whole, and its rollups still equal its events
    assert {r[0]: int(r[1]) for r in _sql(settings, f"SELECT run_id, count() FROM events WHERE run_id IN ({ids}) "
                                                    "GROUP BY run_id")} == {r: len(d) for r, d in prod.items()}
    assert _sql(settings, f"SELECT run_id, sum(events) FROM run_rollup WHERE run_id IN ({ids}) GROUP BY run_id "
                          "ORDER BY run_id") == sorted([r, len(d)] for r, d in prod.items())
    assert http_get(worker, f"/runs/{prod_run}")[0] == 200
    metrics = http_get(worker, "/metrics")[1]
    assert any(line.startswith("agentlog_retention_runs_deleted_total") and float(line.split()[-1]) >= len(ci)
               for line in metrics.splitlines())

    async def keys() -> None:
        keyring = await load_keyring(settings, runs=[*ci, *prod])
        assert all(keyring.erased(r) for r in ci) and not any(keyring.erased(r) for r in prod)
        opened = [c["doc"] for c in await read_run(settings, ci_run)]
        assert [d["eventId"] for d in opened] == [d["eventId"] for d in ci[ci_run]]  # metadata stays on the log
        values = [d["payload"]["value"] for d in opened if d["type"] == "variable.changed"]
        assert values and all(v == ERASED for v in values)
        assert [c["doc"] for c in await read_run(settings, prod_run)] == prod[prod_run]

    asyncio.run(keys())
