"""The topic record shapes (agentlog.schemas.records): each builder gives the contract's bytes, and the producers use them.

The expected records are written out by hand from CONTRACT.md: a redelivered record is
deduplicated by byte identity and stores of the same log format must stay readable, so a
builder may not add, drop or retype a key.
Comparing JCS bytes as well as dicts catches what ``==`` forgives (``True == 1``).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.core.fold import fold_all
from agentlog.core.handoff import derive_child_outcome, join
from agentlog.core.runstate import TERMINAL_TYPES, advance, chain_problem
from agentlog.core.sequencing import RAW_MAX_BYTES, Source, decide, rejection_record
from agentlog.replay.compare import compare_runs
from agentlog.replay.host import error_record, verdict_record
from agentlog.schemas.canonical import GENESIS, chain_hash, jcs
from agentlog.schemas.errors import LogFormatError
from agentlog.schemas.records import (
    CommittedEvent,
    RecordSource,
    Rejection,
    RunSnapshot,
    Transition,
    Verdict,
    Violation,
    committed_event,
    log_format_error,
    record_source,
    rejection,
    run_snapshot,
    transition,
    verdict,
    violation,
)
from tests.unit.core.runs import RunLog, child_runs, realistic_run
from tests.unit.replay.runs import as_replay, llm_run

H1 = "1" * 64
H2 = "2" * 64


def _same(actual: Any, expected: dict[str, Any]) -> None:
    assert actual == expected
    assert jcs(actual) == jcs(expected)


# --------------------------------------------------------------------------- builders


def test_record_source():
    _same(record_source(topic="agentlog.ingest", partition=0, offset=17, timestamp_ms=1700000000000),
          {"topic": "agentlog.ingest", "partition": 0, "offset": 17, "timestampMs": 1700000000000})


def test_committed_event_before_its_fold():
    # The sequencer's decision: made before the fold, never written to the log as it is.
    doc = {"eventId": "e1", "runId": "r1", "type": "run.started", "payload": {}, "timestamp": "2025-01-15T10:00:00.000Z",
           "sequence": 0}
    source = {"topic": "agentlog.ingest", "partition": 2, "offset": 5, "timestampMs": 1700000000001}
    _same(committed_event(doc=doc, prev_hash=GENESIS, hash=H1, source=source),
          {"doc": {"eventId": "e1", "runId": "r1", "type": "run.started", "payload": {},
                   "timestamp": "2025-01-15T10:00:00.000Z", "sequence": 0},
           "prevHash": "0000000000000000000000000000000000000000000000000000000000000000",
           "hash": "1111111111111111111111111111111111111111111111111111111111111111",
           "source": {"topic": "agentlog.ingest", "partition": 2, "offset": 5, "timestampMs": 1700000000001}})


def test_committed_event_carries_the_state_hash():
    doc = {"eventId": "e1", "runId": "r1", "type": "run.started", "payload": {}, "timestamp": "2025-01-15T10:00:00.000Z",
           "sequence": 0}
    source = {"topic": "agentlog.ingest", "partition": 2, "offset": 5, "timestampMs": 1700000000001}
    _same(committed_event(doc=doc, prev_hash=GENESIS, hash=H1, source=source, state_hash="2" * 64),
          {"doc": {"eventId": "e1", "runId": "r1", "type": "run.started", "payload": {},
                   "timestamp": "2025-01-15T10:00:00.000Z", "sequence": 0},
           "prevHash": "0000000000000000000000000000000000000000000000000000000000000000",
           "hash": "1111111111111111111111111111111111111111111111111111111111111111",
           "source": {"topic": "agentlog.ingest", "partition": 2, "offset": 5, "timestampMs": 1700000000001},
           "stateHash": "2222222222222222222222222222222222222222222222222222222222222222"})


def test_rejection_of_a_whole_value_has_no_truncation_keys():
    source = {"topic": "agentlog.ingest", "partition": 1, "offset": 9, "timestampMs": 3}
    _same(rejection(reason="sequence_gap", detail="run r1: expected sequence 4, got 6", run_id="r1", event_id="e6",
                    sequence=6, source=source, raw="eyJhIjoxfQ=="),
          {"reason": "sequence_gap", "detail": "run r1: expected sequence 4, got 6", "runId": "r1", "eventId": "e6",
           "sequence": 6, "source": {"topic": "agentlog.ingest", "partition": 1, "offset": 9, "timestampMs": 3},
           "raw": "eyJhIjoxfQ=="})


def test_rejection_of_an_undecodable_value_has_null_ids():
    source = {"topic": "agentlog.ingest", "partition": 0, "offset": 0, "timestampMs": 0}
    _same(rejection(reason="decode_error", detail="not JSON", run_id=None, event_id=None, sequence=None,
                    source=source, raw="AAE="),
          {"reason": "decode_error", "detail": "not JSON", "runId": None, "eventId": None, "sequence": None,
           "source": {"topic": "agentlog.ingest", "partition": 0, "offset": 0, "timestampMs": 0}, "raw": "AAE="})


def test_rejection_of_a_truncated_value_says_so():
    source = {"topic": "agentlog.ingest", "partition": 0, "offset": 3, "timestampMs": 4}
    _same(rejection(reason="oversize", detail="too big", run_id="r1", event_id=None, sequence=None, source=source,
                    raw="eHh4", raw_bytes=300000, raw_sha256="ab" * 32),
          {"reason": "oversize", "detail": "too big", "runId": "r1", "eventId": None, "sequence": None,
           "source": {"topic": "agentlog.ingest", "partition": 0, "offset": 3, "timestampMs": 4}, "raw": "eHh4",
           "rawTruncated": True, "rawBytes": 300000,
           "rawSha256": "abababababababababababababababababababababababababababababababab"})


@pytest.mark.parametrize("half", [{"raw_bytes": 300000}, {"raw_sha256": "ab" * 32}])
def test_rejection_refuses_half_a_truncation(half):
    source = {"topic": "t", "partition": 0, "offset": 0, "timestampMs": 0}
    with pytest.raises(TypeError, match="together"):
        rejection(reason="oversize", detail="x", run_id=None, event_id=None, sequence=None, source=source, raw="",
                  **half)


def test_checked_transition():
    _same(transition(parent_run_id="r1", worker_id="worker-a", dispatch_id="r1:0004", child_run_id="r1.child-a",
                     phase="output.harvested", from_state="completed", to_state="harvested", event_id="r1:0011",
                     causation_id="r1:0010", sequence=11, derived=False, timestamp="2025-01-15T10:00:11.000Z",
                     harvested_keys=["parentResult"]),
          {"parentRunId": "r1", "workerId": "worker-a", "dispatchId": "r1:0004", "childRunId": "r1.child-a",
           "phase": "output.harvested", "from": "completed", "to": "harvested", "eventId": "r1:0011",
           "causationId": "r1:0010", "sequence": 11, "derived": False, "timestamp": "2025-01-15T10:00:11.000Z",
           "harvestedKeys": ["parentResult"], "error": None})


def test_derived_transition_keeps_null_keys():
    _same(transition(parent_run_id="r1", worker_id="worker-b", dispatch_id="d-began", child_run_id=None,
                     phase="dispatch.failed", from_state="dispatching", to_state="failed", event_id="d-failed",
                     causation_id="d-began", sequence=None, derived=True, timestamp="2025-01-15T10:00:05.000Z",
                     error={"code": "dispatch_failed", "message": "child run was not created"}),
          {"parentRunId": "r1", "workerId": "worker-b", "dispatchId": "d-began", "childRunId": None,
           "phase": "dispatch.failed", "from": "dispatching", "to": "failed", "eventId": "d-failed",
           "causationId": "d-began", "sequence": None, "derived": True, "timestamp": "2025-01-15T10:00:05.000Z",
           "harvestedKeys": None, "error": {"code": "dispatch_failed", "message": "child run was not created"}})


def test_handoff_violation():
    _same(violation(run_id="r1", code="illegal_transition", detail="child.completed needs state 'running'",
                    event_id="r1:0003", sequence=3, worker_id="w1", phase="child.completed", dispatch_id="r1:0002"),
          {"runId": "r1", "code": "illegal_transition", "detail": "child.completed needs state 'running'",
           "eventId": "r1:0003", "sequence": 3, "workerId": "w1", "phase": "child.completed",
           "dispatchId": "r1:0002"})


def test_chain_violation_keeps_null_handoff_keys():
    _same(violation(run_id="r1", code="log_gap", detail="committed log jumps from sequence 2 to 4",
                    event_id="r1:0004", sequence=4),
          {"runId": "r1", "code": "log_gap", "detail": "committed log jumps from sequence 2 to 4",
           "eventId": "r1:0004", "sequence": 4, "workerId": None, "phase": None, "dispatchId": None})


def test_run_snapshot():
    state = {"status": "running", "variables": {"goal": "g"}, "channels": {}}
    _same(run_snapshot(run_id="r1", at_sequence=6, log_partition=2, log_offset=41, state=state, state_hash=H1,
                       head_hash=H2),
          {"runId": "r1", "atSequence": 6, "logPartition": 2, "logOffset": 41,
           "state": {"status": "running", "variables": {"goal": "g"}, "channels": {}},
           "stateHash": "1111111111111111111111111111111111111111111111111111111111111111",
           "headHash": "2222222222222222222222222222222222222222222222222222222222222222"})


def test_verdict_without_binding_diff_or_detail():
    events = [{"type": "replay.diverged", "payload": {"sourceRunId": "r1", "atSequence": 7}}]
    first = {"atSequence": 7, "kind": "output", "originalEventId": "e7", "path": "payload.result",
             "expected": 1, "actual": 2}
    expected = {"replayRunId": "r1.replay", "sourceRunId": "r1", "mode": "verify", "verdict": "diverged",
                "errorCode": "replay_diverged",
                "firstDivergence": {"atSequence": 7, "kind": "output", "originalEventId": "e7",
                                    "path": "payload.result", "expected": 1, "actual": 2},
                "events": [{"type": "replay.diverged", "payload": {"sourceRunId": "r1", "atSequence": 7}}],
                "comparedThrough": 7}
    for binding_diff in (None, {}):  # an empty diff is no diff: the key stays out
        _same(verdict(replay_run_id="r1.replay", source_run_id="r1", mode="verify", verdict="diverged",
                      error_code="replay_diverged", first_divergence=first, events=events, compared_through=7,
                      binding_diff=binding_diff), expected)


def test_what_if_verdict_names_the_differing_bindings():
    _same(verdict(replay_run_id="r1.w", source_run_id="r1", mode="live", verdict="what-if", error_code=None,
                  first_divergence=None, events=[], compared_through=12,
                  binding_diff={"modeVersion": {"expected": "m1", "actual": "m2"}}),
          {"replayRunId": "r1.w", "sourceRunId": "r1", "mode": "live", "verdict": "what-if", "errorCode": None,
           "firstDivergence": None, "events": [], "comparedThrough": 12,
           "bindingDiff": {"modeVersion": {"expected": "m1", "actual": "m2"}}})


def test_error_verdict_says_why():
    _same(verdict(replay_run_id="r1.replay", source_run_id=None, mode="live", verdict="error",
                  error_code="replay_source_missing", first_divergence=None, events=[], compared_through=None,
                  detail="the committed log holds no events of source run None"),
          {"replayRunId": "r1.replay", "sourceRunId": None, "mode": "live", "verdict": "error",
           "errorCode": "replay_source_missing", "detail": "the committed log holds no events of source run None",
           "firstDivergence": None, "events": [], "comparedThrough": None})


def test_a_log_record_without_a_state_hash_is_log_format_1():
    err = log_format_error({"doc": {"runId": "r1", "sequence": 4}, "prevHash": GENESIS, "hash": H1},
                           partition=2, offset=17)
    assert isinstance(err, LogFormatError) and err.code == "log_format_unsupported"
    assert str(err) == ("log record run r1, sequence 4, log offset 17 in partition 2: this log was written by an "
                        "agentlog before 0.2 (log format 1, records without stateHash); re-ingest its runs with "
                        "`agentlog publish` from an export made with that version")
    assert str(log_format_error({"doc": "?"})).startswith("a log record: this log was written by an agentlog before 0.2")


def test_optional_keys_are_declared_optional():
    # Python 3.11 loses NotRequired in a class-form TypedDict under postponed annotations; this pins the fix.
    assert Rejection.__optional_keys__ == {"rawTruncated", "rawBytes", "rawSha256"}
    assert Verdict.__optional_keys__ == {"bindingDiff", "detail", "reordered", "path"}
    # On every log record; absent only from the sequencer's decision, made before the fold.
    assert CommittedEvent.__optional_keys__ == {"stateHash"}
    for shape in (RecordSource, Transition, Violation, RunSnapshot):
        assert shape.__optional_keys__ == frozenset(), shape.__name__


# --------------------------------------------------------------------------- producers


def _check_keys(shape: Any, record: dict[str, Any]) -> None:
    """Every required key of ``shape`` is present, and no key it does not declare."""
    keys = set(record)
    assert shape.__required_keys__ <= keys, (shape.__name__, shape.__required_keys__ - keys)
    assert keys <= shape.__required_keys__ | shape.__optional_keys__, (
        shape.__name__, keys - shape.__required_keys__ - shape.__optional_keys__)


def _untagged(outputs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in o.items() if k != "kind"} for o in outputs if o["kind"] == kind]


def _violating_run() -> list[dict[str, Any]]:
    """A check-mode run whose chain events break every kind of rule the fold reports."""
    log = RunLog("bad")
    d = log.add("runOrchestrator.decided", {"agentId": "p", "decision": {"kind": "next-worker", "nextWorkerIds": ["w1"]}})
    began = log.chain("dispatch.began", "w1", d)
    log.chain("child.completed", "w1", began, childRunId="c1")  # illegal_transition
    log.chain("dispatch.teleported", "w1", began)  # unknown_phase
    log.chain("dispatch.succeeded", "w9", began, childRunId="c9")  # unknown_dispatch
    log.chain("dispatch.succeeded", "w1", d, childRunId="c1")  # wrong_causation (applied)
    log.add("core.workflowChain.event", {"phase": "dispatch.began"})  # invalid_chain_payload
    log.add("node.dispatched", {"childRunId": "c2", "childWorkflowId": "w2"})  # derive: unknown_dispatch
    return log.docs


def test_fold_outputs_have_the_transition_and_violation_keys():
    runs = [realistic_run("run-1", "check"), realistic_run("run-1", "derive"), _violating_run()]
    seen: dict[str, set[str]] = {"transition": set(), "violation": set()}
    for docs in runs:
        for mode in ("check", "derive", "auto"):
            _, outputs = fold_all(docs, handoff_mode=mode)
            for t in _untagged(outputs, "transition"):
                _check_keys(Transition, t)
                seen["transition"].add(t["phase"])
            for v in _untagged(outputs, "violation"):
                _check_keys(Violation, v)
                seen["violation"].add(v["code"])
    assert seen["violation"] >= {"illegal_transition", "unknown_phase", "unknown_dispatch", "wrong_causation",
                                 "invalid_chain_payload"}
    assert {"dispatch.began", "dispatch.succeeded", "dispatch.failed", "child.completed",
            "output.harvested", "child.cancelled"} <= seen["transition"]


def test_derived_child_outcomes_have_the_transition_keys():
    _, outputs = fold_all(realistic_run("run-1", "derive"), handoff_mode="derive")
    children = child_runs("run-1")
    phases = set()
    for link in _untagged(outputs, "link"):
        record = None
        for child_event in children.get(link["childRunId"], []):
            for t in derive_child_outcome(link, child_event):
                assert t["kind"] == "transition"
                _check_keys(Transition, {k: v for k, v in t.items() if k != "kind"})
            if child_event["type"] in TERMINAL_TYPES:  # the only child events the run-state agent forwards
                record, _ = join(record, {"kind": "child-terminal", "event": child_event})
        record, joined = join(record, {"kind": "link", "link": link})
        for t in joined:
            _check_keys(Transition, t)
            phases.add(t["phase"])
    assert {"child.completed", "output.harvested", "child.cancelled"} <= phases


def test_sequencer_records_have_their_shapes():
    docs = realistic_run("run-1", "check")
    head, index = None, {}
    for offset, doc in enumerate(docs):
        decision = decide(head, index.get, doc, Source("agentlog.ingest", 0, offset, 1700000000000))
        _check_keys(CommittedEvent, decision.committed)
        _check_keys(RecordSource, decision.committed["source"])
        head = decision.head
        index[decision.index_entry[0]] = decision.index_entry[1]
    whole = rejection_record("sequence_gap", "gap", b'{"a":1}', Source("agentlog.ingest", 1, 9, 3),
                             {"runId": "r1", "eventId": "e6", "sequence": 6})
    _same(whole, {"reason": "sequence_gap", "detail": "gap", "runId": "r1", "eventId": "e6", "sequence": 6,
                  "source": {"topic": "agentlog.ingest", "partition": 1, "offset": 9, "timestampMs": 3},
                  "raw": "eyJhIjoxfQ=="})
    truncated = rejection_record("oversize", "too big", b"{" + b"x" * RAW_MAX_BYTES, Source("t", 0, 1, 0))
    _check_keys(Rejection, truncated)
    assert set(truncated) == Rejection.__required_keys__ | Rejection.__optional_keys__


def test_run_state_records_have_their_shapes():
    docs = realistic_run("run-1", "check")
    record, head = None, GENESIS
    sent: dict[str, int] = {}
    shapes = {"transitions": Transition, "violations": Violation}
    for doc in docs:
        h = chain_hash(head, doc)
        adv = advance(record, doc, h, snapshot_every=4, handoff_mode="auto")
        record, head = adv.record, h
        for short, _, value in adv.sends:
            if short in shapes:
                _check_keys(shapes[short], dict(value))
                sent[short] = sent.get(short, 0) + 1
    assert set(sent) == {"transitions"}
    # The live log check's violation for a record whose doc does not hash to its hash.
    rewritten = {"doc": docs[-1], "prevHash": H1, "hash": H2, "stateHash": H1,
                 "source": {"topic": "agentlog.ingest", "partition": 0, "offset": 9, "timestampMs": 0}}
    problem = chain_problem(rewritten)
    assert problem is not None and problem["code"] == "hash_chain_broken"
    _check_keys(Violation, dict(problem))


def test_host_verdicts_have_the_verdict_keys():
    original = llm_run("run-1")
    request = {"replayRunId": "run-1.r", "sourceRunId": "run-1", "mode": "verify"}
    match = verdict_record(request, compare_runs(original, as_replay(original, replay_run_id="run-1.r")))
    _check_keys(Verdict, match)
    assert "bindingDiff" not in match and "detail" not in match
    what_if_run = as_replay(original, replay_run_id="run-1.w")
    what_if_run[0]["payload"]["bindings"] = {"modeVersion": "other"}
    what_if = verdict_record({**request, "replayRunId": "run-1.w"}, compare_runs(original, what_if_run))
    _check_keys(Verdict, what_if)
    assert what_if["verdict"] == "what-if" and "bindingDiff" in what_if
    error = error_record({"replayRunId": "x"}, "replay_source_missing", "nothing to compare")
    _same(error, {"replayRunId": "x", "sourceRunId": None, "mode": "live", "verdict": "error",
                  "errorCode": "replay_source_missing", "detail": "nothing to compare", "firstDivergence": None,
                  "events": [], "comparedThrough": None})
