"""A run as one self-contained HTML page: causation graph and per-worker handoff timeline.

An auditor opens the page from a ticket or a mail attachment, often offline, so
the page carries everything inline (CSS and SVG, no script, no fonts, no external
URL) and renders the same in any browser. The builder is pure — records in, a
string out — so it is tested without a broker or a store; ``agentlog report``
only fetches the records (:func:`fetch_report_records`) and writes the file. The web console's run
page (:mod:`agentlog.console.pages`) draws the same graph and lanes with the pieces exported here.

Layout choices:

* Causation graph: one row per event in sequence order (the log's own order, so
  the page reads top to bottom like the run happened), one column per ``nodeId``
  (the agent that emitted it). An edge goes from the cause to the effect; both
  always exist in the run, because the sequencer rejects dangling causation —
  a cause outside the given events (a cross-host cause) is drawn as a stub.
* Handoff timeline: one lane per workerId, each transition placed by its
  timestamp; a bar spans consecutive transitions of one dispatch, coloured by the
  state the machine was in.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from agentlog.audit.agents import AgentGraph, AgentNode

__all__ = [
    "FAMILY_COLOURS", "REPORT_CSS", "agent_graph_svg", "agents_table", "esc", "family_of", "graph_svg", "legend_html",
    "normalise_events", "render_report",
    "sort_transitions", "timeline_svg", "violated_by_event", "violations_table",
]

#: Type family → (fill, stroke). Families are what a reader scans for: lifecycle, state, handoff, LLM, tools.
FAMILY_COLOURS: dict[str, tuple[str, str]] = {
    "lifecycle": ("#e8eefc", "#3b5bdb"),
    "state": ("#e6f6ea", "#2b8a3e"),
    "handoff": ("#f3e8fd", "#7b2cbf"),
    "llm": ("#fff4e0", "#d9480f"),
    "tool": ("#e3f7f8", "#0b7285"),
    "usage": ("#f1f3f5", "#495057"),
    "replay": ("#fff0f6", "#a61e4d"),
    "other": ("#f8f9fa", "#868e96"),
}
_REFUSAL = ("#ffe3e3", "#c92a2a")
_VIOLATION_RING = "#f08c00"

_PHASE_STATE = {  # the state a machine is in after each phase (RFC 0037 §B)
    "dispatch.began": "dispatching",
    "dispatch.succeeded": "running",
    "dispatch.failed": "failed",
    "child.completed": "completed",
    "child.failed": "failed",
    "child.cancelled": "cancelled",
    "output.harvested": "harvested",
}
_STATE_COLOURS = {
    "pending": "#adb5bd",
    "dispatching": "#74c0fc",
    "running": "#4dabf7",
    "completed": "#69db7c",
    "harvested": "#2f9e44",
    "failed": "#fa5252",
    "cancelled": "#868e96",
}


def family_of(event_type: str) -> str:
    """The colour family of an event type (``envelope.refusal`` is ``llm``, highlighted on top)."""
    if event_type.startswith("run."):
        return "lifecycle"
    if event_type in ("variable.changed", "channel.written"):
        return "state"
    if event_type.startswith(("runOrchestrator.", "core.workflowChain.", "node.dispatched")):
        return "handoff"
    if event_type.startswith(("agent.invocation.", "envelope.")):
        return "llm"
    if event_type.startswith("agent.tool"):
        return "tool"
    if event_type.startswith("provider."):
        return "usage"
    if event_type.startswith("replay."):
        return "replay"
    return "other"


def esc(value: Any) -> str:
    """``value`` as HTML text or attribute (``None`` as empty): every value from a run passes through here."""
    return html.escape("" if value is None else str(value), quote=True)


def _parse_ts(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Causation graph

_ROW_H = 30
_LANE_W = 250
_BOX_W = 224
_BOX_H = 22
_TOP = 40
_LEFT = 56


def graph_svg(events: Sequence[Mapping[str, Any]], violated: dict[str, list[str]]) -> str:
    """The causation graph of ``events`` (sorted, from :func:`normalise_events`); ``violated`` rings events."""
    lanes: list[str] = []
    for e in events:
        lane = e.get("nodeId") or "(no node)"
        if lane not in lanes:
            lanes.append(lane)
    seq_of = {e["eventId"]: e.get("sequence") for e in events}
    pos: dict[str, tuple[int, int]] = {}
    for i, e in enumerate(events):
        lane = lanes.index(e.get("nodeId") or "(no node)")
        pos[e["eventId"]] = (_LEFT + lane * _LANE_W, _TOP + i * _ROW_H)
    width = _LEFT + len(lanes) * _LANE_W + 20
    height = _TOP + len(events) * _ROW_H + 20
    out = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="causation graph">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#868e96"/></marker></defs>']
    for lane_index, lane in enumerate(lanes):
        x = _LEFT + lane_index * _LANE_W
        out.append(f'<rect x="{x - 8}" y="{_TOP - 30}" width="{_LANE_W - 10}" height="{height - _TOP + 18}" '
                   f'rx="6" class="lane"/>')
        out.append(f'<text x="{x}" y="{_TOP - 14}" class="lane-label">{esc(_short(lane, 30))}</text>')
    for i, e in enumerate(events):
        out.append(f'<text x="{_LEFT - 10}" y="{_TOP + i * _ROW_H + 15}" class="seq">{esc(e.get("sequence"))}</text>')
    # Edges first, so boxes sit on top of them.
    for e in events:
        cause = e.get("causationId")
        if not cause:
            continue
        x2, y2 = pos[e["eventId"]]
        if cause in pos:
            x1, y1 = pos[cause]
            sx, sy = x1 + 12, y1 + _BOX_H
            ex, ey = x2 + 6, y2
            if x1 == x2:  # same lane: bow out to the left so the edge does not run through boxes
                d = (f"M{x1},{y1 + _BOX_H / 2} C{x1 - 36},{y1 + _BOX_H / 2} "
                     f"{x2 - 36},{y2 + _BOX_H / 2} {x2},{y2 + _BOX_H / 2}")
            else:
                mid = (sy + ey) / 2
                d = f"M{sx},{sy} C{sx},{mid} {ex},{mid} {ex},{ey}"
            out.append(f'<path class="edge" data-from="{esc(cause)}" data-to="{esc(e["eventId"])}" d="{d}" '
                       f'marker-end="url(#arrow)"><title>{esc(seq_of[cause])} → {esc(e.get("sequence"))}</title>'
                       '</path>')
        else:
            out.append(f'<path class="edge-stub" data-from="{esc(cause)}" data-to="{esc(e["eventId"])}" '
                       f'd="M{x2 - 24},{y2 + _BOX_H / 2} L{x2},{y2 + _BOX_H / 2}" marker-end="url(#arrow)">'
                       f'<title>caused by {esc(cause)} (not in this run)</title></path>')
    for e in events:
        x, y = pos[e["eventId"]]
        etype = str(e.get("type", "?"))
        refusal = etype == "envelope.refusal"
        fill, stroke = _REFUSAL if refusal else FAMILY_COLOURS[family_of(etype)]
        codes = violated.get(e["eventId"], [])
        classes = (["node", f"fam-{family_of(etype)}"] + (["refusal"] if refusal else [])
                   + (["violation"] if codes else []))
        tip = f"#{e.get('sequence')} {etype}\neventId {e['eventId']}"
        if e.get("causationId"):
            tip += f"\ncausationId {e['causationId']}"
        if e.get("timestamp"):
            tip += f"\n{e['timestamp']}"
        if codes:
            tip += "\nviolation: " + ", ".join(codes)
        out.append(f'<g class="{" ".join(classes)}" data-event-id="{esc(e["eventId"])}"><title>{esc(tip)}</title>')
        if codes:
            out.append(f'<rect x="{x - 4}" y="{y - 4}" width="{_BOX_W + 8}" height="{_BOX_H + 8}" rx="8" '
                       f'fill="none" stroke="{_VIOLATION_RING}" stroke-width="3" stroke-dasharray="5 3"/>')
        stroke_width = 2.5 if refusal else 1.2
        out.append(f'<rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="5" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="{stroke_width}"/>')
        label = ("⚠ " if refusal or codes else "") + etype
        if etype == "core.workflowChain.event" and e.get("phase"):
            label = f"{e['phase']} · {e.get('worker') or '?'}"
        out.append(f'<text x="{x + 8}" y="{y + 15}" class="node-label" fill="{stroke}">'
                   f'{esc(_short(label, 34))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Handoff timeline

_TL_LEFT = 150
_TL_WIDTH = 1050
_TL_LANE_H = 64


def timeline_svg(transitions: Sequence[Mapping[str, Any]]) -> str:
    """The handoff lanes of ``transitions`` (in :func:`sort_transitions` order), one lane per worker."""
    if not transitions:
        return '<p class="empty">No handoff transitions recorded for this run.</p>'
    workers: list[str | None] = []  # a transition without a workerId gets a lane of its own
    for t in transitions:
        if t.get("workerId") not in workers:
            workers.append(t.get("workerId"))
    times = [_parse_ts(t.get("timestamp")) for t in transitions]
    known = [x for x in times if x is not None]
    t0, t1 = (min(known), max(known)) if known else (0.0, 0.0)
    span = t1 - t0

    def x_of(i: int, rank: int) -> float:
        ts = times[i]
        if ts is None or span <= 0:  # no usable clock: place by the machine's order instead
            return _TL_LEFT + 40 + rank * 170
        return _TL_LEFT + 40 + (ts - t0) / span * (_TL_WIDTH - 120)

    height = 46 + len(workers) * _TL_LANE_H + 30
    width = _TL_LEFT + _TL_WIDTH + 20
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="handoff timeline">']
    # time axis
    axis_y = 30
    out.append(f'<line x1="{_TL_LEFT + 40}" y1="{axis_y}" x2="{_TL_LEFT + _TL_WIDTH - 80}" y2="{axis_y}" '
               'class="axis"/>')
    if span > 0:
        for k in range(5):
            ax = _TL_LEFT + 40 + k / 4 * (_TL_WIDTH - 120)
            out.append(f'<line x1="{ax}" y1="{axis_y - 4}" x2="{ax}" y2="{axis_y + 4}" class="axis"/>')
            out.append(f'<text x="{ax}" y="{axis_y - 8}" class="tick">+{span * k / 4 * 1000:.0f} ms</text>')
    else:
        out.append(f'<text x="{_TL_LEFT + 40}" y="{axis_y - 8}" class="tick">(no time spread: ordered by phase)</text>')
    for w_index, worker in enumerate(workers):
        y = 46 + w_index * _TL_LANE_H
        out.append(f'<rect x="10" y="{y}" width="{width - 20}" height="{_TL_LANE_H - 8}" rx="6" class="tl-lane"/>')
        out.append(f'<text x="22" y="{y + _TL_LANE_H / 2}" class="worker-label">{esc(_short(str(worker), 18))}</text>')
        lane = [(i, t) for i, t in enumerate(transitions) if t.get("workerId") == worker]
        by_dispatch: dict[Any, list[tuple[int, Mapping[str, Any]]]] = {}
        for i, t in lane:
            by_dispatch.setdefault(t.get("dispatchId"), []).append((i, t))
        cy = y + (_TL_LANE_H - 8) / 2
        for steps in by_dispatch.values():
            for rank, ((i, t), nxt) in enumerate(zip(steps, [*steps[1:], None], strict=True)):
                x = x_of(i, rank)
                state = t.get("to") or _PHASE_STATE.get(str(t.get("phase")), "pending")
                if nxt is not None:
                    x2 = x_of(nxt[0], rank + 1)
                    out.append(f'<rect x="{min(x, x2)}" y="{cy - 5}" width="{max(abs(x2 - x), 2)}" height="10" '
                               f'fill="{_STATE_COLOURS.get(str(state), "#adb5bd")}" opacity="0.55"/>')
                colour = _STATE_COLOURS.get(str(state), "#adb5bd")
                tip = f"{t.get('phase')}  {t.get('from')} → {t.get('to')}\n{t.get('timestamp')}"
                if t.get("harvestedKeys"):
                    tip += "\nharvested: " + ", ".join(map(str, t["harvestedKeys"]))
                if t.get("error"):
                    tip += f"\nerror: {t['error']}"
                if t.get("derived"):
                    tip += "\n(derived)"
                out.append(f'<g class="phase" data-phase="{esc(t.get("phase"))}"><title>{esc(tip)}</title>'
                           f'<circle cx="{x}" cy="{cy}" r="8" fill="{colour}" stroke="#343a40" stroke-width="1.2"/>')
                above = rank % 2 == 0
                out.append(f'<text x="{x}" y="{cy - 13 if above else cy + 22}" class="phase-label">'
                           f'{esc(t.get("phase"))}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Agent graph

_AG_W = 250
_AG_H = 70
_AG_COL = 340
_AG_ROW = 96
_AG_TOP = 20
_AG_LEFT = 20
#: Child runs an agent lists by id (the rest are counted).
_AG_RUNS_LISTED = 5


def _ms_text(ms: int) -> str:
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def agent_graph_svg(graph: AgentGraph, href: Callable[[str], str] | None = None) -> str:
    """The agents of a run tree as boxes in columns by depth, an arrow per handoff labelled with its count.

    A box links (``href(run_id)``) to the agent's child run, the first of them when it ran several, if the store
    holds its events (a child run nobody recorded is named, not linked); without ``href`` (a report file) the run ids
    are in its title.
    """
    if len(graph.agents) < 2:
        return '<p class="empty">No handoffs: this run dispatched to no agent.</p>'
    columns: dict[int, list[AgentNode]] = {}
    for agent in graph.agents:
        columns.setdefault(agent.depth, []).append(agent)
    pos = {a.name: (float(_AG_LEFT + a.depth * _AG_COL), float(_AG_TOP + 20 + i * _AG_ROW))
           for depth, agents in columns.items() for i, a in enumerate(agents)}
    width = _AG_LEFT + (max(columns) + 1) * _AG_COL
    height = _AG_TOP + 20 + max(len(c) for c in columns.values()) * _AG_ROW + 10
    out = [f'<svg class="agents" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="agent graph">',
           '<defs><marker id="agent-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#7b2cbf"/></marker></defs>']
    for h in graph.handoffs:
        (x1, y1), (x2, y2) = pos[h.source], pos[h.target]
        if x2 > x1:
            sx, sy, ex, ey = x1 + _AG_W, y1 + _AG_H / 2, x2, y2 + _AG_H / 2
            mid = (sx + ex) / 2
            d = f"M{sx},{sy} C{mid},{sy} {mid},{ey} {ex},{ey}"
            lx, ly = mid, (sy + ey) / 2 - 6
        else:  # back to an agent at the same depth or above: over the top
            sx, sy, ex, ey = x1 + _AG_W / 2, y1, x2 + _AG_W / 2 + 20, y2
            top = min(sy, ey) - 18
            d = f"M{sx},{sy} C{sx},{top} {ex},{top} {ex},{ey}"
            lx, ly = (sx + ex) / 2, top - 2
        failed = f", {h.failed} failed" if h.failed else ""
        ended = f"{failed} or cancelled" if h.failed else ""
        out.append(f'<g class="handoff" data-from="{esc(h.source)}" data-to="{esc(h.target)}" '
                   f'data-count="{h.count}" data-failed="{h.failed}"><title>{esc(h.source)} → {esc(h.target)}: '
                   f'{h.count} dispatch(es){ended}</title><path d="{d}" class="agent-edge" '
                   f'marker-end="url(#agent-arrow)"/><text x="{lx}" y="{ly}" class="agent-count">×{h.count}'
                   f'{esc(failed)}</text></g>')
    for agent in graph.agents:
        x, y = pos[agent.name]
        runs = f"{len(agent.runs)} run{'s' if len(agent.runs) != 1 else ''}"
        if len(agent.recorded) < len(agent.runs):
            runs += f" ({len(agent.recorded)} recorded)"
        tip = "\n".join([agent.name, *agent.runs[:_AG_RUNS_LISTED]]
                        + ([f"… {len(agent.runs) - _AG_RUNS_LISTED} more"] if len(agent.runs) > _AG_RUNS_LISTED
                           else []))
        box = (f'<title>{esc(tip)}</title><rect x="{x}" y="{y}" width="{_AG_W}" height="{_AG_H}" rx="8" '
               f'class="agent-box{" root" if agent.root else ""}"/>'
               f'<text x="{x + 10}" y="{y + 19}" class="agent-name">{esc(_short(agent.name, 30))}</text>'
               f'<text x="{x + 10}" y="{y + 38}" class="agent-figure">{"this run" if agent.root else runs} · '
               f'{esc(_ms_text(agent.duration_ms))} · {agent.events} events</text>'
               f'<text x="{x + 10}" y="{y + 56}" class="agent-figure">{agent.input_tokens} / {agent.output_tokens} '
               f'tokens · {agent.cost_cents:g}¢</text>')
        attrs = (f'class="agent" data-agent="{esc(agent.name)}" data-runs="{len(agent.runs)}" '
                 f'data-tokens="{agent.input_tokens + agent.output_tokens}" data-cost="{agent.cost_cents:g}"')
        if href is not None and agent.recorded and not agent.root:
            out.append(f'<a href="{esc(href(agent.recorded[0]))}" {attrs}>{box}</a>')
        else:
            out.append(f"<g {attrs}>{box}</g>")
    out.append("</svg>")
    return "\n".join(out)


def agents_table(graph: AgentGraph, href: Callable[[str], str] | None = None) -> str:
    """Each agent's figures and child runs (linked with ``href``), and each handoff's count; the graph's text."""
    if len(graph.agents) < 2:
        return ""

    rows = []
    for a in graph.agents:
        def run(r: str, recorded: tuple[str, ...] = a.recorded) -> str:
            if href is not None and r in recorded:
                return f'<a href="{esc(href(r))}">{esc(r)}</a>'
            return f"<code>{esc(r)}</code>" + ("" if r in recorded else " (not recorded)")

        listed = ", ".join(run(r) for r in a.runs[:_AG_RUNS_LISTED])
        more = f" … and {len(a.runs) - _AG_RUNS_LISTED} more" if len(a.runs) > _AG_RUNS_LISTED else ""
        handed = ", ".join(f"{esc(h.target)} ×{h.count}" + (f" ({h.failed} failed)" if h.failed else "")
                           for h in graph.handoffs if h.source == a.name)
        rows.append(f'<tr class="agent-row" data-agent="{esc(a.name)}"><td>{esc(a.name)}</td><td>{listed}{more}</td>'
                    f"<td>{handed}</td><td>{esc(_ms_text(a.duration_ms))}</td><td>{a.events}</td>"
                    f"<td>{a.input_tokens} / {a.output_tokens}</td><td>{a.cost_cents:g}¢</td></tr>")
    note = (f'<p class="meta">The tree has more than {len(graph.agents)} agents\' runs can show: the figures stop '
            "at the first runs read.</p>" if graph.truncated else "")
    return ('<table class="agents"><tr><th>agent</th><th>runs</th><th>handed to</th><th>time (sum of its runs)</th>'
            f"<th>events</th><th>tokens in / out</th><th>cost</th></tr>{''.join(rows)}</table>{note}")


