"""Per-lane comparison rules that the golden pairs do not pin: joins, causation, extras, lanes.

Runs are small and hand-made (``RunLog``); each expectation is reasoned from the rule in
``processors/replay/lanes.py``, not taken from a run of the engine.
"""

from __future__ import annotations

import copy

from agentlog.replay.compare import compare_runs
from agentlog.replay.lanes import align, lane_of
from tests.unit.core.runs import RunLog
from tests.unit.replay.make_golden import WB_FIRST
from tests.unit.replay.runs import as_replay, concurrent_run, index_of, interleave, llm_run


def _two_writers(run_id: str, order: tuple[str, str]) -> list[dict]:
    """Workers wa and wb each set variable ``x``; ``order`` says whose write comes first."""
    log = RunLog(run_id)
    log.add("run.started", {}, node="start")
    for node in order:
        log.add("variable.changed", {"name": "x", "value": node}, node=node, cause=0)
    log.add("run.completed", {}, node="end")
    return log.docs


def test_same_lane_events_swapped_are_a_divergence_not_a_reordering() -> None:
    original = concurrent_run("par-1")
    replay = as_replay(original, replay_run_id="r-1")
    replay = interleave(replay, [0, 1, 2, 3, 4, 6, 5, 7, 8, 9])  # wa's variable before wa's tool result
    result = compare_runs(original, replay)
    assert result.verdict == "diverged"
    assert result.first_divergence is not None and result.first_divergence.at_sequence == 5
    assert result.first_divergence.kind == "type-mismatch"


def test_the_whole_state_must_agree_where_the_lanes_join() -> None:
    # Swapping the two writers keeps each lane's own events identical, but the state at the
    # end (x = the last writer) depends on the interleaving: that is a real difference.
    original = _two_writers("w-1", ("wa", "wb"))
    replay = as_replay(_two_writers("w-1", ("wb", "wa")), replay_run_id="r-1")
    result = compare_runs(original, replay)
    assert result.verdict == "diverged"
    d = result.first_divergence
    assert d is not None and d.aspect == "state" and d.at_sequence == 3 and d.event_type == "run.completed"
    assert (d.path, d.expected, d.actual) == ("variables.x", "wb", "wa")


def test_a_cross_lane_cause_must_follow_the_pairing() -> None:
    # wb's tool call is caused by wb's dispatch; a replay that makes it caused by wa's dispatch
    # broke a causal order even though the lane order is intact.
    original = concurrent_run("par-1")
    replay = interleave(as_replay(original, replay_run_id="r-1"), WB_FIRST)
    wb_call = next(d for d in replay if d["type"] == "agent.toolCalled" and d["nodeId"] == "wb")
    wa_dispatch = next(d for d in replay if d["type"] == "node.dispatched" and
                       d["payload"]["childWorkflowId"] == "worker-a")
    wb_call["causationId"] = wa_dispatch["eventId"]
    result = compare_runs(original, replay)
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert (result.first_divergence.at_sequence, result.first_divergence.aspect) == (4, "causation")


def test_an_extra_event_in_one_lane_is_reported_after_the_original_end() -> None:
    original = concurrent_run("par-1")
    replay = interleave(as_replay(original, replay_run_id="r-1"), WB_FIRST)
    extra = copy.deepcopy(replay[5])  # wb's variable.changed, written twice
    extra.update(sequence=len(replay), eventId="evt-extra")
    result = compare_runs(original, replay[:-1] + [extra, {**replay[-1], "sequence": len(replay) + 1}],
                          collect_all=True)
    assert [d.kind for d in result.divergences] == ["extra"]
    assert result.divergences[0].at_sequence == len(original)


def test_lanes_are_nodes_refined_by_the_dispatched_worker() -> None:
    run = concurrent_run("par-1")
    assert [lane_of(d) for d in run[:5]] == ["start", "dispatch/worker-a", "dispatch/worker-b", "wa", "wb"]
    assert align({d["sequence"]: d for d in run}, {d["sequence"]: d for d in run}).identity


def _with_extra(replay: list[dict], at: int, doc: dict) -> list[dict]:
    """``doc`` inserted at replay position ``at``, every later event renumbered."""
    out = replay[:at] + [doc] + copy.deepcopy(replay[at:])
    for seq, d in enumerate(out):
        d["sequence"] = seq
    return out


