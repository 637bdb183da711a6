"""Check mode: the host emits core.workflowChain.event per transition; the fold verifies it."""

from __future__ import annotations

import pytest

from agentlog.core.fold import fold, fold_all

from .runs import RunLog, child_run_id, event_id, realistic_run

RUN = "run-1"


def _e(seq: int) -> str:
    return event_id(RUN, seq)


def _transitions(outputs):
    return [o for o in outputs if o["kind"] == "transition"]


def _violations(outputs):
    return [o for o in outputs if o["kind"] == "violation"]


def test_realistic_run_exact_transitions_and_causation():
    state, outputs = fold_all(realistic_run(RUN, "check"), handoff_mode="check")
    assert _violations(outputs) == []
    assert [o for o in outputs if o["kind"] == "link"] == []
    rows = [(t["workerId"], t["phase"], t["from"], t["to"], t["eventId"], t["causationId"], t["sequence"])
            for t in _transitions(outputs)]
    assert rows == [
        ("worker-a", "dispatch.began", "pending", "dispatching", _e(4), _e(2), 4),
        ("worker-a", "dispatch.succeeded", "dispatching", "running", _e(5), _e(4), 5),
        ("worker-b", "dispatch.began", "pending", "dispatching", _e(7), _e(2), 7),
        ("worker-b", "dispatch.failed", "dispatching", "failed", _e(8), _e(7), 8),
        ("worker-a", "child.completed", "running", "completed", _e(10), _e(5), 10),
        ("worker-a", "output.harvested", "completed", "harvested", _e(11), _e(10), 11),
        ("worker-c", "dispatch.began", "pending", "dispatching", _e(14), _e(13), 14),
        ("worker-c", "dispatch.succeeded", "dispatching", "running", _e(15), _e(14), 15),
        ("worker-c", "child.cancelled", "running", "cancelled", _e(17), _e(15), 17),
    ]
    for t in _transitions(outputs):
        assert t["derived"] is False
        assert t["parentRunId"] == RUN
        assert t["timestamp"] == f"2025-01-15T10:00:{t['sequence']:02d}.000Z"
    by_phase = {(t["workerId"], t["phase"]): t for t in _transitions(outputs)}
    assert by_phase[("worker-a", "output.harvested")]["harvestedKeys"] == ["parentResult"]
    assert by_phase[("worker-a", "child.completed")]["childRunId"] == child_run_id(RUN, "a")
    assert by_phase[("worker-b", "dispatch.failed")]["error"]["code"] == "worker_unavailable"
    assert by_phase[("worker-c", "child.cancelled")]["error"]["code"] == "cancelled"
    # dispatchId is the eventId of the machine's dispatch.began, on every transition of it.
    assert {t["dispatchId"] for t in _transitions(outputs) if t["workerId"] == "worker-a"} == {_e(4)}

    assert state["flags"] == []
    assert state["handoffs"] == {
        _e(4): {"workerId": "worker-a", "state": "harvested", "childRunId": child_run_id(RUN, "a"),
                "lastEventId": _e(11), "decidedEventId": _e(2), "derived": False},
        _e(7): {"workerId": "worker-b", "state": "failed", "childRunId": None,
                "lastEventId": _e(8), "decidedEventId": _e(2), "derived": False},
        _e(14): {"workerId": "worker-c", "state": "cancelled", "childRunId": child_run_id(RUN, "c"),
                 "lastEventId": _e(17), "decidedEventId": _e(13), "derived": False},
    }