# ---------------------------------------------------------------------------------------------
# Page

REPORT_CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px 32px;color:#212529;background:#fff}
h1{font-size:22px;margin:0 0 4px} \
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dee2e6;padding-bottom:4px}
.meta{color:#495057;font-size:13px} .meta code{font-size:12px;background:#f1f3f5;padding:1px 4px;border-radius:3px}
.stats{display:flex;gap:12px;margin:14px 0;flex-wrap:wrap}
.stat{border:1px solid #dee2e6;border-radius:8px;padding:8px 14px;min-width:96px}
.stat b{display:block;font-size:20px} .stat span{color:#868e96;font-size:12px}
.stat.bad b{color:#c92a2a}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;margin:6px 0 10px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:4px;vertical-align:-2px;\
border:1px solid}
.scroll{overflow-x:auto;border:1px solid #e9ecef;border-radius:8px;padding:8px}
svg text{font-family:inherit}
.lane{fill:#fbfcfd;stroke:#f1f3f5}
.lane-label{font-size:12px;font-weight:600;fill:#495057}
.seq{font-size:11px;fill:#adb5bd;text-anchor:end}
.node-label{font-size:12px}
.edge{fill:none;stroke:#868e96;stroke-width:1.2;opacity:.8}
.edge-stub{fill:none;stroke:#f08c00;stroke-width:1.2;stroke-dasharray:3 2}
.axis{stroke:#adb5bd} .tick{font-size:11px;fill:#868e96;text-anchor:middle}
.tl-lane{fill:#f8f9fa;stroke:#e9ecef}
.agent-box{fill:#f3e8fd;stroke:#7b2cbf;stroke-width:1.2} .agent-box.root{fill:#e8eefc;stroke:#3b5bdb}
.agent-name{font-size:13px;font-weight:600;fill:#343a40} .agent-figure{font-size:11px;fill:#495057}
.agent-edge{fill:none;stroke:#7b2cbf;stroke-width:1.5;opacity:.8}
.agent-count{font-size:11px;fill:#7b2cbf;text-anchor:middle;font-weight:600}
.worker-label{font-size:13px;font-weight:600;fill:#343a40;dominant-baseline:middle}
.phase-label{font-size:11px;fill:#343a40;text-anchor:middle}
table{border-collapse:collapse;font-size:12px;margin-top:6px}
td,th{border:1px solid #dee2e6;padding:3px 8px;text-align:left} th{background:#f8f9fa}
.empty{color:#868e96}
"""


def legend_html() -> str:
    """The colour key of the graph's type families."""
    items = [f'<span><i style="background:{f};border-color:{s}"></i>{esc(name)}</span>'
             for name, (f, s) in FAMILY_COLOURS.items()]
    items.append(f'<span><i style="background:{_REFUSAL[0]};border-color:{_REFUSAL[1]}"></i>refusal</span>')
    items.append(f'<span><i style="background:#fff;border:2px dashed {_VIOLATION_RING}"></i>violation</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def violations_table(violations: Sequence[Mapping[str, Any]]) -> str:
    """The run's violations as a table, or a sentence saying there were none."""
    if not violations:
        return '<p class="empty">No handoff violations: every transition was legal and correctly caused.</p>'
    rows = "".join(
        f"<tr><td>{esc(v.get('sequence'))}</td><td>{esc(v.get('code'))}</td><td>{esc(v.get('workerId'))}</td>"
        f"<td>{esc(v.get('phase'))}</td><td>{esc(v.get('detail'))}</td></tr>"
        for v in violations
    )
    return ("<table><tr><th>seq</th><th>code</th><th>worker</th><th>phase</th><th>detail</th></tr>"
            f"{rows}</table>")


def normalise_events(events: Iterable[Mapping[str, Any]],
                      transitions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Sorted copies; chain events get ``phase``/``worker`` from their payload or, when the events came
    without payloads (the run-timeline query), from the transition they produced."""
    by_event = {t.get("eventId"): t for t in transitions}
    out = []
    for e in events:
        doc = dict(e)
        if doc.get("type") == "core.workflowChain.event":
            own = doc.get("payload")
            payload: Mapping[str, Any] = own if isinstance(own, Mapping) else by_event.get(doc.get("eventId"), {})
            doc["phase"] = payload.get("phase")
            doc["worker"] = payload.get("workerId")
        out.append(doc)
    out.sort(key=lambda d: (d.get("sequence") is None, d.get("sequence") or 0))
    return out


def violated_by_event(violations: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """eventId → the violation codes it carries (the graph rings those events)."""
    violated: dict[str, list[str]] = {}
    for v in violations:
        violated.setdefault(str(v.get("eventId")), []).append(str(v.get("code")))
    return violated


def sort_transitions(transitions: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Transitions in the order the timeline draws them: by time, then by sequence (derived ones last)."""
    return sorted(transitions, key=lambda t: (_parse_ts(t.get("timestamp")) or 0.0,
                                              t.get("sequence") if t.get("sequence") is not None else 1 << 62))


def render_report(
    events: Sequence[Mapping[str, Any]],
    transitions: Sequence[Mapping[str, Any]],
    violations: Sequence[Mapping[str, Any]],
    *,
    run_id: str | None = None,
    head_hash: str | None = None,
    agents: AgentGraph | None = None,
) -> str:
    """The HTML page for one run.

    Args:
        events: the run's RunEventDocs (``eventId``, ``type``, ``sequence``, optional
            ``causationId``, ``nodeId``, ``timestamp``, ``payload``); any order.
        transitions: Transition records (CONTRACT.md) whose ``parentRunId`` is the run.
        violations: Violation records of the run; their events get a dashed ring.
        run_id, head_hash: shown in the header when given.
        agents: the run tree's agent graph (:func:`agentlog.audit.agents.agent_graph`), drawn first when given.
    """
    docs = normalise_events(events, transitions)
    run_id = run_id or (docs[0].get("runId") if docs else None) or "(unknown run)"
    violated = violated_by_event(violations)
    transitions = sort_transitions(transitions)
    refusals = sum(1 for d in docs if d.get("type") == "envelope.refusal")
    edges = sum(1 for d in docs if d.get("causationId"))
    stats = [
        ("events", len(docs), False), ("causation links", edges, False),
        ("transitions", len(transitions), False), ("workers", len({t.get("workerId") for t in transitions}), False),
        ("refusals", refusals, refusals > 0), ("violations", len(violations), bool(violations)),
    ]
    stat_html = "".join(
        f'<div class="stat{" bad" if bad else ""}"><b>{n}</b><span>{esc(label)}</span></div>'
        for label, n, bad in stats
    )
    first = docs[0].get("timestamp") if docs else None
    last = docs[-1].get("timestamp") if docs else None
    meta = f"<code>{esc(run_id)}</code>"
    if first:
        meta += f" · {esc(first)} → {esc(last)}"
    if head_hash:
        meta += f" · head hash <code>{esc(head_hash)}</code>"
    graph = graph_svg(docs, violated) if docs else '<p class="empty">No events.</p>'
    agent_section = "" if agents is None else (
        f'<h2>Agents</h2><div class="scroll">{agent_graph_svg(agents)}</div>{agents_table(agents)}\n')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>agentlog report · {esc(run_id)}</title>
<style>{REPORT_CSS}</style></head>
<body>
<h1>Run report</h1>
<div class="meta">{meta}</div>
<div class="stats">{stat_html}</div>
{agent_section}<h2>Handoff timeline</h2>
<div class="scroll">{timeline_svg(transitions)}</div>
<h2>Causation graph</h2>
{legend_html()}
<div class="scroll">{graph}</div>
<h2>Violations</h2>
{violations_table(violations)}
<p class="meta">Generated by agentlog from the audit history. Self-contained: no scripts, no external resources.</p>
</body></html>
"""
