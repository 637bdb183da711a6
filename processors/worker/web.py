"""The worker's HTTP server (aiohttp): Prometheus metrics, audit queries, recorded replay results,
and the web console (:mod:`agentlog.worker.console`, which also guards every endpoint with the token).

One aiohttp application (:func:`application`) served on ``web_host:web_port`` by an app task
(:func:`install`); Faust's own web server stays off.

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

from aiohttp import web as aioweb

from agentlog.audit.server import handle_query_request
from agentlog.core.result_cache import ResultCache
from agentlog.metrics import METRICS, Sample
from agentlog.replay.compare import REPLAY_COUNTERS
from agentlog.replay.served import TERMINAL_TYPES, results_answer
from agentlog.schemas.errors import ConfigError, ReplayError
from agentlog.streams.keyring import Keyring
from agentlog.streams.reader import read_run
from agentlog.streams.settings import Settings
from agentlog.worker import console
from agentlog.worker.wiring import Wiring

#: Finished source runs whose result caches the results endpoint keeps in memory: a host mock-replaying a
#: run asks for its results once per call, so a handful of runs replayed at once fit; a run dropped from
#: the cache is only read again from the log.
RESULTS_CACHED_RUNS = 16


class ResultCaches:
    """Result caches of finished source runs, read once from the committed log (LRU-bounded).

    A run that has not ended may still record results, so its cache is rebuilt on every request. The caches hold
    opened content, so an erased run's is dropped at its next request, which is refused (``run_erased``).
    """

    def __init__(self, settings: Settings, keyring: Keyring | None = None) -> None:
        self.settings = settings
        self.keyring = keyring
        self._finished: OrderedDict[str, ResultCache] = OrderedDict()

    def forget_erased(self) -> None:
        """Drop the caches of runs erased since they were read."""
        if self.keyring is not None:
            for run_id in [r for r in self._finished if self.keyring.erased(r)]:
                del self._finished[run_id]

    async def get(self, run_id: str) -> ResultCache | None:
        """The run's result cache (None: no events).

        Raises:
            ReplayError: ``run_erased``.
        """
        self.forget_erased()
        if run_id in self._finished:
            self._finished.move_to_end(run_id)
            return self._finished[run_id]
        docs = [c["doc"] for c in await read_run(self.settings, run_id, keyring=self.keyring, refuse_erased=True)]
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


def application(wiring: Wiring) -> aioweb.Application:
    """``/metrics``, ``/health``, ``/query``, ``/sql``, ``/replay/<run>/results`` and the console's pages.

    With ``AGENTLOG_WEB_TOKEN`` set, every path but ``/health`` asks for it (:func:`console.token_middleware`).
    """
    token = wiring.settings.web_token
    http = aioweb.Application(middlewares=[console.token_middleware(token)] if token else [])

    async def answer(request: aioweb.Request) -> aioweb.Response:
        try:
            body = json.loads(await request.text() or "{}")
        except ValueError:
            return aioweb.json_response({"error": {"code": "bad_request", "message": "body is not JSON"}}, status=400)
        if wiring.store is None:
            return aioweb.json_response(
                {"error": {"code": "no_store", "message": "this worker runs without the audit sink"}}, status=503)
        loop = asyncio.get_running_loop()
        status, payload = await loop.run_in_executor(None, handle_query_request, wiring.store, body)
        return aioweb.json_response(payload, status=status)

    async def metrics(request: aioweb.Request) -> aioweb.Response:
        return aioweb.Response(body=METRICS.render().encode("utf-8"),
                               headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def health(request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response({"ok": True, "worker": wiring.settings.worker_id})

    # Recorded results for mock replay from any language (agentlog.replay.served).
    results_cache = ResultCaches(wiring.settings, wiring.keyring)

    async def replay_results(request: aioweb.Request) -> aioweb.Response:
        params: dict[str, Any] = dict(request.query)
        if request.method == "POST":
            try:
                body = json.loads(await request.text() or "{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return aioweb.json_response(
                    {"error": {"code": "bad_request", "message": "body must be a JSON object"}}, status=400)
            params.update(body)
        source_run_id = request.match_info["source_run_id"]
        try:
            cache = await results_cache.get(source_run_id)
        except ReplayError as e:
            return aioweb.json_response({"error": e.to_dict()}, status=410 if e.code == "run_erased" else 400)
        if cache is None:
            return aioweb.json_response(
                {"error": {"code": "replay_source_missing",
                           "message": f"the committed log holds no events of run {source_run_id!r}"}}, status=404)
        status, payload = results_answer(cache, source_run_id, params, wiring.redactor.request)
        return aioweb.json_response(payload, status=status)

    router = http.router
    router.add_get("/metrics", metrics)
    router.add_get("/health", health)
    router.add_post("/query", answer)
    router.add_post("/sql", answer)
    router.add_get("/replay/{source_run_id}/results", replay_results)
    router.add_post("/replay/{source_run_id}/results", replay_results)
    console.add_routes(router, wiring)
    return http


def install(wiring: Wiring, host: str) -> None:
    """Serve :func:`application` on ``host:web_port`` while the worker runs; then advertise it to the store.

    A port that cannot be bound stops the worker (``web_port_unavailable``): it was asked to serve.
    """
    METRICS.add_collector(_replay_series)
    http = wiring.web_app = application(wiring)
    port = wiring.settings.web_port
    wiring.web_address = (host, port)

    async def serve_web() -> None:
        runner = aioweb.AppRunner(http, access_log=None)
        await runner.setup()
        try:
            try:
                await aioweb.TCPSite(runner, host, port).start()
            except OSError as e:
                raise ConfigError(f"the worker's web server cannot listen on {host}:{port} ({e}): set "
                                  "AGENTLOG_WEB_PORT, or start it with --no-web", code="web_port_unavailable") from e
            if wiring.store is not None:
                wiring.store.set_query_url(f"http://127.0.0.1:{port}")
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    wiring.runner.task(serve_web)
