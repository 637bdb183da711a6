"""The fold itself: status, variables, channels, purity, forward compatibility, state hashing."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from agentlog.core.fold import (
    FoldError,
    fold,
    fold_all,
    initial_state,
    observable,
    state_hash,
    states_by_index,
)
from agentlog.core.handoff import HandoffError

from .runs import BINDINGS, RunLog, realistic_run


def _doc(type_: str, payload: object, seq: int = 0, run_id: str = "r1") -> dict:
    return {"eventId": f"{run_id}:{seq}", "runId": run_id, "type": type_, "payload": payload,
            "timestamp": "2025-01-15T10:00:00.000Z", "sequence": seq}


def test_initial_state_shape():
    s = initial_state("r1")
    for key, empty in (("status", "pending"), ("variables", {}), ("channels", {}), ("handoffs", {}),
                       ("bindings", {}), ("flags", [])):
        assert s[key] == empty
    assert fold(None, _doc("log.appended", {}))[0] == s


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("run.started", "running"),
        ("run.paused", "paused"),
        ("run.resumed", "running"),
        ("run.resuming", "running"),
        ("run.completed", "completed"),
        ("run.failed", "failed"),
        ("run.cancelled", "cancelled"),
        ("approval.requested", "waiting-approval"),
        ("approval.granted", "running"),
        ("approval.received", "running"),
        ("approval.rejected", "running"),
        ("clarification.requested", "waiting-input"),
        ("clarification.resolved", "running"),
    ],
)
def test_status_by_event_type(event_type, status):
    paused = {**initial_state("r1"), "status": "paused"}
    new, outputs = fold(paused, _doc(event_type, {}))
    assert new["status"] == status
    assert outputs == []


def test_run_started_binds_versions_and_replay_origin():
    replay_of = {"sourceRunId": "r0", "fromSeq": 3, "mode": "live"}
    s, _ = fold(None, _doc("run.started", {"bindings": BINDINGS, "replayOf": replay_of}))
    assert s["bindings"] == BINDINGS
    assert s["replayOf"] == replay_of
    s, _ = fold(None, _doc("run.started", {}))
    assert s["bindings"] == {} and s["replayOf"] is None


def test_variables_set_and_overwrite():
    log = RunLog("r1")
    log.add("run.started", {})
    log.add("variable.changed", {"name": "x", "value": 1})
    log.add("variable.changed", {"name": "y", "value": {"deep": [1, 2]}})
    log.add("variable.changed", {"name": "x", "value": None})
    s, _ = fold_all(log.docs)
    assert s["variables"] == {"x": None, "y": {"deep": [1, 2]}}


def test_channels_append_in_order():
    log = RunLog("r1")
    for ch, v in (("progress", "a"), ("audit", 1), ("progress", "b"), ("progress", {"c": 3})):
        log.add("channel.written", {"channel": ch, "value": v})
    s, _ = fold_all(log.docs)
    assert s["channels"] == {"progress": ["a", "b", {"c": 3}], "audit": [1]}


@pytest.mark.parametrize(
    "event",
    [
        _doc("some.future.type", {"anything": [1, 2]}),
        _doc("provider.usage", {"provider": "p", "model": "m", "inputTokens": 1, "outputTokens": 2}),
        _doc("agent.toolCalled", {"callId": "c", "tool": "t", "args": {}}),
        _doc("variable.changed", {"value": 1}),  # no name
        _doc("variable.changed", ["not", "an", "object"]),
        _doc("channel.written", {"channel": 7, "value": 1}),
        _doc("channel.written", {"channel": "c"}),  # no value
    ],
)
def test_unknown_or_unusable_events_leave_state_unchanged(event):
    before = fold_all(realistic_run("r1"))[0]
    after, outputs = fold(before, event)
    assert after is before
    assert outputs == []


@pytest.mark.parametrize("mode", ["check", "derive", "auto"])
@pytest.mark.parametrize("run_mode", ["check", "derive"])
def test_fold_never_mutates_its_inputs(mode, run_mode):
    state = None
    for event in realistic_run("r1", run_mode):
        frozen_state, frozen_event = copy.deepcopy(state), copy.deepcopy(event)
        new, outputs = fold(state, event, handoff_mode=mode)
        assert state == frozen_state
        assert event == frozen_event
        # Outputs must not alias the new state: a consumer that edits an output cannot corrupt it.
        frozen_new = copy.deepcopy(new)
        for out in outputs:
            for value in out.values():
                if isinstance(value, (list, dict)):
                    value.clear() if isinstance(value, dict) else value.append("poison")
        assert new == frozen_new
        state = new


@pytest.mark.parametrize("run_mode", ["check", "derive"])
def test_same_input_same_output(run_mode):
    events = realistic_run("r1", run_mode)
    first = states_by_index(events)
    second = states_by_index(copy.deepcopy(events))
    assert [h for _, h in first] == [h for _, h in second]
    assert fold_all(events) == fold_all(copy.deepcopy(events))
    # Each step from the same prior state is deterministic too.
    state = None
    for event in events:
        a = fold(state, event)
        b = fold(copy.deepcopy(state), copy.deepcopy(event))
        assert a == b
        assert state_hash(a[0]) == state_hash(b[0])
        state = a[0]


def _reversed_keys(value):
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


def test_state_hash_is_sha256_of_canonical_json_and_ignores_insertion_order():
    state = fold_all(realistic_run("r1"))[0]
    shuffled = _reversed_keys(state)
    assert list(shuffled) != list(state)
    assert state_hash(shuffled) == state_hash(state)
    roundtrip = json.loads(json.dumps(state, sort_keys=True))
    assert state_hash(roundtrip) == state_hash(state)
    # Independent check of the definition on a state with only ASCII strings and small ints.
    expected = hashlib.sha256(
        json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()
    assert state_hash(state) == expected


def test_states_by_index_tracks_each_event():
    events = realistic_run("r1")
    pairs = states_by_index(events)
    assert len(pairs) == len(events)
    assert pairs[0][0]["status"] == "running"
    assert pairs[-1][0]["status"] == "completed"
    assert all(h == state_hash(s) for s, h in pairs)
    # Only provider.usage (seq 3) and, in auto mode with a checking host, node.dispatched
    # (seq 6 and 16) leave the state as it was; every other event changes the hash.
    unchanged = [i for i in range(1, len(pairs)) if pairs[i][1] == pairs[i - 1][1]]
    assert unchanged == [3, 6, 16]
    assert len({h for _, h in pairs}) == len(events) - 3


def test_fold_all_resumes_from_a_snapshot_state():
    events = realistic_run("r1", "check")
    full, full_out = fold_all(events)
    mid, head_out = fold_all(events[:9])
    snapshot = json.loads(json.dumps(mid))  # what a snapshot topic hands back
    rest, tail_out = fold_all(events[9:], state=snapshot)
    assert state_hash(rest) == state_hash(full)
    assert head_out + tail_out == full_out


def test_observable_is_status_variables_channels():
    s = fold_all(realistic_run("r1"))[0]
    assert observable(s) == {
        "status": "completed",
        "variables": {"goal": "summarise Q4 incidents", "parentResult": {"incidents": 3, "worst": "INC-42"}},
        "channels": {"progress": ["worker-b dispatch failed", "done"]},
    }


def test_observable_state_is_the_same_in_check_and_derive_runs():
    check = fold_all(realistic_run("r1", "check"))[0]
    derive = fold_all(realistic_run("r1", "derive"))[0]
    assert observable(check) == observable(derive)


def test_caller_errors_are_typed():
    with pytest.raises(HandoffError) as e:
        fold_all(realistic_run("r1"), handoff_mode="guess")
    assert e.value.code == "handoff_error"
    with pytest.raises(FoldError):
        fold_all([])