def test_upstream_conformance_on_a_checking_host():
    """RFC 0037 §Conformance, read off the host's own chain events."""
    _, outputs = fold_all(realistic_run(RUN, "check"), handoff_mode="check")
    chains: dict[str, list[dict]] = {}
    for t in _transitions(outputs):
        chains.setdefault(t["workerId"], []).append(t)
    happy = chains["worker-a"]
    assert [t["phase"] for t in happy] == ["dispatch.began", "dispatch.succeeded", "child.completed", "output.harvested"]
    assert happy[0]["causationId"] == _e(2)  # the runOrchestrator.decided
    assert [t["causationId"] for t in happy[1:]] == [t["eventId"] for t in happy[:-1]]
    assert happy[-1]["harvestedKeys"] == ["parentResult"]
    assert [t["phase"] for t in chains["worker-b"]] == ["dispatch.began", "dispatch.failed"]
    assert [t["phase"] for t in chains["worker-c"]] == ["dispatch.began", "dispatch.succeeded", "child.cancelled"]


@pytest.mark.parametrize("mode", ["check", "auto"])
def test_auto_mode_does_not_derive_for_a_checking_host(mode):
    events = realistic_run(RUN, "check")
    assert fold_all(events, handoff_mode=mode) == fold_all(events, handoff_mode="check")


# --------------------------------------------------------------------------- violations


def _decided(log: RunLog, workers=("w1",), mapping=None) -> int:
    log.add("run.started", {})
    decision = {"kind": "next-worker", "nextWorkerIds": list(workers)}
    if mapping is not None:
        decision["outputMapping"] = mapping
    return log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": decision})


def _fold_log(log: RunLog):
    return fold_all(log.docs, handoff_mode="check")


def _only_violation(outputs, code):
    vs = _violations(outputs)
    assert [v["code"] for v in vs] == [code], vs
    return vs[0]


def _machine(state, dispatch_seq: int):
    return state["handoffs"][event_id("r", dispatch_seq)]


def test_child_completed_while_dispatching_is_illegal_and_changes_nothing():
    log = RunLog("r")
    d = _decided(log)
    began = log.chain("dispatch.began", "w1", d)
    before, _ = _fold_log(log)
    bad = log.chain("child.completed", "w1", began, childRunId="c1")
    after, outputs = fold(before, log.docs[bad], handoff_mode="check")
    v = _only_violation(outputs, "illegal_transition")
    assert v == {"kind": "violation", "runId": "r", "code": "illegal_transition", "detail": v["detail"],
                 "eventId": log.id(bad), "sequence": bad, "workerId": "w1", "phase": "child.completed",
                 "dispatchId": log.id(began)}
    assert _transitions(outputs) == []
    assert after["handoffs"] == before["handoffs"]
    assert after["flags"] == [{"code": "illegal_transition", "eventId": log.id(bad), "sequence": bad}]


@pytest.mark.parametrize(
    ("path", "late_phase"),
    [
        (["dispatch.failed"], "dispatch.succeeded"),
        (["dispatch.succeeded", "child.failed"], "child.completed"),
        (["dispatch.succeeded", "child.cancelled"], "child.failed"),
        (["dispatch.succeeded", "child.completed", "output.harvested"], "output.harvested"),
        (["dispatch.succeeded", "child.completed", "output.harvested"], "child.completed"),
    ],
)
def test_anything_after_a_terminal_state_is_illegal(path, late_phase):
    log = RunLog("r")
    d = _decided(log)
    prev = began = log.chain("dispatch.began", "w1", d)
    for phase in path:
        extra = {} if phase == "dispatch.failed" else {"childRunId": "c1"}
        if phase == "output.harvested":
            extra["harvestedKeys"] = ["k"]
        prev = log.chain(phase, "w1", prev, **extra)
    late = log.chain(late_phase, "w1", prev, childRunId="c1", harvestedKeys=["k"])
    state, outputs = _fold_log(log)
    v = _only_violation(outputs, "illegal_transition")
    assert v["eventId"] == log.id(late)
    assert _machine(state, began)["lastEventId"] == log.id(prev)


