"""Web access rules: no serving beyond loopback without a token; with one, every path but /health asks for it.

The middleware is exercised on a real aiohttp server (the kind the worker runs) over TCP.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import ClientSession, CookieJar, web
from aiohttp.test_utils import TestServer

from agentlog.schemas.errors import ConfigError
from agentlog.streams.settings import Settings, check_web_access, load_settings
from agentlog.worker.console import TOKEN_COOKIE, token_middleware

TOKEN = "s3cret-token"


def test_beyond_loopback_a_token_is_required(monkeypatch: pytest.MonkeyPatch):
    check_web_access(Settings())  # loopback, no token: fine
    check_web_access(Settings(web_host="0.0.0.0", web_token=TOKEN))
    with pytest.raises(ConfigError) as e:
        check_web_access(Settings(web_host="0.0.0.0"))
    assert e.value.code == "web_token_required" and "AGENTLOG_WEB_TOKEN" in str(e.value)
    monkeypatch.setenv("AGENTLOG_WEB_HOST", "10.1.2.3")
    monkeypatch.setenv("AGENTLOG_WEB_TOKEN", TOKEN)
    settings = load_settings()
    assert (settings.web_host, settings.web_token) == ("10.1.2.3", TOKEN)
    assert TOKEN not in repr(settings)  # never printed


def test_the_worker_refuses_to_start_without_one(tmp_path):
    from agentlog.worker.app import build_app

    with pytest.raises(ConfigError, match="AGENTLOG_WEB_TOKEN"):
        build_app(Settings(home=tmp_path, web_host="0.0.0.0", worker_role="process"), web=True)
    # Without its web server a worker still serves OTLP on web_host: the same rule.
    with pytest.raises(ConfigError, match="OTLP"):
        build_app(Settings(home=tmp_path, web_host="0.0.0.0", worker_role="process"), web=False)
    build_app(Settings(home=tmp_path, web_host="0.0.0.0", worker_role="process", otlp_port=0), web=False)
    # With a token it binds where it was told and guards its whole server.
    wiring = build_app(Settings(home=tmp_path, web_host="0.0.0.0", web_token=TOKEN, worker_role="process"), web=True)
    assert wiring.web_address == ("0.0.0.0", 6066)
    assert [m.__name__ for m in wiring.web_app.middlewares] == ["guard"]


async def _exchange(requests: list[tuple[str, dict[str, str]]]) -> list[tuple[int, str, Any]]:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text=f"ok {request.path}")

    app = web.Application(middlewares=[token_middleware(TOKEN)])
    for path in ("/", "/health", "/query", "/runs/r1"):
        app.router.add_get(path, ok)
    out = []
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as http:
        for path, headers in requests:
            async with http.get(server.make_url(path), headers=headers, allow_redirects=False) as resp:
                out.append((resp.status, await resp.text(), resp))
    return out


def test_every_path_but_health_needs_the_token():
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    got = asyncio.run(_exchange([
        ("/query", {}), ("/query", {"Authorization": "Bearer wrong"}), ("/query", bearer), ("/health", {}),
        ("/runs/r1", {"Accept": "text/html"}), ("/", {"Authorization": f"bearer {TOKEN}"}),
    ]))
    assert [status for status, _, _ in got] == [401, 401, 200, 200, 401, 200]
    assert '"code": "unauthorized"' in got[0][1] and "no token was sent" in got[0][1]
    assert "a wrong token was sent" in got[1][1]
    assert got[0][2].headers["WWW-Authenticate"].startswith("Bearer")
    assert "<html" in got[4][1] and "Token required" in got[4][1]
    assert TOKEN not in got[0][1] + got[1][1] + got[4][1]


def test_a_page_opened_with_the_token_sets_a_cookie_and_drops_it_from_the_url():
    async def flow() -> list[int]:
        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application(middlewares=[token_middleware(TOKEN)])
        app.router.add_get("/runs/r1", ok)
        # unsafe: a jar keeps cookies of an IP-address host (127.0.0.1) only when told to, as a browser does
        async with TestServer(app, host="127.0.0.1") as server, ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
            async with http.get(server.make_url("/runs/r1?token=wrong")) as resp:
                wrong = resp.status
            async with http.get(server.make_url(f"/runs/r1?at=3&token={TOKEN}"), allow_redirects=False) as resp:
                assert resp.headers["Location"] == "/runs/r1?at=3"
                cookie = resp.cookies[TOKEN_COOKIE]
                assert cookie["httponly"] and cookie["samesite"] == "Strict"
                redirect = resp.status
            async with http.get(server.make_url("/runs/r1?at=3")) as resp:  # the session sends the cookie
                after = resp.status
        return [wrong, redirect, after]

    assert asyncio.run(flow()) == [401, 303, 200]
