"""Where an event the replay inserted into one lane of a concurrent run is reported: where its lane departs.

That is the source index of the lane event it displaced (its lane successor), an event of its own lane —
not the index just after its lane predecessor, which an interleaved source gives to another lane. An
event after its lane's last one displaced none, and is reported just after the lane's end.

The run is :func:`tests.unit.replay.runs.concurrent_run`: workers ``wa`` (sources 3, 5, 6) and ``wb``
(sources 4, 7, 8) interleave between the dispatches (1, 2) and ``run.completed`` (9).
"""

from __future__ import annotations

import copy

from agentlog.replay.compare import compare_runs
from agentlog.replay.lanes import lane_of
from tests.unit.replay.runs import as_replay, concurrent_run, interleave

WB_FIRST = [0, 1, 2, 4, 7, 8, 3, 5, 6, 9]
WA_FIRST = [0, 1, 2, 3, 5, 6, 4, 7, 8, 9]


def _inserted(replay: list[dict], at: int, node: str) -> list[dict]:
    """A ``variable.changed`` of ``node`` inserted at replay position ``at``, later events renumbered."""
    doc = {"eventId": f"evt-extra-{node}", "runId": replay[0]["runId"], "type": "variable.changed",
           "payload": {"name": f"{node}Note", "value": "again"}, "timestamp": "2026-03-02T09:00:00.000Z",
           "nodeId": node, "causationId": replay[at - 1]["eventId"]}
    out = copy.deepcopy(replay[:at]) + [doc] + copy.deepcopy(replay[at:])
    for seq, d in enumerate(out):
        d["sequence"] = seq
    return out


def test_an_extra_is_reported_at_the_lane_event_it_displaced() -> None:
    original = concurrent_run("par-1")
    # The replay writes wb's call (source 4), then the extra, then wb's result (source 7): the extra displaced 7.
    # Just after its lane predecessor (4) the source has wa's result (5), another lane's event.
    replay = _inserted(interleave(as_replay(original, replay_run_id="r-1"), WB_FIRST), 4, "wb")
    assert [lane_of(original[s]) for s in (4, 5, 7)] == ["wb", "wa", "wb"]
    result = compare_runs(original, replay, collect_all=True)
    # Its effect on the state shows where the lanes join (the end), as for every inserted event.
    assert [(d.kind, d.at_sequence, d.node_id, d.path) for d in result.divergences] == [
        ("extra", 7, "wb", None), ("output", 9, "end", "variables.wbNote")]
    assert result.events[0]["payload"]["atSequence"] == 7
    assert compare_runs(original, replay).first_divergence.at_sequence == 7


def test_an_extra_after_its_lane_s_last_event_is_reported_just_after_the_lane_s_end() -> None:
    original = concurrent_run("par-1")
    # wa's lane ends at source 6; the replay adds to it before writing any of wb's events.
    replay = _inserted(interleave(as_replay(original, replay_run_id="r-1"), WA_FIRST), 6, "wa")
    result = compare_runs(original, replay, collect_all=True)
    assert [(d.kind, d.at_sequence, d.node_id, d.path) for d in result.divergences] == [
        ("extra", 7, "wa", None), ("output", 9, "end", "variables.waNote")]