def test_dispatch_began_not_caused_by_a_decision_is_wrong_causation_but_opens_the_machine():
    log = RunLog("r")
    d = _decided(log)
    other = log.add("variable.changed", {"name": "x", "value": 1})
    began = log.chain("dispatch.began", "w1", other)
    state, outputs = _fold_log(log)
    v = _only_violation(outputs, "wrong_causation")
    assert (v["eventId"], v["phase"], v["dispatchId"]) == (log.id(began), "dispatch.began", log.id(began))
    assert [t["phase"] for t in _transitions(outputs)] == ["dispatch.began"]
    # The machine records the decision that did name the worker, not the bogus cause.
    assert _machine(state, began)["decidedEventId"] == log.id(d)
    assert state["flags"][0]["code"] == "wrong_causation"


@pytest.mark.parametrize("cause", ["decision-not-naming-worker", None])
def test_dispatch_began_with_a_decision_for_other_workers_or_no_cause(cause):
    log = RunLog("r")
    d = _decided(log, workers=("w2",))
    began = log.chain("dispatch.began", "w1", d if cause else None)
    _, outputs = _fold_log(log)
    assert _only_violation(outputs, "wrong_causation")["eventId"] == log.id(began)


def test_legal_transition_with_wrong_causation_is_applied_and_reported():
    log = RunLog("r")
    d = _decided(log)
    began = log.chain("dispatch.began", "w1", d)
    ok = log.chain("dispatch.succeeded", "w1", d, childRunId="c1")  # should point at `began`
    done = log.chain("child.completed", "w1", ok, childRunId="c1")  # correct again
    state, outputs = _fold_log(log)
    v = _only_violation(outputs, "wrong_causation")
    assert (v["eventId"], v["dispatchId"]) == (log.id(ok), log.id(began))
    assert [t["phase"] for t in _transitions(outputs)] == ["dispatch.began", "dispatch.succeeded", "child.completed"]
    assert _machine(state, began)["state"] == "completed"
    assert _machine(state, began)["lastEventId"] == log.id(done)


def test_causation_into_another_workers_machine_falls_back_to_the_named_worker():
    log = RunLog("r")
    d = _decided(log, workers=("w1", "w2"))
    b1 = log.chain("dispatch.began", "w1", d)
    b2 = log.chain("dispatch.began", "w2", d)
    ok1 = log.chain("dispatch.succeeded", "w1", b2, childRunId="c1")  # caused by w2's began
    state, outputs = _fold_log(log)
    v = _only_violation(outputs, "wrong_causation")
    assert (v["eventId"], v["dispatchId"], v["workerId"]) == (log.id(ok1), log.id(b1), "w1")
    assert _machine(state, b1)["state"] == "running"
    assert _machine(state, b2)["state"] == "dispatching"


def test_cross_host_causation_is_not_judged():
    log = RunLog("r")
    d = _decided(log)
    log.chain("dispatch.began", "w1", d)
    log.chain("dispatch.succeeded", "w1", None, childRunId="c1", causationHostId="host-b")
    _, outputs = _fold_log(log)
    assert _violations(outputs) == []


@pytest.mark.parametrize("keys", [[], None])
def test_harvest_without_keys_is_harvest_without_mapping(keys):
    log = RunLog("r")
    d = _decided(log)
    b = log.chain("dispatch.began", "w1", d)
    ok = log.chain("dispatch.succeeded", "w1", b, childRunId="c1")
    done = log.chain("child.completed", "w1", ok, childRunId="c1")
    extra = {} if keys is None else {"harvestedKeys": keys}
    bad = log.chain("output.harvested", "w1", done, childRunId="c1", **extra)
    state, outputs = _fold_log(log)
    v = _only_violation(outputs, "harvest_without_mapping")
    assert (v["eventId"], v["phase"]) == (log.id(bad), "output.harvested")
    assert _machine(state, b)["state"] == "completed"


def test_phase_outside_the_enum_is_unknown_phase():
    log = RunLog("r")
    d = _decided(log)
    log.chain("dispatch.began", "w1", d)
    before, _ = _fold_log(log)
    bad = log.chain("dispatch.exploded", "w1", d)
    after, outputs = fold(before, log.docs[bad], handoff_mode="check")
    v = _only_violation(outputs, "unknown_phase")
    assert v["phase"] == "dispatch.exploded"
    assert after["handoffs"] == before["handoffs"]


