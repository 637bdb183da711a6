"""Derive mode: the host emits only decided / node.dispatched / child run.*; we derive the chain."""

from __future__ import annotations

import uuid

import pytest

from agentlog.core.fold import fold_all
from agentlog.core.handoff import HandoffError, derive_child_outcome

from .runs import RunLog, child_run_id, child_runs, event_id, realistic_run

RUN = "run-1"
#: Frozen in CONTRACT.md; written out here so a change to the constant fails this suite.
NAMESPACE = uuid.UUID("07f2212c-18f2-48e4-87db-3c6f23603576")


def _id(decided_seq: int, worker: str, phase: str, run: str = RUN) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{run}/{event_id(run, decided_seq)}/{worker}/{phase}"))


def _kind(outputs, kind):
    return [o for o in outputs if o["kind"] == kind]


def _derive_everything(run_id: str = RUN, mode: str = "derive", children=None):
    """Parent fold + the link joiner fed with each child's events: all transitions, in emission order."""
    state, outputs = fold_all(realistic_run(run_id, "derive"), handoff_mode=mode)
    children = child_runs(run_id) if children is None else children
    transitions = _kind(outputs, "transition")
    for link in _kind(outputs, "link"):
        for child_event in children.get(link["childRunId"], []):
            transitions += derive_child_outcome(link, child_event)
    return state, outputs, transitions


def _chains(transitions):
    chains: dict[str, list[dict]] = {}
    for t in transitions:
        chains.setdefault(t["workerId"], []).append(t)
    return chains


@pytest.mark.parametrize("mode", ["derive", "auto"])
def test_realistic_run_derives_exact_transitions(mode):
    state, outputs, transitions = _derive_everything(mode=mode)
    assert _kind(outputs, "violation") == []
    rows = [(t["workerId"], t["phase"], t["from"], t["to"], t["eventId"], t["causationId"]) for t in transitions]
    a_began, a_ok = _id(2, "worker-a", "dispatch.began"), _id(2, "worker-a", "dispatch.succeeded")
    b_began = _id(2, "worker-b", "dispatch.began")
    c_began, c_ok = _id(8, "worker-c", "dispatch.began"), _id(8, "worker-c", "dispatch.succeeded")
    a_done = _id(2, "worker-a", "child.completed")
    assert rows == [
        ("worker-a", "dispatch.began", "pending", "dispatching", a_began, event_id(RUN, 2)),
        ("worker-a", "dispatch.succeeded", "dispatching", "running", a_ok, a_began),
        ("worker-b", "dispatch.began", "pending", "dispatching", b_began, event_id(RUN, 2)),
        ("worker-b", "dispatch.failed", "dispatching", "failed", _id(2, "worker-b", "dispatch.failed"), b_began),
        ("worker-c", "dispatch.began", "pending", "dispatching", c_began, event_id(RUN, 8)),
        ("worker-c", "dispatch.succeeded", "dispatching", "running", c_ok, c_began),
        ("worker-a", "child.completed", "running", "completed", a_done, a_ok),
        ("worker-a", "output.harvested", "completed", "harvested", _id(2, "worker-a", "output.harvested"), a_done),
        ("worker-c", "child.cancelled", "running", "cancelled", _id(8, "worker-c", "child.cancelled"), c_ok),
    ]
    assert all(t["derived"] is True and t["sequence"] is None for t in transitions)
    # Parent-side transitions carry the node.dispatched timestamp, child-side ones the child's terminal event's.
    assert transitions[0]["timestamp"] == realistic_run(RUN, "derive")[4]["timestamp"]
    assert transitions[6]["timestamp"] == child_runs(RUN)[child_run_id(RUN, "a")][-1]["timestamp"]
    # The parent state keeps what the parent log proves: the children still run there.
    assert {m["workerId"]: m["state"] for m in state["handoffs"].values()} == {
        "worker-a": "running", "worker-b": "failed", "worker-c": "running",
    }
    assert all(m["derived"] for m in state["handoffs"].values())


def test_links_name_the_join():
    _, outputs, _ = _derive_everything()
    assert _kind(outputs, "link") == [
        {"kind": "link", "parentRunId": RUN, "workerId": "worker-a", "dispatchId": _id(2, "worker-a", "dispatch.began"),
         "childRunId": child_run_id(RUN, "a"), "succeededEventId": _id(2, "worker-a", "dispatch.succeeded"),
         "harvestKeys": ["parentResult"], "decidedEventId": event_id(RUN, 2)},
        {"kind": "link", "parentRunId": RUN, "workerId": "worker-c", "dispatchId": _id(8, "worker-c", "dispatch.began"),
         "childRunId": child_run_id(RUN, "c"), "succeededEventId": _id(8, "worker-c", "dispatch.succeeded"),
         "harvestKeys": ["cSummary"], "decidedEventId": event_id(RUN, 8)},
    ]


