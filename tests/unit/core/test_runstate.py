"""The run-state step (``agentlog.core.runstate.advance`` / ``fold_next``) without a broker.

One accepted event in, the run's new table record, its state hash and the records to send out:
snapshots due every N events and at a terminal status, fold violations, and the refusal of an event
the run's state is not just before (``run_state_unavailable``). Hashes are computed here with
``agentlog.schemas.canonical.chain_hash`` and with ``hashlib`` over ``rfc8785`` (the JCS reference
implementation), and states are written by hand from CONTRACT.md's ``initial_state``, never taken
from the step itself.
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import rfc8785

import agentlog.core.runstate as runstate
from agentlog.core.runstate import Advanced, Unfoldable, advance, fold_next
from agentlog.schemas.canonical import GENESIS, chain_hash

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


def _advance(record, committed, *, every=100) -> Advanced:
    return advance(record, committed["doc"], committed["hash"], snapshot_every=every, handoff_mode="auto")


def _violations(sends) -> list[dict]:
    return [v for topic, _, v in sends if topic == "violations"]


def test_first_event_starts_the_run_with_its_state_hash():
    run_id = _run_id()
    log = _committed(_docs(run_id, 0))
    adv = _advance(None, log[0])
    state = _state(bindings={"engineVersion": "1.4.0"})
    assert adv.record == {"state": state, "next": 1, "head": log[0]["hash"], "since": 1, "ts": None, "end": False}
    assert adv.state == state and adv.state_hash == _hash_state(state)
    assert adv.sends == [] and not adv.snapshot


def test_contiguous_events_fold_and_chain():
    run_id = _run_id()
    log = _committed(_docs(run_id, 3))
    record, hashes = None, []
    for committed in log:
        adv = _advance(record, committed)
        assert _violations(adv.sends) == []
        record = adv.record
        hashes.append(adv.state_hash)
    variables = {"v1": 10, "v2": 20, "v3": 30}
    state = _state(variables=variables, bindings={"engineVersion": "1.4.0"})
    assert record == {"state": state, "next": 4, "head": log[3]["hash"], "since": 4, "ts": None, "end": False}
    assert hashes[1] == _hash_state(_state(variables={"v1": 10}, bindings={"engineVersion": "1.4.0"}))
    assert hashes[-1] == _hash_state(state)


def _through(log: list[dict], n: int, every: int = 100) -> dict:
    record = None
    for committed in log[:n]:
        record = _advance(record, committed, every=every).record
    return record


def test_snapshot_every_n_events_and_at_a_terminal_status():
    run_id = _run_id()
    docs = _docs(run_id, 3, end="run.completed")  # sequences 0..4, run.completed at 4
    log = _committed(docs)
    record, snapshots, links = None, [], []
    for committed in log:
        adv = _advance(record, committed, every=3)
        record = adv.record
        if adv.snapshot:
            snapshots.append((committed["doc"]["sequence"], adv.state, adv.state_hash, record["head"]))
        links += [(k, v) for t, k, v in adv.sends if t == "handoff-links"]
    # The third event (sequence 2), then run.completed (sequence 4, only two events after the last snapshot).
    assert [s[0] for s in snapshots] == [2, 4]
    state2 = _state(variables={"v1": 10, "v2": 20}, bindings={"engineVersion": "1.4.0"})
    assert snapshots[0][1:] == (state2, _hash_state(state2), log[2]["hash"])
    state4 = _state(status="completed", variables={"v1": 10, "v2": 20, "v3": 30}, bindings={"engineVersion": "1.4.0"})
    assert snapshots[1][1:] == (state4, _hash_state(state4), log[4]["hash"])
    assert record["since"] == 0
    assert links == [(run_id, {"kind": "child-terminal", "event": docs[4]})]


def test_a_terminal_status_snapshots_before_n_events():
    run_id = _run_id()
    log = _committed(_docs(run_id, 1, end="run.failed"))  # 3 events, far fewer than every=100
    record, snapshots = None, []
    for committed in log:
        adv = _advance(record, committed, every=100)
        record = adv.record
        if adv.snapshot:
            snapshots.append((committed["doc"]["sequence"], adv.state, adv.state_hash))
    state = _state(status="failed", variables={"v1": 10}, bindings={"engineVersion": "1.4.0"})
    assert snapshots == [(2, state, _hash_state(state))]
    assert record["since"] == 0


def test_fold_violations_are_sent_keyed_by_run_without_their_kind():
    run_id = _run_id()
    docs = _docs(run_id, 0)
    docs.append({"eventId": f"{run_id}:1", "runId": run_id, "type": "core.workflowChain.event",
                 "payload": "not an object", "timestamp": T, "sequence": 1})
    log = _committed(docs)
    record = _through(log, 1)
    adv = _advance(record, log[1])
    [violation] = _violations(adv.sends)
    assert "kind" not in violation
    assert (violation["runId"], violation["code"], violation["eventId"]) == (
        run_id, "invalid_chain_payload", f"{run_id}:1")
    assert [k for t, k, _ in adv.sends if t == "violations"] == [run_id]
    assert adv.record["state"]["flags"] == [{"code": "invalid_chain_payload", "eventId": f"{run_id}:1",
                                             "sequence": 1}]


# --- fold_next: an event is committed only with its fold ------------------------------------------------


def _fold_next(record, committed) -> Advanced | Unfoldable:
    return fold_next(record, committed["doc"], committed["hash"], snapshot_every=100, handoff_mode="auto")


def test_fold_next_folds_the_event_its_run_state_stops_before():
    run_id = _run_id()
    log = _committed(_docs(run_id, 3))
    assert _fold_next(None, log[0]) == _advance(None, log[0])
    record = _through(log, 2)
    assert _fold_next(record, log[2]) == _advance(record, log[2])


def test_a_run_record_carries_its_last_ingest_timestamp_and_whether_it_ended():
    # What the worker's run lifetimes read (agentlog.core.lifetimes.due): the record is the run's head.
    run_id = _run_id()
    log = _committed(_docs(run_id, 2, end="run.completed"))  # sequences 0..3, run.completed at 3
    record = None
    for committed, ts in zip(log, (1_000, 2_000, 3_000, 4_000), strict=True):
        got = fold_next(record, committed["doc"], committed["hash"], snapshot_every=100, handoff_mode="auto",
                        ts_ms=ts)
        assert not isinstance(got, Unfoldable)
        assert got.record["ts"] == ts and got.record["next"] == committed["doc"]["sequence"] + 1
        assert got.record["end"] is (committed["doc"]["type"] == "run.completed")
        record = got.record


def test_fold_next_refuses_an_event_whose_fold_raises(monkeypatch, caplog):
    run_id = _run_id()
    log = _committed(_docs(run_id, 1))
    record = _through(log, 1)

    def broken(*_args, **_kwargs):
        raise RuntimeError("a fold bug")

    monkeypatch.setattr(runstate, "fold", broken)
    with caplog.at_level(logging.ERROR, logger="agentlog.runstate"):
        got = _fold_next(record, log[1])
    assert isinstance(got, Unfoldable)
    assert got.detail.startswith(f"folding run {run_id} at sequence 1 failed (RuntimeError: a fold bug); "
                                 "the event is not appended")
    assert any(r.exc_info for r in caplog.records)  # the traceback is in the worker's log
