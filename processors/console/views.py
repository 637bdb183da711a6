"""Each console page as one call: an open store and the request's parameters in, ``(status, html)`` out.

This is where the console reads: the named queries (``runs``, ``replay-verdicts``, the
analytics ones), the run's records as ``agentlog report`` reads them
(:func:`agentlog.audit.server.report_records`), the fold for the state slider and the
replay comparison engine for the compare page. It imports no web framework, so the worker
(:mod:`agentlog.worker.console`) only routes, and the tests call these with a chdb store.
Calls block (ClickHouse), so the worker runs them in an executor.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agentlog.audit.agents import agent_graph
from agentlog.audit.queries import run_named
from agentlog.audit.server import report_records
from agentlog.audit.store import Store
from agentlog.console.pages import (
    ALIGNED_PER_PAGE,
    PICKER_RUNS,
    RUNS_FILTERS,
    EventsPage,
    compare_section,
    render_analytics_page,
    render_compare_page,
    render_compare_picker_page,
    render_error_page,
    render_replays_page,
    render_run_head,
    render_run_page,
    render_runs_page,
    render_state_panel,
)
from agentlog.console.state import run_state, state_at
from agentlog.replay.compare import compare_runs
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.schemas.errors import AgentlogError, StoreError

__all__ = [
    "EVENTS_PER_PAGE",
    "Page",
    "analytics_view",
    "chain_problem",
    "compare_view",
    "replays_view",
    "run_head",
    "run_view",
    "runs_view",
    "state_fragment",
]

#: ``(HTTP status, HTML)``.
Page = tuple[int, str]

_DEFAULT_LIMIT = 50


def _guarded(title: str, build: Callable[[], Page]) -> Page:
    """Turn a typed error into a page that says what to do (400 for the caller's mistakes, 500 otherwise)."""
    try:
        return build()
    except AgentlogError as e:
        status = 404 if e.code in ("unknown_run", "replay_error") else 400 if e.code == "bad_param" else 500
        return status, render_error_page(title, str(e), code=e.code)


def _int(raw: str | None, default: int, name: str) -> int:
    if raw in (None, ""):
        return default
    if not raw.isdigit():
        raise StoreError(f"parameter {name} must be a non-negative integer, got {raw!r}", code="bad_param")
    return int(raw)


def runs_view(store: Store, query: Mapping[str, str]) -> Page:
    """``/``: the ``runs`` named query with the page's filters."""
    def build() -> Page:
        filters = {k: query.get(k, "") for k in RUNS_FILTERS if query.get(k, "")}
        limit = max(1, min(_int(query.get("limit"), _DEFAULT_LIMIT, "limit"), 1000))
        offset = _int(query.get("offset"), 0, "offset")
        rows = run_named(store, "runs", {**filters, "limit": str(limit), "offset": str(offset)}).to_dicts()
        return 200, render_runs_page(rows, filters, limit=limit, offset=offset)
    return _guarded("Runs", build)


def chain_problem(docs: Sequence[Mapping[str, Any]], hashes: Sequence[tuple[Any, str, str]]) -> str | None:
    """None when every stored event chains from GENESIS to the next (``hash = chain_hash(prevHash, doc)``),
    else where it breaks. ``hashes`` are ``(sequence, prev_hash, hash)`` in sequence order."""
    prev = GENESIS
    for doc, (sequence, prev_hash, hash_) in zip(docs, hashes, strict=True):
        if prev_hash != prev:
            return f"sequence {sequence} says its predecessor hashed {prev_hash[:12]}…, but it hashed {prev[:12]}…"
        if chain_hash(prev_hash, dict(doc)) != hash_:
            return f"sequence {sequence}'s event does not hash to the hash stored with it: it was altered"
        prev = hash_
    return None


#: Opens a stored doc's sealed content (:meth:`agentlog.streams.keyring.Keyring.open`).
Opener = Callable[[dict[str, Any]], dict[str, Any]]


def unsealed(doc: dict[str, Any]) -> dict[str, Any]:
    """The opener of a console without a keyring: docs as stored."""
    return doc


def _opened(events: list[dict[str, Any]], opener: Opener | None) -> list[dict[str, Any]]:
    """``events`` with their content readable (``[erased]`` where the key is gone), for display and comparison."""
    return events if opener is None else [opener(e) for e in events]


def _records(store: Store, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]],
                                                  str]:
    events, transitions, violations, head = report_records(store, run_id)
    if not events:
        raise StoreError(f"run {run_id!r} has no events in the audit history (the sink may not have written it "
                         "yet; this page refreshes once it has)", code="unknown_run")
    return events, transitions, violations, head


