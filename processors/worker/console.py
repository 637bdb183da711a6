"""The web console's routes on the worker's Faust web server, and the access token for every endpoint.

The pages themselves are :mod:`processors.console` (no Faust there); this module only maps
URLs to its view calls, runs them in an executor (they block on ClickHouse) and answers
with HTML. Routes (README "Console"):

``/`` runs · ``/runs/<runId>`` a run · ``/runs/<runId>/state?at=N`` the slider's fragment ·
``/runs/<runId>/replays`` its replay verdicts · ``/compare?a=<runId>&b=<runId>`` · ``/analytics``

Access: with ``AGENTLOG_WEB_TOKEN`` set, every request to this server — console
pages, ``/query``, ``/sql``, ``/replay/...``, ``/metrics`` and Faust's own pages — needs
``Authorization: Bearer <token>``, except ``/health`` (liveness probes; it names the worker
and nothing else). A browser opens a page once with ``?token=<token>``: the answer sets an
HttpOnly, SameSite=Strict cookie and redirects to the same URL without the token, so the
token leaves the address bar and later requests carry the cookie. The token is compared in
constant time and never logged. Beyond loopback a token is required at start-up
(:func:`streams.settings.check_web_access`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web as aioweb
from faust.web import Request, Response, View
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from processors.audit.store import Store
from processors.console import (
    Page,
    analytics_view,
    compare_view,
    replays_view,
    run_view,
    runs_view,
    state_fragment,
)
from processors.console.pages import render_error_page
from processors.worker.access import bearer as bearer_of
from processors.worker.access import same_token as _same
from processors.worker.wiring import Wiring
from schemas.errors import ConfigError

__all__ = ["OPEN_PATHS", "ROUTES", "TOKEN_COOKIE", "install", "token_middleware"]

TOKEN_COOKIE = "agentlog_token"
#: Paths answered without a token.
OPEN_PATHS = frozenset({"/health"})

Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]


def token_middleware(token: str) -> Any:
    """An aiohttp middleware that lets a request through only with the token (see the module docstring)."""

    @aioweb.middleware
    async def guard(request: aioweb.Request, handler: Handler) -> aioweb.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        offered = request.query.get("token")
        if offered is not None:
            if not _same(offered, token):
                return _refuse(request, "the token in ?token= is wrong")
            query = {k: v for k, v in request.query.items() if k != "token"}
            response = aioweb.Response(status=303, headers={"Location": str(request.rel_url.with_query(query))})
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/")
            return response
        bearer = bearer_of(request.headers.get("Authorization", ""))
        cookie = request.cookies.get(TOKEN_COOKIE)
        if (bearer is not None and _same(bearer, token)) or (bearer is None and cookie and _same(cookie, token)):
            return await handler(request)
        return _refuse(request, "a wrong token was sent" if bearer or cookie else "no token was sent")

    return guard


def _refuse(request: aioweb.Request, why: str) -> aioweb.Response:
    message = (f"{why}: this worker requires AGENTLOG_WEB_TOKEN; send 'Authorization: Bearer <token>', "
               "or open a page once with ?token=<token>")
    headers = {"WWW-Authenticate": 'Bearer realm="agentlog"'}
    if "text/html" in request.headers.get("Accept", ""):
        return aioweb.Response(text=render_error_page("Token required", message, code="unauthorized"), status=401,
                               content_type="text/html", headers=headers)
    return aioweb.json_response({"error": {"code": "unauthorized", "message": message}}, status=401, headers=headers)


#: A page's view call: ``(store, query parameters, path parameters) -> (status, html)``.
Build = Callable[[Store, dict[str, str], dict[str, str]], Page]

#: (path, view name, view call) of every console page.
ROUTES: tuple[tuple[str, str, Build], ...] = (
    ("/", "console-runs", lambda store, query, match: runs_view(store, query)),
    ("/runs/{run_id}", "console-run", lambda store, query, match: run_view(store, match["run_id"], query)),
    ("/runs/{run_id}/state", "console-state",
     lambda store, query, match: state_fragment(store, match["run_id"], query)),
    ("/runs/{run_id}/replays", "console-replays", lambda store, query, match: replays_view(store, match["run_id"])),
    ("/compare", "console-compare", lambda store, query, match: compare_view(store, query)),
    ("/analytics", "console-analytics", lambda store, query, match: analytics_view(store, query)),
)


def install(wiring: Wiring) -> None:
    """Serve the console's pages; guard every endpoint of the server when a token is set."""
    app = wiring.app
    if wiring.settings.web_token:
        server = app.web
        if not isinstance(server, AiohttpWeb):  # the guard is an aiohttp middleware: never serve unguarded
            raise ConfigError(f"AGENTLOG_WEB_TOKEN needs Faust's aiohttp web driver, not {type(server).__name__}",
                              code="web_token_unsupported")
        server.web_app.middlewares.append(token_middleware(wiring.settings.web_token))

    async def page(view: View, build: Callable[[Store], Page]) -> Response:
        store = wiring.store
        if store is None:
            return view.html(render_error_page("No audit store", "this worker runs without the audit sink "
                                               "(--role process); the console reads the audit history",
                                               code="no_store"), status=503)
        status, body = await asyncio.get_running_loop().run_in_executor(None, build, store)
        return view.html(body, status=status)

    def serve(path: str, name: str, build: Build) -> None:
        class ConsolePage(View):
            async def get(self, request: Request, **match: str) -> Response:
                query = dict(request.query)
                return await page(self, lambda store: build(store, query, match))

        app.page(path, name=name)(ConsolePage)

    for path, name, build in ROUTES:
        serve(path, name, build)
