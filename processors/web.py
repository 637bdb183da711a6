"""The worker's HTTP endpoints (Faust web): Prometheus metrics and audit queries.

The worker owns the embedded chdb directory, so it is also the process that
answers queries for it; ``agentlog query``/``sql`` find it through the store's
owner file.
"""

from __future__ import annotations

import asyncio
import json


def install(wiring) -> None:
    from processors.metrics import METRICS

    app = wiring.app

    @app.page("/metrics")
    async def metrics(web, request):
        _refresh_replay_counters()
        return web.text(METRICS.render(), content_type="text/plain; version=0.0.4")

    @app.page("/health")
    async def health(web, request):
        return web.json({"ok": True, "worker": wiring.settings.worker_id})

    async def _query(web, request):
        from processors.query_server import handle_query_request

        if wiring.store is None:
            return web.json({"error": {"code": "no_store", "message": "this worker runs without the audit sink"}}, status=503)
        try:
            body = json.loads(await request.text() or "{}")
        except ValueError:
            return web.json({"error": {"code": "bad_request", "message": "body is not JSON"}}, status=400)
        loop = asyncio.get_running_loop()
        status, payload = await loop.run_in_executor(None, handle_query_request, wiring.store, body)
        return web.json(payload, status=status)

    @app.page("/query")
    async def query(web, request):
        return await _query(web, request)

    @app.page("/sql")
    async def sql(web, request):
        return await _query(web, request)


def _refresh_replay_counters() -> None:
    """Mirror the comparison engine's per-aspect counters into the registry."""
    from processors.metrics import METRICS

    try:
        from processors.compare import ReplayCounters  # noqa: F401
        from processors import compare
    except ImportError:
        return
    counters = getattr(compare, "COUNTERS", None)
    snapshot = getattr(counters, "snapshot", None)
    if snapshot is None:
        return
    for aspect, (match, mismatch) in snapshot().items():
        METRICS.set("replay_behavior_match_total", match, aspect=aspect)
        METRICS.set("replay_behavior_mismatch_total", mismatch, aspect=aspect)
