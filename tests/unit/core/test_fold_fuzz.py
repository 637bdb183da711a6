"""Whatever a (validated) envelope carries, the fold neither raises nor mutates, and stays hashable."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.core.fold import fold, state_hash
from agentlog.core.handoff import PHASES, derive_child_outcome

from .runs import realistic_run

_BASE = realistic_run("r1", "check")
_IDS = [d["eventId"] for d in _BASE] + ["nope"]
_WORKERS = ["worker-a", "worker-b", "worker-c", "w-new", ""]

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)

_chain_payload = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from([*PHASES, "weird.phase", ""]) | _json,
        "workerId": st.sampled_from(_WORKERS) | _json,
        "parentRunId": st.sampled_from(["r1", "r2"]),
        "childRunId": st.sampled_from(["r1.child-a", "r1.child-c", "zz"]) | _json,
        "harvestedKeys": st.lists(st.text(max_size=3), max_size=2) | _json,
        "error": _json,
        "causationHostId": st.sampled_from(["h2", ""]),
    },
)
_decided_payload = st.fixed_dictionaries(
    {"agentId": st.just("agent.planner")},
    optional={
        "decision": st.fixed_dictionaries(
            {},
            optional={
                "nextWorkerIds": st.lists(st.sampled_from(_WORKERS), max_size=3) | _json,
                "outputMapping": st.dictionaries(
                    st.sampled_from(_WORKERS + ["k"]),
                    st.text(max_size=3) | st.dictionaries(st.text(max_size=3), _json, max_size=2),
                    max_size=3,
                ) | _json,
            },
        ) | _json,
    },
)
_dispatched_payload = st.fixed_dictionaries(
    {},
    optional={
        "childRunId": st.text(max_size=4) | _json,
        "childWorkflowId": st.sampled_from(_WORKERS) | _json,
        "childStatus": st.sampled_from(["running", "failed", "rejected"]) | _json,
    },
)

_event = st.one_of(
    st.tuples(st.just("core.workflowChain.event"), _chain_payload | _json),
    st.tuples(st.just("runOrchestrator.decided"), _decided_payload),
    st.tuples(st.just("node.dispatched"), _dispatched_payload),
    st.tuples(st.sampled_from(["variable.changed", "channel.written", "run.started", "run.failed", "x.y"]), _json),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.integers(0, len(_BASE)),
    extra=st.lists(st.tuples(_event, st.sampled_from(_IDS) | st.none()), min_size=1, max_size=6),
    mode=st.sampled_from(["check", "derive", "auto"]),
)
def test_fold_is_total_and_pure(prefix, extra, mode):
    state = None
    for doc in _BASE[:prefix]:
        state, _ = fold(state, doc, handoff_mode=mode)
    for i, ((event_type, payload), cause) in enumerate(extra):
        doc = {"eventId": f"x{i}", "runId": "r1", "type": event_type, "payload": payload,
               "timestamp": "2025-01-15T10:00:00.000Z", "sequence": prefix + i}
        if cause is not None:
            doc["causationId"] = cause
        before = copy.deepcopy(state)
        new, outputs = fold(state, doc, handoff_mode=mode)
        assert state == before
        state_hash(new)  # stays canonicalisable
        for out in outputs:
            assert out["kind"] in ("transition", "violation", "link")
            if out["kind"] == "link":
                assert derive_child_outcome(out, {**doc, "runId": out["childRunId"], "type": "run.completed"})
        assert len(new["flags"]) == len(state["flags"] if state else []) + sum(
            1 for o in outputs if o["kind"] == "violation"
        )
        state = new
