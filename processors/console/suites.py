"""The console's suite pages: replay-suite executions over time, and one execution's runs.

``/suites`` lists executions (named query ``suite-executions``: suite, when, code version, runs, verdict counts;
``?suite=`` keeps one suite), newest first; ``/suites/<execution>`` lists its runs with the worker's verdict on each
replay (``suite-runs``), diverged first, each linking to the compare view of the original and its replay. A replay
whose verdict the worker has not written yet reads ``pending``; the pages refresh while it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from agentlog.audit.queries import run_named
from agentlog.audit.report import esc
from agentlog.audit.store import Store
from agentlog.console.pages import _badge, _layout, _time, run_href
from agentlog.console.views import Page, _guarded

__all__ = ["suite_execution_view", "suites_view"]


def _execution_href(execution: str) -> str:
    return f"/suites/{quote(execution, safe='')}"


def render_suites_page(rows: Sequence[Mapping[str, Any]], suite: str) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("suite", "started", "code", "runs", "match", "diverged", "what-if",
                                             "pending"))
    body = "".join(
        f'<tr><td><a href="/suites?{urlencode({"suite": r["suite"]})}">{esc(r["suite"])}</a></td>'
        f'<td><a href="{_execution_href(str(r["execution"]))}">{esc(_time(r["started_at"]))}</a></td>'
        f'<td><code>{esc(r["code_version"])}</code></td><td>{esc(r["runs"])}</td>'
        f'<td>{_badge(r["matched"], "match") if r["matched"] else 0}</td>'
        f'<td>{_badge(r["diverged"], "diverged") if r["diverged"] else 0}</td>'
        f'<td>{esc(r["what_if"])}</td><td>{esc(r["pending"])}</td></tr>'
        for r in rows)
    empty = "" if rows else ('<p>No suite executions yet: <code>agentlog suite create</code>, then <code>agentlog '
                             'replay-suite</code> with its runs in this store.</p>')
    title = f"Suite {suite}" if suite else "Suites"
    return _layout(title.lower(), f'<h1>{esc(title)}</h1>{empty}<div id="suites" data-live><table><tr>{head}</tr>'
                                  f"{body}</table></div>", live=any(r["pending"] for r in rows))


def render_execution_page(execution: str, rows: Sequence[Mapping[str, Any]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("run", "verdict", "first divergence", "replay", ""))
    body = "".join(
        f'<tr><td><a href="{run_href(str(r["source_run_id"]))}"><code>{esc(r["source_run_id"])}</code></a></td>'
        f'<td>{_badge(r["verdict"] or "pending")}</td>'
        f'<td>{esc(r["kind"]) + " at " + esc(r["at_sequence"]) if r["kind"] else ""}</td>'
        f'<td><a href="{run_href(str(r["replay_run_id"]))}"><code>{esc(r["replay_run_id"])}</code></a></td>'
        f'<td><a href="/compare?{urlencode({"a": r["source_run_id"], "b": r["replay_run_id"]})}">compare</a></td>'
        f"</tr>" for r in rows)
    suite = str(rows[0]["suite"]) if rows else ""
    code = str(rows[0]["code_version"]) if rows else ""
    title = f'<h1>Suite <a href="/suites?{urlencode({"suite": suite})}">{esc(suite)}</a>, execution ' \
            f"<code>{esc(execution)}</code></h1>" + (f"<p>code <code>{esc(code)}</code></p>" if code else "")
    return _layout(f"suite {suite}", f'{title}<div id="suite-runs" data-live><table><tr>{head}</tr>{body}</table>'
                                     "</div>", live=any(not r["verdict"] for r in rows))


def suites_view(store: Store, query: Mapping[str, str]) -> Page:
    """``/suites``: executions, newest first (``?suite=`` for one suite)."""
    def build() -> Page:
        suite = query.get("suite", "").strip()
        rows = run_named(store, "suite-executions", {"suite": suite, "limit": "200"}).to_dicts()
        return 200, render_suites_page(rows, suite)
    return _guarded("suites", build)


def suite_execution_view(store: Store, execution: str) -> Page:
    """``/suites/<execution>``: the execution's runs and verdicts; 404 for an execution the store does not hold."""
    def build() -> Page:
        rows = run_named(store, "suite-runs", {"execution": execution, "limit": "10000"}).to_dicts()
        if not rows:
            return 404, _layout("suite execution", f"<h1>No suite execution <code>{esc(execution)}</code></h1><p>"
                                                   'It is not in the audit store (yet). <a href="/suites">All '
                                                   "executions</a></p>")
        return 200, render_execution_page(execution, rows)
    return _guarded(f"suite execution {execution}", build)