def _variable(replay: list[dict], node: str, name: str, value: object) -> dict:
    return {"eventId": f"evt-extra-{name}", "runId": replay[0]["runId"], "type": "variable.changed",
            "payload": {"name": name, "value": value}, "timestamp": "2026-03-02T09:00:00.000Z", "nodeId": node}


def test_an_extra_in_an_interleaved_replay_departs_at_the_lane_event_it_displaced() -> None:
    # wb's events first; the extra comes right after wb's tool call (source 4). Source 5, just
    # after it, is wa's: the lanes interleave differently, so other lanes' indexes say nothing of
    # wb's, and the lane departs at the event the extra displaced in it: wb's tool return, 7.
    original = concurrent_run("par-1")
    replay = interleave(as_replay(original, replay_run_id="r-1"), [0, 1, 2, 4, 7, 8, 3, 5, 6, 9])
    replay = _with_extra(replay, 4, _variable(replay, "wb", "bDraft", 1))
    result = compare_runs(original, replay)
    d = result.first_divergence
    assert d is not None and (d.kind, d.at_sequence, d.actual, d.node_id) == ("extra", 7, "variable.changed", "wb")
    assert d.original_event_id is None


def test_an_extra_in_a_replay_in_the_source_order_departs_where_it_was_inserted() -> None:
    # The same extra in a replay that keeps the source's interleaving: the replay had written
    # sources 0..4 when it wrote the extra, so it departs at 5, as index-by-index says too.
    original = concurrent_run("par-1")
    replay = _with_extra(as_replay(original, replay_run_id="r-1"), 5, _variable(original, "wb", "bDraft", 1))
    d = compare_runs(original, replay).first_divergence
    assert d is not None and (d.kind, d.at_sequence, d.node_id) == ("extra", 5, "wb")
    assert compare_runs(original, replay, strict=True).first_divergence.at_sequence == 5


def test_an_extra_write_of_a_variable_its_lane_writes_again_is_the_extra_one() -> None:
    # The replay writes parentResult twice: an early draft (new value), then the original write.
    # The original write pairs with its own copy; the draft is the inserted event.
    original = llm_run("run-1")
    replay = as_replay(original, replay_run_id="r-1")
    written = index_of(original, "variable.changed", 2)
    draft = _variable(replay, "dispatch", "parentResult", {"incidents": 0})
    result = compare_runs(original, _with_extra(replay, written - 1, draft), collect_all=True)
    assert [(d.kind, d.at_sequence) for d in result.divergences] == [("extra", written - 1)]
    assert result.reordered == ()


def test_a_changed_output_beside_an_extra_event_still_pairs_with_its_original() -> None:
    # In wb's lane the tool result changes and an extra variable comes right before it: the
    # result pairs by identity (same type, node, nothing named differently) and is an output.
    original = concurrent_run("par-1")
    replay = as_replay(original, replay_run_id="r-1")
    replay[7]["payload"]["result"] = {"pages": 5}
    replay = _with_extra(replay, 7, _variable(replay, "wb", "bDraft", 1))
    result = compare_runs(original, replay, collect_all=True)
    assert [(d.kind, d.at_sequence, d.path) for d in result.divergences][:2] == [
        ("extra", 7, None), ("output", 7, "payload.result.pages")]


def test_an_extra_event_is_left_out_of_the_relaid_state_and_shows_where_the_lanes_join() -> None:
    original = llm_run("run-1")
    replay = as_replay(original, replay_run_id="r-1")
    at = index_of(original, "channel.written") + 1
    result = compare_runs(original, _with_extra(replay, at, _variable(replay, "dispatch", "draft", "v2")),
                          collect_all=True)
    end = len(original) - 1
    assert [(d.kind, d.at_sequence, d.path, d.aspect) for d in result.divergences] == [
        ("extra", at, None, "type"), ("output", end, "variables.draft", "state")]
    event = result.events[0]["payload"]
    assert (event["divergenceKind"], event["divergencePoint"], event["atSequence"]) == ("extra", "variable.changed", at)
    assert "originalEventId" not in event