def test_phase_for_a_worker_never_dispatched_is_unknown_dispatch():
    log = RunLog("r")
    d = _decided(log)
    bad = log.chain("dispatch.succeeded", "w9", d, childRunId="c9")
    state, outputs = _fold_log(log)
    v = _only_violation(outputs, "unknown_dispatch")
    assert (v["eventId"], v["workerId"], v["dispatchId"]) == (log.id(bad), "w9", None)
    assert state["handoffs"] == {}


@pytest.mark.parametrize(
    "payload_edit",
    [
        {"parentRunId": "someone-else"},
        {"workerId": ""},
        {"phase": None},
    ],
)
def test_malformed_chain_payload_is_invalid_chain_payload(payload_edit):
    log = RunLog("r")
    d = _decided(log)
    bad = log.chain("dispatch.began", "w1", d)
    log.docs[bad]["payload"].update(payload_edit)
    state, outputs = _fold_log(log)
    _only_violation(outputs, "invalid_chain_payload")
    assert state["handoffs"] == {}


def test_chain_payload_that_is_not_an_object():
    log = RunLog("r")
    _decided(log)
    log.add("core.workflowChain.event", ["dispatch.began"])
    _, outputs = _fold_log(log)
    _only_violation(outputs, "invalid_chain_payload")


def test_child_run_id_must_be_given_then_stay_the_same():
    log = RunLog("r")
    d = _decided(log)
    b = log.chain("dispatch.began", "w1", d)
    log.chain("dispatch.succeeded", "w1", b)  # no childRunId
    state, outputs = _fold_log(log)
    _only_violation(outputs, "invalid_chain_payload")
    assert _machine(state, b)["state"] == "dispatching"

    log = RunLog("r")
    d = _decided(log)
    b = log.chain("dispatch.began", "w1", d)
    ok = log.chain("dispatch.succeeded", "w1", b, childRunId="c1")
    log.chain("child.completed", "w1", ok, childRunId="c2")
    state, outputs = _fold_log(log)
    _only_violation(outputs, "invalid_chain_payload")
    assert _machine(state, b)["state"] == "running"


def test_every_violation_flags_the_run_in_order():
    log = RunLog("r")
    d = _decided(log)
    b = log.chain("dispatch.began", "w1", d)
    v1 = log.chain("child.completed", "w1", b, childRunId="c")   # illegal
    v2 = log.chain("bogus.phase", "w1", b)                       # unknown_phase
    v3 = log.chain("child.failed", "w7", b)                      # unknown_dispatch
    state, outputs = _fold_log(log)
    assert state["flags"] == [
        {"code": "illegal_transition", "eventId": log.id(v1), "sequence": v1},
        {"code": "unknown_phase", "eventId": log.id(v2), "sequence": v2},
        {"code": "unknown_dispatch", "eventId": log.id(v3), "sequence": v3},
    ]
    assert [v["code"] for v in _violations(outputs)] == [f["code"] for f in state["flags"]]


def test_same_worker_dispatched_again_under_a_later_decision_gets_a_new_machine():
    log = RunLog("r")
    d1 = _decided(log)
    b1 = log.chain("dispatch.began", "w1", d1)
    log.chain("dispatch.failed", "w1", b1)
    d2 = log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": {"nextWorkerIds": ["w1"]}})
    b2 = log.chain("dispatch.began", "w1", d2)
    ok2 = log.chain("dispatch.succeeded", "w1", b2, childRunId="c2")
    log.chain("child.completed", "w1", ok2, childRunId="c2")
    state, outputs = _fold_log(log)
    assert _violations(outputs) == []
    assert _machine(state, b1)["state"] == "failed"
    assert _machine(state, b2)["state"] == "completed"
    assert _machine(state, b2)["decidedEventId"] == log.id(d2)