def test_upstream_conformance_happy_path():
    """RFC 0037: exactly 4 chain events, each caused by the previous, the first by the decision."""
    _, _, transitions = _derive_everything()
    happy = _chains(transitions)["worker-a"]
    assert [t["phase"] for t in happy] == ["dispatch.began", "dispatch.succeeded", "child.completed", "output.harvested"]
    assert happy[0]["causationId"] == event_id(RUN, 2)
    assert realistic_run(RUN, "derive")[2]["type"] == "runOrchestrator.decided"
    assert [t["causationId"] for t in happy[1:]] == [t["eventId"] for t in happy[:-1]]
    assert happy[-1]["harvestedKeys"] == ["parentResult"]
    assert {t["dispatchId"] for t in happy} == {happy[0]["eventId"]}


def test_upstream_conformance_child_failure_path():
    children = child_runs(RUN)
    a = child_run_id(RUN, "a")
    log = RunLog(a)
    log.add("run.started", {})
    log.add("run.failed", {"error": {"code": "tool_error", "message": "search tool timed out"}})
    children[a] = log.docs
    _, _, transitions = _derive_everything(children=children)
    chain = _chains(transitions)["worker-a"]
    assert [t["phase"] for t in chain] == ["dispatch.began", "dispatch.succeeded", "child.failed"]
    assert chain[2]["causationId"] == chain[1]["eventId"]
    assert chain[2]["error"] == {"code": "tool_error", "message": "search tool timed out"}
    assert not any(t["phase"] == "output.harvested" for t in transitions)


def test_upstream_conformance_dispatch_failure_path():
    _, outputs, transitions = _derive_everything()
    chain = _chains(transitions)["worker-b"]
    assert [t["phase"] for t in chain] == ["dispatch.began", "dispatch.failed"]
    assert chain[1]["causationId"] == chain[0]["eventId"]
    assert chain[1]["childRunId"] is None
    assert chain[1]["error"]["code"] == "dispatch_failed"
    assert not any(link["workerId"] == "worker-b" for link in _kind(outputs, "link"))


def test_cancelled_child_is_not_harvested_even_with_a_mapping():
    _, _, transitions = _derive_everything()
    assert [t["phase"] for t in _chains(transitions)["worker-c"]] == [
        "dispatch.began", "dispatch.succeeded", "child.cancelled",
    ]


def test_derived_ids_are_the_same_on_every_refold():
    first = _derive_everything()
    second = _derive_everything()
    assert first == second
    other = _derive_everything(run_id="run-2")
    assert {t["eventId"] for t in first[2]}.isdisjoint({t["eventId"] for t in other[2]})


def test_derive_mode_on_a_checking_host_derives_and_still_checks():
    state, outputs = fold_all(realistic_run(RUN, "check"), handoff_mode="derive")
    assert _kind(outputs, "violation") == []
    derived = [t for t in _kind(outputs, "transition") if t["derived"]]
    checked = [t for t in _kind(outputs, "transition") if not t["derived"]]
    assert len(checked) == 9
    # node.dispatched at seq 6 (worker-a) and 16 (worker-c): began + succeeded each.
    assert [(t["workerId"], t["phase"]) for t in derived] == [
        ("worker-a", "dispatch.began"), ("worker-a", "dispatch.succeeded"),
        ("worker-c", "dispatch.began"), ("worker-c", "dispatch.succeeded"),
    ]
    assert len(state["handoffs"]) == 5


def test_auto_derives_again_after_a_new_decision_without_host_chain_events():
    log = RunLog("r")
    log.add("run.started", {})
    d1 = log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": {"nextWorkerIds": ["w1"]}})
    log.chain("dispatch.began", "w1", d1)
    log.add("node.dispatched", {"childRunId": "c1", "childWorkflowId": "w1"})  # host speaks: no derive
    d2 = log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": {"nextWorkerIds": ["w1"]}})
    log.add("node.dispatched", {"childRunId": "c2", "childWorkflowId": "w1"})  # silent under d2: derive
    _, outputs = fold_all(log.docs, handoff_mode="auto")
    derived = [t for t in _kind(outputs, "transition") if t["derived"]]
    assert [(t["phase"], t["causationId"]) for t in derived] == [
        ("dispatch.began", log.id(d2)),
        ("dispatch.succeeded", derived[0]["eventId"]),
    ]