def _verdicts(store: Store, run_id: str) -> list[dict[str, Any]]:
    return run_named(store, "replay-verdicts", {"source_run_id": run_id}).to_dicts()


def _links(store: Store, run_id: str, events: Sequence[Mapping[str, Any]], transitions: Sequence[Mapping[str, Any]],
           verdicts: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    # child_run_id is not in the sort key, so this reads the whole column (the tables hold each record once).
    parents = store.query("SELECT DISTINCT parent_run_id FROM transitions WHERE child_run_id = {run_id:String} "
                          "ORDER BY parent_run_id", {"run_id": run_id})
    children = sorted({str(t["childRunId"]) for t in transitions if t.get("childRunId")})
    replay_of = []
    for e in events:
        if e.get("type") == "run.started":
            marker = (e.get("payload") or {}).get("replayOf")
            if isinstance(marker, dict) and marker.get("sourceRunId"):
                replay_of.append(str(marker["sourceRunId"]))
            break
    return {"parents": [str(r[0]) for r in parents.rows], "children": children, "replay_of": replay_of,
            "replays": [str(v["replay_run_id"]) for v in verdicts]}


#: Events on one page of a run (``?limit=``), and the most one page may ask for.
EVENTS_PER_PAGE = 500
MAX_EVENTS_PER_PAGE = 5000


def _page(stored: Sequence[Mapping[str, Any]], query: Mapping[str, str], at: int) -> EventsPage:
    """The page of events ``query`` asks for: from the sequence ``?from=``, else the page holding index ``at``."""
    count = len(stored)
    limit = max(1, min(_int(query.get("limit"), EVENTS_PER_PAGE, "limit"), MAX_EVENTS_PER_PAGE))
    sequences = [seq if isinstance(seq := d.get("sequence"), int) else -1 for d in stored]
    if query.get("from") not in (None, ""):
        first = min(bisect_left(sequences, _int(query.get("from"), 0, "from")), max(count - 1, 0))
    else:
        first = at - at % limit
    starts = {"first": 0, "last": (count - 1) // limit * limit}
    if first > 0:
        starts["previous"] = max(first - limit, 0)
    if first + limit < count:
        starts["next"] = first + limit
    if count <= limit:
        starts = {}
    return EventsPage(first=first, shown=min(limit, count - first), count=count, limit=limit,
                      starts={name: sequences[i] for name, i in starts.items()}, default_limit=EVENTS_PER_PAGE)


def run_view(store: Store, run_id: str, query: Mapping[str, str], opener: Opener | None = None) -> Page:
    """``/runs/<runId>``: the run with the state at ``?at=`` (default: its last index) and one page of its events:
    from the sequence ``?from=``, else the page holding ``at``, ``?limit=`` events (default 500).

    The fold and the chain check cover the whole run; only the page's events are rendered.
    """
    def build() -> Page:
        stored, transitions, violations, head = _records(store, run_id)
        hashes = store.query("SELECT sequence, prev_hash, hash FROM events WHERE run_id = {run_id:String} "
                             "ORDER BY sequence", {"run_id": run_id}).rows
        problem = chain_problem(stored, hashes)  # the chain covers the stored form
        events = _opened(stored, opener)
        last = len(events) - 1
        at = min(_int(query.get("at"), last, "at"), last)
        page = _page(stored, query, at)
        view, status = run_state(events, at)
        verdicts = _verdicts(store, run_id)
        agents = agent_graph(lambda sql: store.query(sql).rows, run_id)
        return 200, render_run_page(
            run_id, events[page.first: page.first + page.shown], transitions, violations, status=status,
            state=view, head_hash=head, chain_problem=problem,
            links=_links(store, run_id, events[:1], transitions, verdicts), verdicts=verdicts, page=page,
            refusals=sum(d.get("type") == "envelope.refusal" for d in stored),
            seq_of={d.get("eventId"): d.get("sequence") for d in stored}, agents=agents,
            head_value=render_run_head(len(stored), head, len(transitions), len(violations), len(verdicts)))
    return _guarded(f"run {run_id}", build)


def run_head(store: Store, run_id: str) -> Page:
    """``/runs/<runId>/head``: what a live run page polls (:func:`agentlog.console.pages.render_run_head`), from
    counts alone, so an open page of a long run costs the worker a page build only when the run moved."""
    def build() -> Page:
        row = store.query(
            "SELECT (SELECT count() FROM events WHERE run_id = {r:String}), "
            "(SELECT argMax(hash, sequence) FROM events WHERE run_id = {r:String}), "
            "(SELECT count() FROM transitions WHERE parent_run_id = {r:String}), "
            "(SELECT count() FROM violations WHERE run_id = {r:String})", {"r": run_id}).rows[0]
        verdicts = len(_verdicts(store, run_id))  # as the page counts them
        return 200, render_run_head(int(row[0]), str(row[1] or ""), int(row[2]), int(row[3]), verdicts)
    return _guarded(f"head of {run_id}", build)


def state_fragment(store: Store, run_id: str, query: Mapping[str, str], opener: Opener | None = None) -> Page:
    """``/runs/<runId>/state?at=N``: the slider's HTML fragment (the run's events read through index N only)."""
    def build() -> Page:
        params: dict[str, Any] = {"run_id": run_id}
        count = int(store.query("SELECT count() FROM events WHERE run_id = {run_id:String}", params).rows[0][0])
        if not count:
            raise StoreError(f"run {run_id!r} has no events in the audit history", code="unknown_run")
        at = min(_int(query.get("at"), count - 1, "at"), count - 1)
        rows = store.query("SELECT doc FROM events WHERE run_id = {run_id:String} ORDER BY sequence "
                           "LIMIT {n:UInt64}", {**params, "n": at + 1}).rows
        events = _opened([json.loads(row[0]) for row in rows], opener)
        return 200, render_state_panel(replace(state_at(events, at), count=count))
    return _guarded(f"state of {run_id}", build)


def compare_view(store: Store, query: Mapping[str, str], opener: Opener | None = None) -> Page:
    """``/compare?a=<run>&b=<run>``: the comparison engine's result on any two stored runs (B judged as a replay
    of A, as ``agentlog compare A B`` judges them), under the run picker, one page of aligned indexes (``?from=``,
    ``?limit=``; default the page holding the first divergence); without both runs, the picker alone
    (recent runs from the ``runs`` named query), and 404 with the picker when a run is not in the store."""
    def build() -> Page:
        a, b = query.get("a", "").strip(), query.get("b", "").strip()
        recent = run_named(store, "runs", {"limit": str(PICKER_RUNS)}).to_dicts()
        if not a or not b:
            return 200, render_compare_picker_page(recent, a, b)
        try:
            original, replay = _opened(_records(store, a)[0], opener), _opened(_records(store, b)[0], opener)
        except StoreError as e:
            if e.code != "unknown_run":
                raise
            return 404, render_compare_picker_page(recent, a, b, problem=str(e))
        result = compare_runs(original, replay, collect_all=True)
        start = None if query.get("from") in (None, "") else _int(query.get("from"), 0, "from")
        limit = max(1, min(_int(query.get("limit"), ALIGNED_PER_PAGE, "limit"), MAX_EVENTS_PER_PAGE))
        return 200, render_compare_page(a, b, original, replay, result, _verdicts(store, a), recent, start=start,
                                        limit=limit)
    return _guarded("compare", build)


def replays_view(store: Store, run_id: str, opener: Opener | None = None) -> Page:
    """``/runs/<runId>/replays``: the run's verdict records and its latest replay compared side by side."""
    def build() -> Page:
        verdicts = _verdicts(store, run_id)
        section = ""
        if verdicts:
            # The replay that started last (verdicts of one sink batch share recorded_at), as `runs` decides.
            ids = [str(v["replay_run_id"]) for v in verdicts]
            started = dict(store.query("SELECT run_id, min(event_time) FROM events WHERE run_id IN {ids:Array(String)} "
                                       "GROUP BY run_id", {"ids": ids}).rows)
            latest = max(reversed(ids), key=lambda r: (r in started, started.get(r)))
            original = _opened(_records(store, run_id)[0], opener)
            replay = _opened(report_records(store, latest)[0], opener)
            if replay:
                section = compare_section(run_id, latest, original, replay,
                                          compare_runs(original, replay, collect_all=True))
        return 200, render_replays_page(run_id, verdicts, section)
    return _guarded(f"replays of {run_id}", build)


def analytics_view(store: Store, query: Mapping[str, str]) -> Page:
    """``/analytics``: cost and tokens over time, refusal rates, handoff latency, rejections."""
    def build() -> Page:
        bucket_s = max(60, _int(query.get("bucket_s"), 3600, "bucket_s"))
        return 200, render_analytics_page(
            usage=run_named(store, "usage-over-time", {"bucket_s": str(bucket_s)}).to_dicts(),
            refusals=run_named(store, "refusals").to_dicts(),
            latency=run_named(store, "handoff-latency").to_dicts(),
            rejections=run_named(store, "rejections").to_dicts(),
            bucket_s=bucket_s)
    return _guarded("Analytics", build)
