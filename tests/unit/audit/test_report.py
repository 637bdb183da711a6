"""render_report offline: one node per event, one edge per causation link, highlights, self-containment.

The screenshot test renders the page in headless Chromium when it is installed and checks the
PNG shows a picture (many distinct colours), read with zlib alone.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from agentlog.audit.report import render_report
from agentlog.core.fold import fold_all
from tests.tools import require_tool
from tests.unit.audit.pngcheck import distinct_colours
from tests.unit.core.runs import realistic_run


class _Svg(HTMLParser):
    """Collects the graph's nodes and edges and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[dict] = []
        self.edges: list[dict] = []
        self.stubs: list[dict] = []
        self.phases: list[str] = []
        self.loads: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        classes = (a.get("class") or "").split()
        if tag == "g" and "node" in classes:
            self.nodes.append({**a, "classes": classes})
        if tag == "path" and "edge" in classes:
            self.edges.append(a)
        if tag == "path" and "edge-stub" in classes:
            self.stubs.append(a)
        if tag == "g" and "phase" in classes:
            self.phases.append(a["data-phase"])
        for k, v in a.items():
            if k in ("src", "href", "xlink:href", "action", "srcset") or (v and "url(" in v and "url(#" not in v):
                self.loads.append((tag, k, v))


def _outputs(docs):
    _, outs = fold_all(docs)
    transitions = [{k: v for k, v in o.items() if k != "kind"} for o in outs if o["kind"] == "transition"]
    violations = [{k: v for k, v in o.items() if k != "kind"} for o in outs if o["kind"] == "violation"]
    return transitions, violations


def _run_with_refusal_and_violation():
    docs = realistic_run("run-r", mode="check")
    # Turn the child.completed of worker-a into a refusal: the harvest that follows becomes illegal.
    completed = next(d for d in docs if d["type"] == "core.workflowChain.event"
                     and d["payload"]["phase"] == "child.completed")
    completed["type"] = "envelope.refusal"
    completed["payload"] = {"reason": "policy"}
    return docs, completed["eventId"]


def _parse(page: str) -> _Svg:
    parser = _Svg()
    parser.feed(page)
    return parser


def test_one_node_per_event_and_one_edge_per_causation_link():
    docs = realistic_run("run-g", mode="check")
    transitions, violations = _outputs(docs)
    svg = _parse(render_report(docs, transitions, violations))
    assert sorted(n["data-event-id"] for n in svg.nodes) == sorted(d["eventId"] for d in docs)
    ids = {d["eventId"] for d in docs}
    expected = sorted((d["causationId"], d["eventId"]) for d in docs if d.get("causationId") in ids)
    assert expected, "the fixture run must have causation links"
    assert sorted((e["data-from"], e["data-to"]) for e in svg.edges) == expected
    assert svg.stubs == []


def test_cause_outside_the_run_is_a_stub_not_an_edge():
    docs = realistic_run("run-s", mode="check")
    docs[3]["causationId"] = "other-host:event-9"
    svg = _parse(render_report(docs, [], []))
    assert [(s["data-from"], s["data-to"]) for s in svg.stubs] == [("other-host:event-9", docs[3]["eventId"])]
    assert len(svg.edges) == sum(1 for d in docs if d.get("causationId") in {x["eventId"] for x in docs})


def test_refusals_and_violations_are_highlighted():
    docs, refused_id = _run_with_refusal_and_violation()
    transitions, violations = _outputs(docs)
    assert violations, "the altered run must produce a violation"
    svg = _parse(render_report(docs, transitions, violations))
    refusal_nodes = [n["data-event-id"] for n in svg.nodes if "refusal" in n["classes"]]
    assert refusal_nodes == [refused_id]
    violated = sorted(n["data-event-id"] for n in svg.nodes if "violation" in n["classes"])
    assert violated == sorted({v["eventId"] for v in violations})


def test_timeline_has_one_marker_per_transition_and_a_lane_per_worker():
    docs = realistic_run("run-t", mode="check")
    transitions, violations = _outputs(docs)
    page = render_report(docs, transitions, violations)
    svg = _parse(page)
    assert sorted(svg.phases) == sorted(t["phase"] for t in transitions)
    for worker in {t["workerId"] for t in transitions}:
        assert f">{worker}</text>" in page


def test_page_is_self_contained_and_escapes_what_it_shows():
    docs = realistic_run("run-x", mode="check")
    docs[1]["nodeId"] = "<script>alert(1)</script>"
    page = render_report(docs, [], [])
    svg = _parse(page)
    assert svg.loads == []
    assert not {"script", "link", "img", "iframe", "object"} & svg.tags
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    # the only URL in the page is the SVG namespace, which is an identifier, never fetched
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}


def test_empty_inputs_render():
    page = render_report([], [], [])
    assert "No events" in page and "No handoff transitions" in page


def test_headless_chromium_screenshot_shows_a_picture(tmp_path: Path):
    require_tool("chromium")
    docs, _ = _run_with_refusal_and_violation()
    transitions, violations = _outputs(docs)
    html_file = tmp_path / "report.html"
    html_file.write_text(render_report(docs, transitions, violations), "utf-8")
    png = tmp_path / "report.png"
    profile = tempfile.mkdtemp(dir=tmp_path)
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=900,700", html_file.as_uri()],
        capture_output=True, timeout=120, check=False,
    )
    assert png.is_file(), "chromium wrote no screenshot"
    # A blank or single-colour page has 1-2 colours; text, boxes and anti-aliasing give hundreds.
    assert distinct_colours(png.read_bytes()) > 50