def test_check_mode_never_derives():
    _, outputs = fold_all(realistic_run(RUN, "derive"), handoff_mode="check")
    assert outputs == []


@pytest.mark.parametrize("status", ["failed", "dispatch_failed", "rejected"])
def test_every_failed_child_status_fails_the_dispatch(status):
    log = RunLog("r")
    d = log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": {"nextWorkerIds": ["w1"]}})
    log.add("node.dispatched", {"childRunId": "c1", "childWorkflowId": "w1", "childStatus": status})
    state, outputs = fold_all(log.docs, handoff_mode="derive")
    assert [t["phase"] for t in _kind(outputs, "transition")] == ["dispatch.began", "dispatch.failed"]
    assert _kind(outputs, "link") == []
    (machine,) = state["handoffs"].values()
    assert (machine["state"], machine["decidedEventId"]) == ("failed", log.id(d))


def test_dispatch_without_a_decision_is_unknown_dispatch():
    log = RunLog("r")
    log.add("run.started", {})
    log.add("node.dispatched", {"childRunId": "c1", "childWorkflowId": "w1"})
    state, outputs = fold_all(log.docs, handoff_mode="derive")
    assert [o["code"] for o in _kind(outputs, "violation")] == ["unknown_dispatch"]
    assert _kind(outputs, "transition") == []
    assert state["handoffs"] == {} and state["flags"][0]["code"] == "unknown_dispatch"


def test_same_worker_twice_under_one_decision_is_illegal():
    log = RunLog("r")
    log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": {"nextWorkerIds": ["w1"]}})
    log.add("node.dispatched", {"childRunId": "c1", "childWorkflowId": "w1"})
    again = log.add("node.dispatched", {"childRunId": "c2", "childWorkflowId": "w1"})
    state, outputs = fold_all(log.docs, handoff_mode="derive")
    (v,) = _kind(outputs, "violation")
    assert (v["code"], v["eventId"]) == ("illegal_transition", log.id(again))
    (machine,) = state["handoffs"].values()
    assert machine["childRunId"] == "c1"


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"w1": {"a": "pa", "b": "pb"}, "w2": {"x": "px"}}, {"w1": ["pa", "pb"], "w2": ["px"]}),
        ({"out": "shared", "more": "also"}, {"w1": ["also", "shared"], "w2": ["also", "shared"]}),
        ({"w1": {"a": "pa"}}, {"w1": ["pa"], "w2": []}),
        ({}, {"w1": [], "w2": []}),
        (None, {"w1": [], "w2": []}),
    ],
)
def test_output_mapping_per_worker_or_flat(mapping, expected):
    log = RunLog("r")
    decision = {"nextWorkerIds": ["w1", "w2"]}
    if mapping is not None:
        decision["outputMapping"] = mapping
    log.add("runOrchestrator.decided", {"agentId": "agent.planner", "decision": decision})
    log.add("node.dispatched", {"childRunId": "c1", "childWorkflowId": "w1"})
    log.add("node.dispatched", {"childRunId": "c2", "childWorkflowId": "w2"})
    _, outputs = fold_all(log.docs, handoff_mode="derive")
    links = {link["workerId"]: link for link in _kind(outputs, "link")}
    assert {w: link["harvestKeys"] for w, link in links.items()} == expected
    done = {"eventId": "x", "runId": "c1", "type": "run.completed", "payload": {}, "timestamp": "t", "sequence": 3}
    phases = [t["phase"] for t in derive_child_outcome(links["w1"], done)]
    assert phases == (["child.completed", "output.harvested"] if expected["w1"] else ["child.completed"])


def test_derive_child_outcome_ignores_non_terminal_events_and_refuses_foreign_runs():
    _, outputs = fold_all(realistic_run(RUN, "derive"), handoff_mode="derive")
    link = _kind(outputs, "link")[0]
    started = child_runs(RUN)[link["childRunId"]][0]
    assert derive_child_outcome(link, started) == []
    foreign = {**child_runs(RUN)[link["childRunId"]][-1], "runId": "somebody-else"}
    with pytest.raises(HandoffError):
        derive_child_outcome(link, foreign)
