"""The console's pages: records in, one self-contained HTML string out (no I/O, no framework).

Every page carries its CSS and its little script inline and loads nothing from anywhere
else, like ``agentlog report``'s page, whose graph and handoff lanes it reuses
(:mod:`agentlog.audit.report`). The script does two things only, and every page works
without it: the state slider asks the worker for the state at another index (an HTML
fragment, :func:`render_state_panel`), pages marked live re-read themselves every few
seconds and swap in the parts marked ``data-live`` (runs table, a run's events, graph,
lanes and verdicts), so a page open on a running run follows it, and the compare page's run
picker offers the runs whose id contains what is typed (the ``runs`` named query, asked at
``/query``) and fills a run in from the list of recent runs.

Links carry no token: when the worker asks for one, a page opened once with ``?token=``
has set a cookie that the browser sends with every later request (README "Console").
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from agentlog.audit.agents import AgentGraph
from agentlog.audit.report import (
    REPORT_CSS,
    agent_graph_svg,
    agents_table,
    esc,
    graph_svg,
    legend_html,
    normalise_events,
    sort_transitions,
    timeline_svg,
    violated_by_event,
    violations_table,
)
from agentlog.console.charts import bar_chart, line_chart
from agentlog.console.state import StateView
from agentlog.core.fold import STATUSES
from agentlog.replay.compare import ComparisonResult
from agentlog.schemas.stability import is_volatile, iter_paths

__all__ = [
    "EventsPage",
    "LIVE_POLL_MS",
    "RUNS_FILTERS",
    "ALIGNED_PER_PAGE",
    "VERDICTS",
    "render_analytics_page",
    "render_compare_page",
    "render_compare_picker_page",
    "render_error_page",
    "render_replays_page",
    "render_run_page",
    "render_run_head",
    "render_runs_page",
    "render_state_panel",
    "compare_section",
    "run_href",
]

#: How often a live page re-reads itself (ms).
LIVE_POLL_MS = 2000
VERDICTS = ("match", "diverged", "diverged_at_refusal", "what-if")
#: Query-string filters of the runs page, in the ``runs`` named query's names.
RUNS_FILTERS = ("since", "until", "status", "run_class", "model", "flagged", "verdict")
_PAYLOAD_CHARS = 4000
#: Keys per part of the state panel: a long run's handoffs and channels are thousands, and the panel is part of
#: the first page (what the index changed is always shown, then the latest keys).
STATE_KEYS_SHOWN = 100
_FIELDS_PER_EVENT = 60

_CSS = REPORT_CSS + """
body{margin:0} main{padding:18px 32px 40px}
nav{background:#1b2a4a;color:#fff;padding:10px 32px;display:flex;gap:22px;align-items:center}
nav a{color:#dbe4ff;text-decoration:none;font-weight:600} nav a:hover{color:#fff} nav .brand{color:#fff;font-size:16px}
nav .live{margin-left:auto;font-size:12px;color:#91a7ff}
a{color:#364fc7}
form.filters{display:flex;gap:10px;flex-wrap:wrap;align-items:end;margin:10px 0 14px;font-size:12px}
form.filters label{display:flex;flex-direction:column;gap:2px;color:#495057}
form.filters input,form.filters select{font:inherit;padding:3px 6px}
table.list{width:100%} table.list td{vertical-align:top}
tr.current td{background:#fff3bf} tr.divergence td{background:#ffe3e3} tr.diverged td{background:#fff5f5}
tr[data-index]{cursor:pointer}
.badge{display:inline-block;padding:0 6px;border-radius:9px;font-size:11px;background:#e9ecef;color:#343a40;
margin:0 2px 1px 0}
.badge.bad,.badge.failed,.badge.diverged,.badge.refused,.badge.violations,.badge.gap{background:#ffe3e3;color:#c92a2a}
.badge.diverged_at_refusal{background:#c92a2a;color:#fff}
.badge.match,.badge.completed,.badge.ok{background:#d3f9d8;color:#2b8a3e}
.badge.running{background:#d0ebff;color:#1864ab} .badge.what-if{background:#fff3bf;color:#e67700}
.badge.retried,.badge.handoff_failed{background:#fff4e6;color:#d9480f}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font-size:11px}
details summary{cursor:pointer;color:#495057}
.slider{display:flex;gap:12px;align-items:center;margin:8px 0} .slider input{flex:1}
.state{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:10px}
.state section{border:1px solid #dee2e6;border-radius:8px;padding:6px 10px}
.state h3{font-size:13px;margin:2px 0 6px}
.kv{display:flex;gap:6px;padding:1px 3px;border-radius:3px;font-size:12px} .kv b{min-width:90px}
.changed{background:#fff3bf;outline:1px solid #fab005}
.field{font:11px/1.35 ui-monospace,Menlo,Consolas,monospace} .field.volatile{color:#adb5bd}
.field.diff{background:#ffc9c9;font-weight:700}
.divergence-box{border:2px solid #c92a2a;border-radius:8px;padding:10px 14px;margin:10px 0;background:#fff5f5}
.divergence-box.none{border-color:#2b8a3e;background:#ebfbee}
.pager{margin:10px 0;display:flex;gap:12px;align-items:center;flex-wrap:wrap} .pager form{display:inline}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:18px}
figure.chart{margin:0;border:1px solid #e9ecef;border-radius:8px;padding:8px 10px}
figure.chart figcaption{font-weight:600;margin-bottom:4px}
.bar-label{font-size:11px;fill:#343a40;text-anchor:end} .bar-value{font-size:11px;fill:#495057}
.tick-y{font-size:10px;fill:#868e96;text-anchor:end}
form.picker input[list]{min-width:320px} table.picker-runs td.pick{text-align:center;width:28px}
"""

_SCRIPT = """
(function () {
  var slider = document.getElementById('slider');
  function mark(i) {
    document.querySelectorAll('tr.current').forEach(function (e) { e.classList.remove('current'); });
    var row = document.getElementById('ev-' + i);
    if (row) row.classList.add('current');
    var around = document.getElementById('at-events');
    if (around && slider) {
      var href = slider.dataset.page;
      around.href = href + (href.indexOf('?') < 0 ? '?' : '&') + 'at=' + i;
      around.hidden = !!row;
    }
  }
  function loadState(i) {
    var label = document.getElementById('at-label');
    if (label) label.textContent = i;
    return fetch(slider.dataset.src + '?at=' + i, {credentials: 'same-origin'}).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null) return;
      document.getElementById('state').innerHTML = html;
      document.body.dataset.stateAt = i;
      mark(i);
    });
  }
  if (slider) {
    var timer = null;
    slider.addEventListener('input', function () {
      clearTimeout(timer);
      timer = setTimeout(function () { loadState(slider.value); }, 60);
    });
    document.addEventListener('click', function (ev) {
      var row = ev.target.closest && ev.target.closest('tr[data-index]');
      if (!row || ev.target.closest('details')) return;
      slider.value = row.dataset.index;
      loadState(row.dataset.index);
    });
    mark(slider.value);
  }
  document.querySelectorAll('input[data-runs]').forEach(function (input) {
    var list = document.getElementById(input.getAttribute('list'));
    var timer = null;
    input.addEventListener('input', function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        var body = {query: 'runs', params: {search: input.value.trim(), limit: input.dataset.runs}};
        fetch('/query', {method: 'POST', credentials: 'same-origin', body: JSON.stringify(body),
                         headers: {'Content-Type': 'application/json'}}).then(function (r) {
          return r.ok ? r.json() : null;
        }).then(function (found) {
          if (found === null) return;
          var at = found.columns.indexOf('run_id');
          list.replaceChildren.apply(list, found.rows.map(function (row) {
            var option = document.createElement('option');
            option.value = row[at];
            return option;
          }));
          input.dataset.searched = input.value;
        });
      }, 150);
    });
  });
  document.querySelectorAll('input[type=radio][data-fills]').forEach(function (radio) {
    radio.addEventListener('change', function () {
      document.getElementById(radio.dataset.fills).value = radio.value;
    });
  });
  var every = +document.body.dataset.live;
  if (!every) return;
  var headSrc = document.body.dataset.head, headNow = document.body.dataset.headValue;
  function changed() {  // a page with a head fragment is read again only when its head moved
    if (!headSrc) return Promise.resolve(true);
    return fetch(headSrc, {credentials: 'same-origin'}).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (head) {
      if (head === null || head === headNow) return false;
      headNow = head;
      return true;
    });
  }
  setInterval(function () {
    if (document.hidden) return;
    changed().then(function (moved) {
      return moved ? fetch(location.href, {credentials: 'same-origin'}) : null;
    }).then(function (r) {
      return r && r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null) return;
      var fresh = new DOMParser().parseFromString(html, 'text/html');
      document.querySelectorAll('[data-live]').forEach(function (el) {
        var next = fresh.getElementById(el.id);
        if (next && next.innerHTML !== el.innerHTML) el.innerHTML = next.innerHTML;
      });
      var nextSlider = fresh.getElementById('slider');
      if (slider && nextSlider && nextSlider.max !== slider.max) {
        var atEnd = slider.value === slider.max;
        slider.max = nextSlider.max;
        if (atEnd) { slider.value = nextSlider.max; loadState(nextSlider.max); } else { mark(slider.value); }
      }
      document.body.dataset.refreshed = String(Date.now());
    });
  }, every);
})();
"""


def run_href(run_id: str) -> str:
    return f"/runs/{quote(str(run_id), safe='')}"


def _layout(title: str, body: str, *, live: bool = False, head: tuple[str, str] | None = None) -> str:
    """``head`` is ``(url, value)`` of a live page's head fragment: the page is read again only when it changes."""
    live_attr = f' data-live="{LIVE_POLL_MS}"' if live else ""
    if head is not None:
        live_attr += f' data-head="{esc(head[0])}" data-head-value="{esc(head[1])}"'

    live_note = f'<span class="live">live · refreshes every {LIVE_POLL_MS // 1000}s</span>' if live else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{esc(title)} · agentlog</title>
<style>{_CSS}</style></head>
<body{live_attr}>
<nav><a class="brand" href="/">agentlog</a><a href="/">Runs</a><a href="/compare">Compare</a>
<a href="/analytics">Analytics</a>{live_note}</nav>
<main>
{body}
</main>
<script>{_SCRIPT}</script>
</body></html>
"""


def _badge(text: Any, kind: Any = None) -> str:
    if text in (None, ""):
        return ""
    return f'<span class="badge {esc(kind if kind is not None else text)}">{esc(text)}</span>'


def _json(value: Any, limit: int = _PAYLOAD_CHARS) -> str:
    text = json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _time(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("T", " ")[:23]


def _duration(ms: Any) -> str:
    if ms is None:
        return ""
    ms = int(ms)
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def render_error_page(title: str, message: str, *, code: str = "") -> str:
    """A page that says what went wrong and what to do (a missing run, a store that is not there)."""
    detail = f"<p><code>error[{esc(code)}]</code></p>" if code else ""
    return _layout(title, f"<h1>{esc(title)}</h1><p>{esc(message)}</p>{detail}")


# ---------------------------------------------------------------------------------------------
# /


def render_runs_page(rows: Sequence[Mapping[str, Any]], filters: Mapping[str, str], *, limit: int,
                     offset: int) -> str:
    """The runs list: ``rows`` are the ``runs`` named query's rows (its columns only)."""
    def selected(name: str, value: str) -> str:
        return " selected" if filters.get(name, "") == value else ""

    status_opts = "".join(f'<option value="{s}"{selected("status", s)}>{s}</option>' for s in ("", *STATUSES))
    verdict_opts = "".join(f'<option value="{v}"{selected("verdict", v)}>{v}</option>' for v in ("", *VERDICTS))
    flagged = " checked" if filters.get("flagged") == "1" else ""
    form = f"""<form class="filters" method="get" action="/">
<label>status<select name="status">{status_opts}</select></label>
<label>since<input name="since" placeholder="2026-11-22T00:00:00Z" value="{esc(filters.get('since', ''))}"></label>
<label>until<input name="until" placeholder="ISO 8601" value="{esc(filters.get('until', ''))}"></label>
<label>class<input name="run_class" size="8" placeholder="prod" value="{esc(filters.get('run_class', ''))}"></label>
<label>model<input name="model" placeholder="claude-sonnet-4" value="{esc(filters.get('model', ''))}"></label>
<label>last replay verdict<select name="verdict">{verdict_opts}</select></label>
<label><span><input type="checkbox" name="flagged" value="1"{flagged}> flagged only</span></label>
<label>per page<input name="limit" size="4" value="{limit}"></label>
<button type="submit">Filter</button> <a href="/">clear</a></form>"""
    body_rows = []
    for r in rows:
        verdict = r.get("last_verdict") or ""
        replays = (f'{_badge(verdict)} <a href="{run_href(r["run_id"])}/replays">{r.get("replays")} replay(s)</a>'
                   if r.get("replays") else "")
        body_rows.append(
            f'<tr class="run" data-run-id="{esc(r["run_id"])}"><td><a href="{run_href(r["run_id"])}">'
            f'{esc(r["run_id"])}</a></td><td>{_badge(r.get("status"))}</td><td>{esc(r.get("run_class") or "")}</td>'
            f'<td>{esc(_time(r.get("started_at")))}</td>'
            f'<td>{esc(_duration(r.get("duration_ms")))}</td><td>{esc(r.get("events"))}</td>'
            f'<td>{esc(r.get("cost_cents"))}¢</td><td>{esc(r.get("input_tokens"))} / {esc(r.get("output_tokens"))}</td>'
            f'<td>{esc(r.get("refusals"))}</td><td>{esc(r.get("violations"))}</td>'
            f'<td>{"".join(_badge(f) for f in r.get("flags") or [])}</td><td>{replays}</td></tr>')
    table = ("<table class=\"list\"><thead><tr><th>run</th><th>status</th><th>class</th><th>started (UTC)</th>"
             "<th>duration</th>"
             "<th>events</th><th>cost</th><th>tokens in / out</th><th>refusals</th><th>violations</th><th>flags</th>"
             f"<th>replays</th></tr></thead><tbody id=\"runs-body\" data-live>{''.join(body_rows)}</tbody></table>")
    if not rows:
        table += '<p class="empty">No runs match. Publish events (agentlog demo) or clear the filters.</p>'
    kept = {k: v for k, v in filters.items() if v}
    pager = []
    if offset > 0:
        pager.append(f'<a href="/?{esc(urlencode({**kept, "limit": limit, "offset": max(offset - limit, 0)}))}">'
                     "← newer</a>")
    if len(rows) >= limit:
        pager.append(f'<a href="/?{esc(urlencode({**kept, "limit": limit, "offset": offset + limit}))}">older →</a>')
    shown = f"runs {offset + 1}–{offset + len(rows)}" if rows else "no runs"
    body = (f'<h1>Runs</h1><div class="meta" id="runs-count" data-live>{shown}, newest first</div>{form}{table}'
            f'<div class="pager">{"".join(pager)}</div>')
    return _layout("Runs", body, live=True)


# ---------------------------------------------------------------------------------------------
# /runs/<runId>


def render_run_head(events: int, head_hash: str, transitions: int, violations: int, verdicts: int) -> str:
    """What a live run page polls: the run's event count and head hash and the counts of its transitions,
    violations and replay verdicts (the page's other parts follow from these)."""
    return f"{events} {head_hash} {transitions} {violations} {verdicts}"


def render_state_panel(view: StateView) -> str:
    """The state after one index, with what that index changed highlighted (the slider's fragment)."""
    def kv(part: str, key: str, value: Any) -> str:
        cls = " changed" if f"{part}.{key}" in view.changed else ""
        return (f'<div class="kv{cls}" data-key="{esc(part)}.{esc(key)}"><b>{esc(key)}</b>'
                f'<pre>{esc(_json(value, 1200))}</pre></div>')

    status_cls = " changed" if "status" in view.changed else ""
    sections = [f'<section><h3>status</h3><div class="kv{status_cls}" data-key="status">'
                f'{_badge(view.status)}</div></section>']
    for part, values in view.parts.items():
        keys = list(values)
        if len(keys) > STATE_KEYS_SHOWN:  # what this index changed, then the latest of the rest
            first = [k for k in keys if f"{part}.{k}" in view.changed]
            rest = [k for k in keys if f"{part}.{k}" not in view.changed]
            keys = first + rest[len(rest) - max(STATE_KEYS_SHOWN - len(first), 0):]
        items = "".join(kv(part, k, values[k]) for k in keys) or '<p class="empty">none</p>'
        if len(keys) < len(values):
            items += (f'<p class="empty more">{len(values) - len(keys)} earlier {esc(part)} not shown '
                      "(what this index changed and the latest are)</p>")
        sections.append(f'<section><h3>{esc(part)} ({len(values)})</h3>{items}</section>')
    changed = ", ".join(sorted(view.changed)) or "nothing observable"
    return (f'<div class="meta" id="state-caption" data-index="{view.index}">after index <b>{view.index}</b> '
            f'(sequence {esc(view.sequence)}, <code>{esc(view.event_type)}</code>) · changed: {esc(changed)}</div>'
            f'<div class="state">{"".join(sections)}</div>')


def _events_table(docs: Sequence[Mapping[str, Any]], violated: Mapping[str, list[str]], *, first: int = 0,
                  seq_of: Mapping[Any, Any] | None = None) -> str:
    """``docs`` are the events at indexes ``first``, ``first + 1``, …; ``seq_of`` maps every eventId of the run to
    its sequence (default: those of ``docs``), so a cause on another page is still named by its sequence."""
    if seq_of is None:
        seq_of = {d.get("eventId"): d.get("sequence") for d in docs}
    rows = []
    for i, d in enumerate(docs, start=first):
        cause = d.get("causationId")
        caused = "" if not cause else f"#{seq_of[cause]}" if cause in seq_of else esc(str(cause)[:16])
        codes = violated.get(str(d.get("eventId")), [])
        flag = "".join(_badge(c, "bad") for c in codes)
        if d.get("type") == "envelope.refusal":
            flag += _badge("refusal", "bad")
        rows.append(
            f'<tr id="ev-{i}" data-index="{i}" data-type="{esc(d.get("type"))}"><td>{esc(d.get("sequence"))}</td>'
            f'<td>{esc(_time(d.get("timestamp")))}</td><td><code>{esc(d.get("type"))}</code> {flag}</td>'
            f'<td>{esc(d.get("nodeId"))}</td><td>{caused}</td>'
            f'<td><details><summary>payload</summary><pre>{esc(_json(d.get("payload")))}</pre></details></td></tr>')
    return ("<table class=\"list events\"><thead><tr><th>seq</th><th>time (UTC)</th><th>type</th><th>node</th>"
            f"<th>caused by</th><th>payload</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _verdicts_table(source_run_id: str, verdicts: Sequence[Mapping[str, Any]]) -> str:
    if not verdicts:
        return '<p class="empty">No replay of this run has been judged.</p>'
    rows = []
    for v in verdicts:
        first = v.get("first_divergence") or ""
        try:
            fd = json.loads(first) if first else None
        except ValueError:
            fd = None
        where = (f'#{esc(fd.get("atSequence"))} {esc(fd.get("kind"))} <code>{esc(fd.get("path") or "")}</code>'
                 if isinstance(fd, dict) else "")
        replay = str(v.get("replay_run_id"))
        compare = f'/compare?{esc(urlencode({"a": source_run_id, "b": replay}))}'
        rows.append(f'<tr class="verdict" data-verdict="{esc(v.get("verdict"))}"><td>'
                    f'<a href="{run_href(replay)}">{esc(replay)}</a></td><td>{esc(v.get("mode"))}</td>'
                    f'<td>{_badge(v.get("verdict"))}</td><td>{esc(v.get("error_code"))}</td><td>{where}</td>'
                    f'<td>{esc(v.get("compared_through"))}</td><td>{esc(_time(v.get("recorded_at")))}</td>'
                    f'<td><a href="{compare}">compare side by side</a></td></tr>')
    return ("<table class=\"list verdicts\"><thead><tr><th>replay run</th><th>mode</th><th>verdict</th><th>error</th>"
            "<th>first divergence</th><th>compared through</th><th>recorded (UTC)</th><th></th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _run_links(run_id: str, links: Mapping[str, Sequence[str]]) -> str:
    parts = []
    for label, key in (("parent", "parents"), ("children", "children"), ("replay of", "replay_of"),
                       ("replays", "replays")):
        ids = links.get(key) or []
        if ids:
            parts.append(f'{label}: ' + ", ".join(f'<a href="{run_href(r)}">{esc(r)}</a>' for r in ids))
    compare = f'<a href="/compare?{esc(urlencode({"a": run_id}))}">compare with another run</a>'
    return " · ".join(parts or ["no parent, child or replay runs"]) + f" · {compare}"


@dataclass(frozen=True, kw_only=True)
class EventsPage:
    """Which of a run's events a run page shows: indexes ``first`` … ``first + shown - 1`` of ``count``.

    ``starts`` maps ``first``, ``previous``, ``next`` and ``last`` to the sequence its page starts at (the
    ``?from=`` of its link; absent where there is no such page); ``limit`` is the page size (``?limit=``).
    """

    first: int
    shown: int
    count: int
    limit: int
    starts: Mapping[str, int]
    default_limit: int


def _page_href(run_id: str, page: EventsPage, **params: Any) -> str:
    if page.limit != page.default_limit:
        params["limit"] = page.limit
    return run_href(run_id) + (f"?{urlencode(params)}" if params else "")


def _pager(run_id: str, page: EventsPage) -> str:
    if page.count == 0:
        return ""
    labels = (("first", "« first"), ("previous", "← earlier"), ("next", "later →"), ("last", "last »"))
    links = "".join(f'<a class="page-{name}" href="{esc(_page_href(run_id, page, **{"from": page.starts[name]}))}">'
                    f"{label}</a>" for name, label in labels if name in page.starts)
    hidden = (f'<input type="hidden" name="limit" value="{page.limit}">' if page.limit != page.default_limit
              else "")
    return (f'<div class="pager" id="events-pager" data-first="{page.first}" data-shown="{page.shown}" '
            f'data-count="{page.count}">events <b>{page.first}–{page.first + page.shown - 1}</b> of {page.count} '
            f'(by index) {links}<form method="get" action="{run_href(run_id)}">{hidden}'
            '<label>from sequence <input name="from" size="7" inputmode="numeric"></label> '
            '<button type="submit">go</button></form></div>')


def render_run_page(
    run_id: str,
    events: Sequence[Mapping[str, Any]],
    transitions: Sequence[Mapping[str, Any]],
    violations: Sequence[Mapping[str, Any]],
    *,
    status: str,
    state: StateView,
    head_hash: str,
    chain_problem: str | None,
    links: Mapping[str, Sequence[str]],
    verdicts: Sequence[Mapping[str, Any]],
    page: EventsPage | None = None,
    refusals: int | None = None,
    seq_of: Mapping[Any, Any] | None = None,
    agents: AgentGraph | None = None,
    head_value: str | None = None,
) -> str:
    """One run: header (status, head hash, chain check, links), state slider, lanes, graph, events, verdicts.

    ``chain_problem`` is None when the hash chain recomputed from the stored events ends at
    ``head_hash``, else a sentence saying where it breaks. With ``page``, ``events`` are that page's
    events and ``transitions`` the whole run's: the lanes and the causation graph draw the page's
    part, the slider and the figures cover the run (``refusals`` in all of it, ``seq_of`` every
    eventId's sequence). ``agents`` is the run tree's agent graph (each agent's box opens its child run).
    ``head_value`` is what ``/runs/<runId>/head`` answers now (:func:`render_run_head`): the live page polls
    that and reads itself again only when it changes.
    """
    docs = normalise_events(events, transitions)
    if page is None:
        page = EventsPage(first=0, shown=len(docs), count=len(docs), limit=max(len(docs), 1), starts={},
                          default_limit=max(len(docs), 1))
    violated = violated_by_event(violations)
    ordered = sort_transitions(transitions)
    drawn = ordered
    if page.shown < page.count and docs:
        low, high = docs[0].get("sequence") or 0, docs[-1].get("sequence") or 0
        drawn = [t for t in ordered if isinstance(t.get("sequence"), int) and low <= t["sequence"] <= high]
    chain = (_badge("chain verifies", "ok") if chain_problem is None
             else f'{_badge("chain broken", "bad")} {esc(chain_problem)}')
    if refusals is None:
        refusals = sum(d.get("type") == "envelope.refusal" for d in docs)
    stats = "".join(
        f'<div class="stat{" bad" if bad else ""}"><b>{n}</b><span>{esc(label)}</span></div>'
        for label, n, bad in (
            ("events", page.count, False), ("transitions", len(ordered), False),
            ("refusals", refusals, False),
            ("violations", len(violations), bool(violations)), ("replays", len(verdicts), False)))
    last = max(page.count - 1, 0)
    part = (f'<p class="meta" id="page-note">the events {page.first}–{page.first + page.shown - 1} of this page: '
            f'{len(drawn)} of {len(ordered)} transitions</p>' if page.shown < page.count else "")
    hidden = (f'<input type="hidden" name="limit" value="{page.limit}">' if page.limit != page.default_limit
              else "")
    on_page = " hidden" if page.first <= state.index < page.first + page.shown else ""
    body = f"""<h1>Run <code>{esc(run_id)}</code> <span id="run-status">{_badge(status)}</span></h1>
<div class="meta" id="run-meta" data-live>head hash <code id="head-hash">{esc(head_hash)}</code> · {chain}<br>
{_run_links(run_id, links)}</div>
<div class="stats" id="run-stats" data-live>{stats}</div>
<h2>State at an index</h2>
<form class="slider" method="get" action="{run_href(run_id)}">
<label for="slider">index <b id="at-label">{state.index}</b> of {last}</label>{hidden}
<input type="range" id="slider" name="at" min="0" max="{last}" value="{state.index}"
 data-src="{run_href(run_id)}/state" data-page="{esc(_page_href(run_id, page))}">
<a id="at-events" href="{esc(_page_href(run_id, page, at=state.index))}"{on_page}>show the events around this \
index</a>
<noscript><button type="submit">show</button></noscript></form>
<div id="state">{render_state_panel(state)}</div>
<h2>Agents</h2>
<div class="scroll" id="run-agents" data-live>{agent_graph_svg(agents, run_href) if agents else ""}
{agents_table(agents, run_href) if agents else ""}</div>
<h2>Replay verdicts</h2>
<div id="run-verdicts" data-live>{_verdicts_table(run_id, verdicts)}</div>
<h2>Handoff lanes</h2>
<div id="run-part" data-live>{part}</div>
<div class="scroll" id="run-lanes" data-live>{timeline_svg(drawn)}</div>
<h2>Causation graph</h2>
{legend_html()}
<div class="scroll" id="run-graph" data-live>{graph_svg(docs, violated) if docs else ''}</div>
<h2>Events</h2>
<div id="run-pager" data-live>{_pager(run_id, page) if page.shown < page.count else ""}</div>
<div id="run-events" data-live>{_events_table(docs, violated, first=page.first, seq_of=seq_of)}</div>
<h2>Violations</h2>
<div id="run-violations" data-live>{violations_table(violations)}</div>"""
    head = (f"{run_href(run_id)}/head", head_value) if head_value is not None else None
    return _layout(f"run {run_id}", body, live=True, head=head)


# ---------------------------------------------------------------------------------------------
# /compare and /runs/<runId>/replays


def _fields(doc: Mapping[str, Any] | None, diff_path: str | None) -> str:
    if doc is None:
        return '<span class="empty">(no event at this index)</span>'
    kind = str(doc.get("type"))
    lines = [f"<b><code>{esc(kind)}</code></b>"]
    for n, (path, value) in enumerate(iter_paths(doc)):
        if path in ("type", "sequence"):
            continue
        if n >= _FIELDS_PER_EVENT:
            lines.append('<div class="field">…</div>')
            break
        classes = ["field"]
        if is_volatile(kind, path):
            classes.append("volatile")
        if diff_path and (path == diff_path or path.startswith(diff_path + ".") or path.startswith(diff_path + "[")):
            classes.append("diff")
        shown = json.dumps(value, ensure_ascii=False, default=str)
        lines.append(f'<div class="{" ".join(classes)}" data-path="{esc(path)}">{esc(path)} = '
                     f'{esc(shown if len(shown) < 200 else shown[:199] + "…")}</div>')
    return "".join(lines)


def _divergence_box(result: ComparisonResult) -> str:
    d = result.first_divergence
    if d is None:
        return (f'<div class="divergence-box none" id="first-divergence-box" data-verdict="{esc(result.verdict)}">'
                f'{_badge(result.verdict)} the replay '
                f'reproduces the original through index {result.compared_through}.</div>')
    refusal = ("<p><b>Refusal divergence</b>: one side has a valid LLM envelope where the other was refused "
               "(RFC 0041 §B); judged as its own verdict, never folded into <code>diverged</code>.</p>"
               if d.kind == "refusal" else "")
    return (f'<div class="divergence-box" id="first-divergence-box" data-kind="{esc(d.kind)}" '
            f'data-at="{d.at_sequence}" data-verdict="{esc(result.verdict)}">{_badge(result.verdict)} '
            f'<code>{esc(result.error_code)}</code>'
            f'<p>First divergence at index <b id="divergence-at">{d.at_sequence}</b>: kind <b>{esc(d.kind)}</b>'
            f'{f" at <code>{esc(d.path)}</code>" if d.path else ""}{f" ({esc(d.event_type)})" if d.event_type else ""}'
            f'</p>{refusal}<table><tr><th></th><th>original (expected)</th><th>replay (actual)</th></tr>'
            f'<tr><td>value</td><td><pre>{esc(_json(d.expected, 1500))}</pre></td>'
            f'<td><pre>{esc(_json(d.actual, 1500))}</pre></td></tr></table>'
            f'{f"<p>{esc(d.detail)}</p>" if d.detail else ""}'
            f'<p><a href="#idx-{d.at_sequence}">jump to index {d.at_sequence} in the aligned events</a></p></div>')


def _divergences(result: ComparisonResult, href: Any = None) -> str:
    """Every divergence, as ``agentlog compare --all`` lists them (when there is more than the first), each index
    linking to the page of aligned events that starts at it (``href(index)``)."""
    if len(result.divergences) < 2:
        return ""

    def at(i: int) -> str:
        return f'<a href="{esc(href(i))}#idx-{i}">{i}</a>' if href is not None else str(i)

    rows = "".join(
        f'<tr class="divergence-row" data-at="{d.at_sequence}" data-kind="{esc(d.kind)}"><td>{at(d.at_sequence)}</td>'
        f'<td>{_badge(d.kind, "bad")}</td><td><code>{esc(d.event_type or "-")}</code></td>'
        f'<td><code>{esc(d.path or "-")}</code></td><td><pre>{esc(_json(d.expected, 300))}</pre></td>'
        f'<td><pre>{esc(_json(d.actual, 300))}</pre></td></tr>' for d in result.divergences)
    return (f'<details id="divergences"><summary>all {len(result.divergences)} divergences '
            '(<code>agentlog compare --all</code>)</summary><table class="list"><thead><tr><th>index</th><th>kind</th>'
            f'<th>event</th><th>path</th><th>expected</th><th>actual</th></tr></thead><tbody>{rows}</tbody></table>'
            '</details>')


#: Indexes per page of the aligned events (``?limit=`` on the compare page): each row lays out up to
#: ``_FIELDS_PER_EVENT`` fields of two events, about 0.1 ms a field.
ALIGNED_PER_PAGE = 200


def _aligned(original: Sequence[Mapping[str, Any]], replay: Sequence[Mapping[str, Any]],
             result: ComparisonResult, *, start: int | None = None, limit: int = ALIGNED_PER_PAGE,
             href: Any = None) -> str:
    """One page of the two runs aligned index by index: ``limit`` indexes from the index ``start`` (default: the
    page holding the first divergence, else the first page). ``href(start)`` is a page's URL; without it (the
    replays page) the pager has no links and the page is the default one."""
    a = {d.get("sequence"): d for d in original}
    b = {d.get("sequence"): d for d in replay}
    first = result.first_divergence
    at_of: dict[Any, Any] = {d.at_sequence: d for d in result.divergences}
    indexes = sorted({*a, *b}, key=lambda s: (s is None, s or 0))
    numbered = [i if isinstance(i, int) else -1 for i in indexes]
    if start is None:
        at = bisect_left(numbered, first.at_sequence) if first is not None else 0
        begin = at - at % limit
    else:
        begin = min(bisect_left(numbered, start), max(len(indexes) - 1, 0))
    rows = []
    for i in indexes[begin: begin + limit]:
        here = at_of.get(i)
        cls = "divergence" if first is not None and i == first.at_sequence else "diverged" if here else ""
        path = here.path if here is not None else None
        mark = f'<br>{_badge(here.kind, "bad")}' if here is not None else ""
        rows.append(f'<tr id="idx-{esc(i)}" class="{cls}" data-seq="{esc(i)}"><td>{esc(i)}{mark}</td>'
                    f'<td>{_fields(a.get(i), path)}</td><td>{_fields(b.get(i), path)}</td></tr>')
    pager = ""
    if len(indexes) > limit:
        shown = f"indexes {esc(indexes[begin])}–{esc(indexes[min(begin + limit, len(indexes)) - 1])} of {len(indexes)}"
        links = []
        if href is not None:
            last = (len(indexes) - 1) // limit * limit
            for label, pos in (("« first", 0), ("← earlier", begin - limit), ("later →", begin + limit),
                               ("last »", last)):
                if 0 <= pos < len(indexes) and pos != begin:
                    links.append(f'<a href="{esc(href(numbered[pos]))}">{label}</a>')
        pager = f'<div class="pager" id="aligned-pager">{shown} {"".join(links)}</div>'
    return (f"{pager}<table class=\"list aligned\"><thead><tr><th>index</th><th>original</th><th>replay</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table>{pager}")


#: How many runs the picker offers at a time (recent runs listed; runs found as the user types).
PICKER_RUNS = 20


def _picker(runs: Sequence[Mapping[str, Any]], a_id: str, b_id: str) -> str:
    """Two run ids to compare: typed (offered as you type) or picked from the recent ``runs`` rows."""
    def field(name: str, label: str, value: str) -> str:
        options = "".join(f'<option value="{esc(r["run_id"])}"></option>' for r in runs)
        return (f'<label>{label}<input id="pick-{name}" name="{name}" list="runs-{name}" value="{esc(value)}" '
                f'placeholder="a run id: type to search" autocomplete="off" data-runs="{PICKER_RUNS}"></label>'
                f'<datalist id="runs-{name}">{options}</datalist>')

    rows = []
    for r in runs:
        run = esc(r["run_id"])
        radios = "".join(
            f'<td class="pick"><input type="radio" name="recent-{side}" value="{run}" data-fills="pick-{side}" '
            f'aria-label="{side.upper()}: {run}"{" checked" if r["run_id"] == chosen else ""}></td>'
            for side, chosen in (("a", a_id), ("b", b_id)))
        rows.append(f'<tr class="pick-run" data-run-id="{run}">{radios}<td><a href="{run_href(r["run_id"])}">{run}'
                    f'</a></td><td>{_badge(r.get("status"))}</td><td>{esc(_time(r.get("started_at")))}</td>'
                    f'<td>{esc(r.get("events"))}</td><td>{_badge(r.get("last_verdict") or "")}</td></tr>')
    recent = ('<details open><summary>recent runs: pick A and B</summary><table class="list picker-runs">'
              "<thead><tr><th>A</th><th>B</th><th>run</th><th>status</th><th>started (UTC)</th><th>events</th>"
              f"<th>last replay verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table></details>"
              if rows else '<p class="empty">No runs in the store yet.</p>')
    return (f'<form class="filters picker" id="compare-picker" method="get" action="/compare">'
            f'{field("a", "A: the original run", a_id)}{field("b", "B: the run compared with it", b_id)}'
            f'<button type="submit">Compare</button></form>{recent}')


def render_compare_picker_page(runs: Sequence[Mapping[str, Any]], a_id: str = "", b_id: str = "",
                               problem: str = "") -> str:
    """The compare page before two runs are chosen (or when one is not in the store: ``problem`` says so)."""
    said = f'<p class="divergence-box" id="compare-problem">{esc(problem)}</p>' if problem else ""
    body = (f"<h1>Compare two runs</h1>{said}<div class=\"meta\">any two runs: a replay and its source, or two "
            "runs of the same program; judged as <code>agentlog compare A B</code> judges them</div>"
            f"{_picker(runs, a_id, b_id)}")
    return _layout("compare", body)


def render_compare_page(a_id: str, b_id: str, original: Sequence[Mapping[str, Any]],
                        replay: Sequence[Mapping[str, Any]], result: ComparisonResult,
                        verdicts: Sequence[Mapping[str, Any]] = (), runs: Sequence[Mapping[str, Any]] = (), *,
                        start: int | None = None, limit: int = ALIGNED_PER_PAGE) -> str:
    """Two runs aligned index by index (``result`` is ``compare_runs(original, replay)``), volatile fields dimmed,
    under the run picker (``runs``: the recent ``runs`` rows it offers); one page of indexes (``start``, ``limit``:
    :func:`_aligned`), every divergence listed with a link to its page."""
    def href(at: int) -> str:
        params: dict[str, Any] = {"a": a_id, "b": b_id, "from": at}
        if limit != ALIGNED_PER_PAGE:
            params["limit"] = limit
        return f"/compare?{urlencode(params)}"

    reordered = (f'<p class="meta">{len(result.reordered)} event(s) interleaved differently across lanes '
                 "(not a divergence).</p>" if result.reordered else "")
    body = (f'<h1>Compare <a href="{run_href(a_id)}"><code>{esc(a_id)}</code></a> with '
            f'<a href="{run_href(b_id)}"><code>{esc(b_id)}</code></a></h1>'
            f'<details><summary>compare other runs</summary>{_picker(runs, a_id, b_id)}</details>'
            f'<div class="meta">compared from index {result.from_seq} (replayOf.fromSeq); volatile fields '
            '(ids, timestamps, call bytes) are dimmed and never count as a divergence</div>'
            f'{_divergence_box(result)}{_divergences(result, href)}{reordered}'
            f'<h2>Recorded verdicts of {esc(a_id)}</h2>{_verdicts_table(a_id, verdicts)}'
            f'<h2>Aligned events</h2>{_aligned(original, replay, result, start=start, limit=limit, href=href)}')
    return _layout(f"compare {a_id} / {b_id}", body)


def render_replays_page(run_id: str, verdicts: Sequence[Mapping[str, Any]], compare_html: str = "") -> str:
    """A run's replay verdict records; ``compare_html`` is the latest replay's comparison, when there is one."""
    body = (f'<h1>Replays of <a href="{run_href(run_id)}"><code>{esc(run_id)}</code></a></h1>'
            f'<div id="replays-verdicts" data-live>{_verdicts_table(run_id, verdicts)}</div>{compare_html}')
    return _layout(f"replays of {run_id}", body, live=True)


def compare_section(a_id: str, b_id: str, original: Sequence[Mapping[str, Any]],
                    replay: Sequence[Mapping[str, Any]], result: ComparisonResult) -> str:
    """The comparison part of the compare page, for embedding in the replays page."""
    return (f'<h2>Latest replay: <a href="{run_href(b_id)}"><code>{esc(b_id)}</code></a></h2>'
            f'{_divergence_box(result)}{_aligned(original, replay, result)}')


# ---------------------------------------------------------------------------------------------
# /analytics


def render_analytics_page(*, usage: Sequence[Mapping[str, Any]], refusals: Sequence[Mapping[str, Any]],
                          latency: Sequence[Mapping[str, Any]], rejections: Sequence[Mapping[str, Any]],
                          bucket_s: int) -> str:
    """Charts over the named queries ``usage-over-time``, ``refusals``, ``handoff-latency`` and ``rejections``."""
    buckets = sorted({_time(u.get("bucket"))[:16] for u in usage})
    index = {b: i for i, b in enumerate(buckets)}
    cost: dict[str, list[float]] = {}
    tokens: dict[str, list[float]] = {}
    for u in usage:
        name = f'{u.get("provider") or "?"}/{u.get("model") or "?"}'
        i = index[_time(u.get("bucket"))[:16]]
        cost.setdefault(name, [0.0] * len(buckets))[i] += float(u.get("cost_cents") or 0)
        tokens.setdefault(name, [0.0] * len(buckets))[i] += float((u.get("input_tokens") or 0)
                                                                   + (u.get("output_tokens") or 0))
    refusal_bars = [(f'{r.get("provider")}/{r.get("model")} ({r.get("refused")}/{r.get("outcomes")})',
                     100.0 * float(r.get("refusal_rate") or 0)) for r in refusals]
    lat = [r for r in latency if r.get("p95_ms") is not None]
    latency_bars = [(f'{r.get("worker_id")} · {r.get("phase")}', float(r.get("p95_ms") or 0)) for r in lat]
    latency_inner = [float(r.get("p50_ms") or 0) for r in lat]
    rejection_bars = [(str(r.get("reason")), float(r.get("rejections") or 0)) for r in rejections]
    charts = "".join((
        line_chart(f"Cost per model (cents per {bucket_s // 60} min)", buckets, cost, unit="¢"),
        line_chart(f"Tokens per model (in + out per {bucket_s // 60} min)", buckets, tokens),
        bar_chart("Refusal rate per model", refusal_bars, unit="%"),
        bar_chart("Handoff latency per worker and phase (ms from the previous transition)", latency_bars,
                  unit=" ms", inner=latency_inner, inner_label="p50", outer_label="p95"),
        bar_chart("Rejected ingest records by reason", rejection_bars),
    ))
    body = (f'<h1>Analytics</h1><div class="meta">from the named queries usage-over-time, refusals, '
            f'handoff-latency and rejections</div><div class="charts" id="charts" data-live>{charts}</div>')
    return _layout("Analytics", body, live=True)
