"""The run-state step (``processors.core.runstate.step``) without a broker.

One committed log record in, the run's new table record and the records to send out: the
digest of every event, snapshots every N events and at a terminal status, and the live checks of
the committed log (``log_gap``, ``hash_chain_broken``). Hashes are computed here with
``schemas.canonical.chain_hash`` and with ``hashlib`` over ``rfc8785`` (the JCS reference
implementation), and states are written by hand from CONTRACT.md's ``initial_state``, never taken
from the step itself.
"""

from __future__ import annotations

import copy
import hashlib
import uuid

import rfc8785

from processors.core.runstate import refold_due, step
from schemas.canonical import GENESIS, chain_hash

T = "2025-01-15T10:00:00.000Z"


def _run_id() -> str:
    # The step keeps a per-run memo of incremental state hashers: a fresh id per test keeps tests independent.
    return f"rs-{uuid.uuid4().hex[:8]}"


def _state(status: str = "running", variables: dict | None = None, bindings: dict | None = None,
           flags: list | None = None) -> dict:
    """CONTRACT.md's initial_state with the fields these runs change."""
    return {"status": status, "variables": variables or {}, "channels": {}, "handoffs": {},
            "bindings": bindings or {}, "flags": flags or [], "replayOf": None, "decisions": {},
            "lastDecision": {}, "lastDispatch": {}, "chainEvents": {}, "hostChain": {}}


def _hash_state(state: dict) -> str:
    return hashlib.sha256(rfc8785.dumps(state)).hexdigest()


def _docs(run_id: str, n_vars: int = 3, *, end: str | None = None) -> list[dict]:
    docs = [{"eventId": f"{run_id}:0", "runId": run_id, "type": "run.started",
             "payload": {"bindings": {"engineVersion": "1.4.0"}}, "timestamp": T, "sequence": 0}]
    for i in range(1, n_vars + 1):
        docs.append({"eventId": f"{run_id}:{i}", "runId": run_id, "type": "variable.changed",
                     "payload": {"name": f"v{i}", "value": i * 10}, "timestamp": T, "sequence": i,
                     "causationId": f"{run_id}:{i - 1}"})
    if end:
        n = len(docs)
        docs.append({"eventId": f"{run_id}:{n}", "runId": run_id, "type": end,
                     "payload": {"status": end.split(".")[1]}, "timestamp": T, "sequence": n})
    return docs


def _committed(docs: list[dict]) -> list[dict]:
    """The log records the sequencer would write: a hash chain from GENESIS."""
    out, prev = [], GENESIS
    for doc in docs:
        h = chain_hash(prev, doc)
        out.append({"doc": doc, "prevHash": prev, "hash": h,
                    "source": {"topic": "t.ingest", "partition": 0, "offset": doc["sequence"], "timestampMs": 0}})
        prev = h
    return out


def _step(record, committed, offset, *, every=100):
    return step(record, committed, partition=3, offset=offset, snapshot_every=every, handoff_mode="auto")


def _violations(sends) -> list[dict]:
    return [v for topic, _, v in sends if topic == "violations"]


def test_first_event_starts_the_run_and_sends_its_digest():
    run_id = _run_id()
    log = _committed(_docs(run_id, 0))
    record, sends = _step(None, log[0], 100)
    state = _state(bindings={"engineVersion": "1.4.0"})
    assert record == {"state": state, "next": 1, "head": log[0]["hash"], "since": 1}
    assert sends == [("digests", run_id, {"runId": run_id, "sequence": 0, "stateHash": _hash_state(state),
                                          "headHash": chain_hash(GENESIS, log[0]["doc"]),
                                          "logPartition": 3, "logOffset": 100})]


