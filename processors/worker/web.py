"""The worker's HTTP endpoints (Faust web): Prometheus metrics and audit queries.

The worker owns the embedded chdb directory, so it is also the process that
answers queries for it: once the web server listens, the worker advertises
``http://127.0.0.1:<port>`` in the store's owner file, which is where
``agentlog query``/``sql`` in another process look for it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

from faust.web import Request, Response, View

from processors.audit.server import handle_query_request
from processors.metrics import METRICS, Sample
from processors.replay.compare import REPLAY_COUNTERS
from processors.worker.wiring import Wiring


def _replay_series() -> Iterator[Sample]:
    """The comparison engine's per-aspect counts, as metric series (summed with re-derivation's)."""
    snap = REPLAY_COUNTERS.snapshot()
    for outcome in ("match", "mismatch"):
        for aspect, n in snap[outcome].items():
            yield f"replay_behavior_{outcome}_total", {"aspect": aspect}, float(n)


def install(wiring: Wiring) -> None:
    """Serve ``/metrics``, ``/health``, ``/query`` and ``/sql`` on the app's web server."""
    app = wiring.app
    METRICS.add_collector(_replay_series)

    async def answer(view: View, request: Request, body: dict[str, Any]) -> Response:
        if wiring.store is None:
            return view.json({"error": {"code": "no_store", "message": "this worker runs without the audit sink"}},
                             status=503)
        loop = asyncio.get_running_loop()
        status, payload = await loop.run_in_executor(None, handle_query_request, wiring.store, body)
        return view.json(payload, status=status)

    async def body_of(view: View, request: Request) -> tuple[Any, Response | None]:
        try:
            return json.loads(await request.text() or "{}"), None
        except ValueError:
            return None, view.json({"error": {"code": "bad_request", "message": "body is not JSON"}}, status=400)

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            return self.text(METRICS.render(), content_type="text/plain; version=0.0.4")

    @app.page("/health")
    class Health(View):
        async def get(self, request: Request) -> Response:
            return self.json({"ok": True, "worker": wiring.settings.worker_id})

    @app.page("/query")
    class Query(View):
        async def post(self, request: Request) -> Response:
            body, error = await body_of(self, request)
            return error or await answer(self, request, body)

    @app.page("/sql")
    class Sql(View):
        async def post(self, request: Request) -> Response:
            body, error = await body_of(self, request)
            return error or await answer(self, request, body)

    @app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
    async def advertise() -> None:
        if wiring.store is not None:
            wiring.store.set_query_url(f"http://127.0.0.1:{wiring.settings.web_port}")
