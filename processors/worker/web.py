"""The worker's HTTP endpoints (Faust web): Prometheus metrics, audit queries, recorded replay results,
and the web console (:mod:`processors.worker.console`, which also guards every endpoint with the token).

The worker owns the embedded chdb directory, so it is also the process that
answers queries for it: once the web server listens, the worker advertises
``http://127.0.0.1:<port>`` in the store's owner file, which is where
``agentlog query``/``sql`` in another process look for it.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from faust.web import Request, Response, View

from processors.audit.server import handle_query_request
from processors.core.result_cache import ResultCache
from processors.metrics import METRICS, Sample
from processors.replay.compare import REPLAY_COUNTERS
from processors.replay.served import TERMINAL_TYPES, results_answer
from processors.worker import console
from processors.worker.wiring import Wiring
from streams.reader import read_run
from streams.settings import Settings

#: Finished source runs whose result caches the results endpoint keeps in memory: a host mock-replaying a
#: run asks for its results once per call, so a handful of runs replayed at once fit; a run dropped from
#: the cache is only read again from the log.
RESULTS_CACHED_RUNS = 16


class ResultCaches:
    """Result caches of finished source runs, read once from the committed log (LRU-bounded).

    A run that has not ended may still record results, so its cache is rebuilt on every request.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._finished: OrderedDict[str, ResultCache] = OrderedDict()

    async def get(self, run_id: str) -> ResultCache | None:
        if run_id in self._finished:
            self._finished.move_to_end(run_id)
            return self._finished[run_id]
        docs = [c["doc"] for c in await read_run(self.settings, run_id)]
        if not docs:
            return None
        cache = ResultCache.from_events(docs)
        if any(d.get("type") in TERMINAL_TYPES for d in docs):
            self._finished[run_id] = cache
            while len(self._finished) > RESULTS_CACHED_RUNS:
                self._finished.popitem(last=False)
        return cache


def _replay_series() -> Iterator[Sample]:
    """The comparison engine's per-aspect counts, as metric series (summed with re-derivation's)."""
    snap = REPLAY_COUNTERS.snapshot()
    for outcome in ("match", "mismatch"):
        for aspect, n in snap[outcome].items():
            yield f"replay_behavior_{outcome}_total", {"aspect": aspect}, float(n)


def install(wiring: Wiring) -> None:
    """Serve ``/metrics``, ``/health``, ``/query``, ``/sql``, ``/replay/<run>/results`` and the console."""
    app = wiring.app
    console.install(wiring)  # first: its "/" must be routed before Faust's own index page
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

    # Recorded results for mock replay from any language (processors.replay.served).
    results_cache = ResultCaches(wiring.settings)

    @app.page("/replay/{source_run_id}/results")
    class ReplayResults(View):
        async def get(self, request: Request, source_run_id: str) -> Response:
            return await self._answer(source_run_id, dict(request.query))

        async def post(self, request: Request, source_run_id: str) -> Response:
            body, error = await body_of(self, request)
            if error is None and not isinstance(body, dict):
                return self.json({"error": {"code": "bad_request", "message": "body must be a JSON object"}},
                                 status=400)
            return error or await self._answer(source_run_id, {**dict(request.query), **body})

        async def _answer(self, source_run_id: str, params: dict[str, Any]) -> Response:
            cache = await results_cache.get(source_run_id)
            if cache is None:
                return self.json({"error": {"code": "replay_source_missing",
                                            "message": f"the committed log holds no events of run {source_run_id!r}"}},
                                 status=404)
            status, payload = results_answer(cache, source_run_id, params)
            return self.json(payload, status=status)

    @app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
    async def advertise() -> None:
        if wiring.store is not None:
            wiring.store.set_query_url(f"http://127.0.0.1:{wiring.settings.web_port}")