def test_contiguous_events_fold_and_chain():
    run_id = _run_id()
    log = _committed(_docs(run_id, 3))
    record, digests = None, []
    for i, committed in enumerate(log):
        record, sends = _step(record, committed, 200 + i)
        assert _violations(sends) == []
        digests += [v for topic, key, v in sends if topic == "digests" and key == run_id]
    variables = {"v1": 10, "v2": 20, "v3": 30}
    state = _state(variables=variables, bindings={"engineVersion": "1.4.0"})
    assert record == {"state": state, "next": 4, "head": log[3]["hash"], "since": 4}
    assert [(d["sequence"], d["headHash"], d["logOffset"]) for d in digests] == [
        (i, c["hash"], 200 + i) for i, c in enumerate(log)]
    assert digests[1]["stateHash"] == _hash_state(_state(variables={"v1": 10}, bindings={"engineVersion": "1.4.0"}))
    assert digests[-1]["stateHash"] == _hash_state(state)


def _through(log: list[dict], n: int, every: int = 100) -> dict:
    record = None
    for i, committed in enumerate(log[:n]):
        record, _ = _step(record, committed, i, every=every)
    return record


def test_a_skipped_sequence_is_a_log_gap_and_the_run_goes_on():
    run_id = _run_id()
    docs = _docs(run_id, 3)
    record = _through(_committed(docs), 1)
    for missing, seq in ((1, 2), (2, 3)):  # one sequence skipped, two skipped
        # Chained on sequence 0, as a sequencer that lost the ones in between would have written it.
        gap = {"doc": docs[seq], "prevHash": record["head"], "hash": chain_hash(record["head"], docs[seq]),
               "source": {}}
        new, sends = _step(record, gap, 9)
        assert _violations(sends) == [{"runId": run_id, "code": "log_gap",
                                       "detail": f"committed log jumps from sequence 0 to {seq}",
                                       "eventId": f"{run_id}:{seq}", "sequence": seq,
                                       "workerId": None, "phase": None, "dispatchId": None}], missing
        assert new["next"] == seq + 1 and new["head"] == gap["hash"]
        assert new["state"]["variables"] == {f"v{seq}": seq * 10}


def test_a_record_that_does_not_continue_the_chain_is_flagged():
    run_id = _run_id()
    log = _committed(_docs(run_id, 2))
    record = _through(log, 1)
    forged = {**log[1], "prevHash": "f" * 64, "hash": chain_hash("f" * 64, log[1]["doc"])}
    new, sends = _step(record, forged, 1)
    [violation] = _violations(sends)
    assert (violation["code"], violation["eventId"], violation["sequence"]) == ("hash_chain_broken", f"{run_id}:1", 1)
    assert "f" * 64 in violation["detail"]
    # The step goes on with the chain it computed, not the forged one.
    assert new["head"] == log[1]["hash"] and new["next"] == 2
    # A record with the right prevHash but a wrong hash is flagged too.
    _, sends = _step(record, {**log[1], "hash": "0" * 64}, 1)
    assert [v["code"] for v in _violations(sends)] == ["hash_chain_broken"]


def test_a_rewritten_later_copy_is_flagged_and_changes_nothing():
    run_id = _run_id()
    log = _committed(_docs(run_id, 2))
    record = _through(log, 3)
    before = copy.deepcopy(record)
    rewritten = copy.deepcopy(log[1])
    rewritten["doc"]["payload"]["value"] = 999  # the doc changed after it was committed; its hash did not
    new, sends = _step(record, rewritten, 1)
    assert new == before
    assert [(t, k) for t, k, _ in sends] == [("violations", run_id)]
    [violation] = _violations(sends)
    assert (violation["code"], violation["sequence"]) == ("hash_chain_broken", 1)
    assert chain_hash(log[0]["hash"], rewritten["doc"]) in violation["detail"]


def test_a_redelivered_copy_is_skipped():
    run_id = _run_id()
    log = _committed(_docs(run_id, 2))
    record = _through(log, 3)
    assert _step(record, copy.deepcopy(log[1]), 1) == (None, [])
    assert _step(record, copy.deepcopy(log[2]), 2) == (None, [])


