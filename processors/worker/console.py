"""The web console's routes on the worker's web server (:mod:`agentlog.worker.web`), and the access token
for every endpoint.

The pages themselves are :mod:`agentlog.console` (no Faust there); this module only maps
URLs to its view calls, runs them in an executor (they block on ClickHouse) and answers
with HTML. Routes (README "Console"):

``/`` runs · ``/runs/<runId>`` a run · ``/runs/<runId>/state?at=N`` the slider's fragment ·
``/runs/<runId>/head`` what an open run page polls ·
``/runs/<runId>/replays`` its replay verdicts · ``/compare`` the run picker, ``?a=<runId>&b=<runId>`` two
runs compared · ``/analytics``

Access: with ``AGENTLOG_WEB_TOKEN`` set, every request to this server — console
pages, ``/query``, ``/sql``, ``/replay/...``, ``/metrics`` — needs
``Authorization: Bearer <token>``, except ``/health`` (liveness probes; it names the worker
and nothing else). A browser opens a page once with ``?token=<token>``: the answer sets an
HttpOnly, SameSite=Strict cookie and redirects to the same URL without the token, so the
token leaves the address bar and later requests carry the cookie. The token is compared in
constant time and never logged. Beyond loopback a token is required at start-up
(:func:`agentlog.streams.settings.check_web_access`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web as aioweb

from agentlog.audit.store import Store
from agentlog.console import (
    Opener,
    Page,
    analytics_view,
    compare_view,
    replays_view,
    run_head,
    run_view,
    runs_view,
    state_fragment,
    unsealed,
)
from agentlog.console.pages import render_error_page
from agentlog.console.suites import suite_execution_view, suites_view
from agentlog.worker.access import bearer as bearer_of
from agentlog.worker.access import same_token as _same
from agentlog.worker.wiring import Wiring

__all__ = ["OPEN_PATHS", "ROUTES", "TOKEN_COOKIE", "add_routes", "token_middleware"]

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


#: A page's view call: ``(store, opener, query parameters, path parameters) -> (status, html)``; ``opener`` opens a
#: stored doc's sealed content (the worker's keyring).
Build = Callable[[Store, Opener, dict[str, str], dict[str, str]], Page]

#: (path, view name, view call) of every console page.
ROUTES: tuple[tuple[str, str, Build], ...] = (
    ("/", "console-runs", lambda store, opener, query, match: runs_view(store, query)),
    ("/runs/{run_id}", "console-run",
     lambda store, opener, query, match: run_view(store, match["run_id"], query, opener)),
    ("/runs/{run_id}/state", "console-state",
     lambda store, opener, query, match: state_fragment(store, match["run_id"], query, opener)),
    ("/runs/{run_id}/head", "console-head", lambda store, opener, query, match: run_head(store, match["run_id"])),
    ("/runs/{run_id}/replays", "console-replays",
     lambda store, opener, query, match: replays_view(store, match["run_id"], opener)),
    ("/compare", "console-compare", lambda store, opener, query, match: compare_view(store, query, opener)),
    ("/analytics", "console-analytics", lambda store, opener, query, match: analytics_view(store, query)),
    ("/suites", "console-suites", lambda store, opener, query, match: suites_view(store, query)),
    ("/suites/{execution}", "console-suite-execution",
     lambda store, opener, query, match: suite_execution_view(store, match["execution"])),
)


def add_routes(router: aioweb.UrlDispatcher, wiring: Wiring) -> None:
    """Serve the console's pages (each view call in an executor: they block on ClickHouse)."""

    def serve(path: str, name: str, build: Build) -> None:
        async def page(request: aioweb.Request) -> aioweb.Response:
            store = wiring.store
            if store is None:
                return aioweb.Response(text=render_error_page(
                    "No audit store", "this worker runs without the audit sink (--role process); the console "
                    "reads the audit history", code="no_store"), status=503, content_type="text/html")
            query, match = dict(request.query), dict(request.match_info)
            opener = wiring.keyring.open if wiring.keyring is not None else unsealed
            status, body = await asyncio.get_running_loop().run_in_executor(None, build, store, opener, query, match)
            return aioweb.Response(text=body, status=status, content_type="text/html")

        router.add_get(path, page, name=name)

    for path, name, build in ROUTES:
        serve(path, name, build)