def test_snapshot_every_n_events_and_at_a_terminal_status():
    run_id = _run_id()
    docs = _docs(run_id, 3, end="run.completed")  # sequences 0..4, run.completed at 4
    log = _committed(docs)
    record, snapshots, links = None, [], []
    for i, committed in enumerate(log):
        record, sends = _step(record, committed, 50 + i, every=3)
        snapshots += [(k, v) for t, k, v in sends if t == "snapshots"]
        links += [(k, v) for t, k, v in sends if t == "handoff-links"]
    # The third event (sequence 2), then run.completed (sequence 4, only two events after the last snapshot).
    assert [(k, s["atSequence"]) for k, s in snapshots] == [(run_id, 2), (run_id, 4)]
    state2 = _state(variables={"v1": 10, "v2": 20}, bindings={"engineVersion": "1.4.0"})
    assert snapshots[0][1] == {"runId": run_id, "atSequence": 2, "logPartition": 3, "logOffset": 52,
                               "state": state2, "stateHash": _hash_state(state2), "headHash": log[2]["hash"]}
    state4 = _state(status="completed", variables={"v1": 10, "v2": 20, "v3": 30}, bindings={"engineVersion": "1.4.0"})
    assert snapshots[1][1] == {"runId": run_id, "atSequence": 4, "logPartition": 3, "logOffset": 54,
                               "state": state4, "stateHash": _hash_state(state4), "headHash": log[4]["hash"]}
    assert record["since"] == 0
    assert links == [(run_id, {"kind": "child-terminal", "event": docs[4]})]


def test_a_terminal_status_snapshots_before_n_events():
    run_id = _run_id()
    log = _committed(_docs(run_id, 1, end="run.failed"))  # 3 events, far fewer than every=100
    record, snapshots = None, []
    for i, committed in enumerate(log):
        record, sends = _step(record, committed, i, every=100)
        snapshots += [v for t, _, v in sends if t == "snapshots"]
    assert [s["atSequence"] for s in snapshots] == [2]
    state = _state(status="failed", variables={"v1": 10}, bindings={"engineVersion": "1.4.0"})
    assert snapshots[0]["state"] == state and snapshots[0]["stateHash"] == _hash_state(state)
    assert record["since"] == 0


def test_fold_violations_are_sent_keyed_by_run_without_their_kind():
    run_id = _run_id()
    docs = _docs(run_id, 0)
    docs.append({"eventId": f"{run_id}:1", "runId": run_id, "type": "core.workflowChain.event",
                 "payload": "not an object", "timestamp": T, "sequence": 1})
    log = _committed(docs)
    record = _through(log, 1)
    new, sends = _step(record, log[1], 1)
    [violation] = _violations(sends)
    assert "kind" not in violation
    assert (violation["runId"], violation["code"], violation["eventId"]) == (
        run_id, "invalid_chain_payload", f"{run_id}:1")
    assert [k for t, k, _ in sends if t == "violations"] == [run_id]
    assert new["state"]["flags"] == [{"code": "invalid_chain_payload", "eventId": f"{run_id}:1", "sequence": 1}]


def _record(next_seq: int) -> dict:
    return {"next": next_seq, "head": "a" * 64, "state": {}}


def test_a_redelivered_event_is_folded_again_only_where_its_run_state_stops_before_it():
    # Behind by exactly this event: a crash made its index entry durable, not the run state after it.
    assert refold_due(_record(5), 5)
    assert refold_due(None, 0)
    # Already folded (the usual redelivery), or the run state was durable and the head was not
    # (heads and runs share one round trip): folding again would apply it twice.
    assert not refold_due(_record(6), 5)
    assert not refold_due(_record(9), 5)
    assert not refold_due(None, 3)
    # Further behind: the run's next accepted event catches it up from the log instead.
    assert not refold_due(_record(3), 5)
