"""The run-state step's incremental state hashes equal the reference hash at every index (pure, no broker)."""

from __future__ import annotations

import copy

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

import agentlog.core.runstate as runstate
from agentlog.core.fold import fold
from agentlog.core.statehash import ExactStateHash
from agentlog.schemas.canonical import GENESIS, chain_hash, sha256_hex
from agentlog.schemas.canonical import jcs_parsed as runstate_jcs
from agentlog.schemas.errors import EventRejected
from tests.unit.core.runs import child_runs, realistic_run
from tests.unit.replay.runs import llm_run
from tests.unit.schemas.test_fast_paths import _keys, _values


def _reference(state) -> str:
    return sha256_hex(rfc8785.dumps(state))


def _committed(docs):
    head = GENESIS
    for doc in docs:
        h = chain_hash(head, doc)
        yield {"doc": doc, "prevHash": head, "hash": h, "source": {"topic": "t", "partition": 0, "offset": 0,
                                                                   "timestampMs": 0}}
        head = h


def _step_all(runs: dict[str, list[dict]], snapshot_every: int = 7):
    """Interleave the runs' committed events through ``advance``; yield (run, state, state hash, snapshot due)."""
    records: dict[str, dict | None] = {r: None for r in runs}
    streams = {r: list(_committed(docs)) for r, docs in runs.items()}
    while any(streams.values()):
        for run_id, stream in streams.items():
            if not stream:
                continue
            committed = stream.pop(0)
            adv = runstate.advance(records[run_id], committed["doc"], committed["hash"],
                                   snapshot_every=snapshot_every, handoff_mode="auto")
            records[run_id] = adv.record
            yield run_id, adv.state, adv.state_hash, adv.snapshot


@pytest.fixture(params=[runstate.INCREMENTAL_FROM_BYTES, 0], ids=["in-full-while-small", "incremental"])
def threshold(request, monkeypatch):
    """Every test of the live hash runs with states hashed in full (the realistic runs are small) and incrementally."""
    monkeypatch.setattr(runstate, "INCREMENTAL_FROM_BYTES", request.param)
    monkeypatch.setattr(runstate, "_RUN_HASHES", {})
    return request.param


def test_state_hashes_equal_reference_for_interleaved_realistic_runs(threshold):
    runs = {"a": realistic_run("a", "check"), "b": realistic_run("b", "derive"), "c": llm_run("c"),
            **child_runs("p")}
    seen = snapshots = 0
    for _, state, state_hash, snapshot in _step_all(runs):
        assert state_hash == _reference(state)
        seen += 1
        snapshots += snapshot
    assert seen == sum(len(d) for d in runs.values()) and snapshots


def test_state_hashes_equal_reference_when_hashers_are_evicted(monkeypatch, threshold):
    monkeypatch.setattr(runstate, "_MAX_RUN_HASHES", 1)
    runs = {"a": realistic_run("a", "check"), "b": realistic_run("b", "derive")}
    for _, state, state_hash, _ in _step_all(runs, snapshot_every=3):
        assert state_hash == _reference(state)


def test_a_state_mutated_behind_the_cache_is_caught_at_the_next_snapshot(threshold):
    # Not something the fold does (it is copy-on-write): the guard for a caller that breaks the rule.
    run_id = "mutated"
    docs = realistic_run(run_id, "check")
    records = list(_committed(docs))
    rec = None
    for committed in records[:2]:
        rec = runstate.advance(rec, committed["doc"], committed["hash"], snapshot_every=1000,
                               handoff_mode="auto").record
    rec["state"]["variables"]["sneaky"] = 1  # mutate a sub-dict the hasher has cached
    terminal = {**records[2]["doc"], "type": "run.completed", "payload": {}}
    adv = runstate.advance(rec, terminal, chain_hash(rec["head"], terminal), snapshot_every=1000,
                           handoff_mode="auto")
    assert adv.snapshot and adv.state_hash == _reference(adv.state)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["variable.changed", "channel.written"]), _keys, _values), max_size=15))
def test_live_hasher_equals_reference_for_arbitrary_values_and_keys(steps):
    hasher = ExactStateHash()
    state = None
    for i, (type_, name, value) in enumerate(steps):
        payload = {"name": name, "value": value} if type_ == "variable.changed" else {"channel": name, "value": value}
        event = {"eventId": f"e{i}", "runId": "r", "type": type_, "payload": copy.deepcopy(payload),
                 "timestamp": "2025-01-01T00:00:00.000Z", "sequence": i}
        state, _ = fold(state, event)
        assert hasher(state) == _reference(state)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_keys, _values, max_size=6), min_size=1, max_size=8), st.data())
def test_exact_hash_equals_reference_for_hard_top_level_members_shared_between_states(states, data):
    """Any member names (non-BMP, U+E000.., controls) and values (1e21, 5e-324, -0.0, escapes), at
    every step some members carried over as the same objects (the fold's copy-on-write) and some
    replaced: the digest is rfc8785's, not a candidate."""
    hasher = ExactStateHash()
    previous: dict = {}
    for fresh in states:
        state = dict(previous)
        for k in data.draw(st.lists(st.sampled_from(sorted(previous)), unique=True)) if previous else []:
            del state[k]  # a member dropped (the key list changes: start over)
        state.update(fresh)
        assert hasher(state) == _reference(state)
        assert hasher(dict(state)) == _reference(state)  # a new state object, every member the same
        previous = state


def test_exact_hash_resumes_from_the_changed_member_only():
    hasher = ExactStateHash()
    state = {"a": {"x": 1}, "b": [1.5, "é"], "z": {"\U0001f600": 1, "\ue000": 2}}
    assert hasher(state) == _reference(state)
    later = {**state, "b": [2.0, 1e21, -0.0]}  # floats orjson spells unlike JCS
    assert hasher(later) == _reference(later)
    last = {**later, "z": {**later["z"], "\U0001f601": 3}}  # non-BMP keys: UTF-16 order
    assert hasher(last) == _reference(last)


def test_exact_hash_raises_what_jcs_raises_and_recovers():
    hasher = ExactStateHash()
    good = {"a": 1, "b": "x"}
    assert hasher(good) == _reference(good)
    bad = {**good, "b": 2**60}  # beyond 2**53: not canonicalisable
    try:
        hasher(bad)
    except EventRejected as e:
        assert e.code == "unsafe_integer"
    else:
        raise AssertionError("an unsafe integer was hashed")
    after = {**good, "b": "y"}
    assert hasher(after) == _reference(after)


def test_a_run_keeps_its_last_hash_while_in_flight_and_drops_it_at_its_terminal_event(threshold):
    runs = {"a": llm_run("a"), **child_runs("a")}
    seen: set[str] = set()
    for run_id, state, state_hash, _ in _step_all(runs):
        assert state_hash == _reference(state)
        ended = state["status"] in ("completed", "failed", "cancelled")
        assert (run_id in runstate._RUN_HASHES) is not ended
        if not ended:  # the first state is hashed in full; past the threshold the run's hasher takes over
            assert (runstate._RUN_HASHES[run_id].hasher is not None) is (threshold == 0 and run_id in seen)
        seen.add(run_id)
    assert runstate._RUN_HASHES == {}


def test_an_unchanged_state_reuses_the_hash_before_it_without_hashing(monkeypatch, threshold):
    docs = llm_run("u")
    records = list(_committed(docs))
    rec, hashes = None, []
    calls = []
    unchanged = 0
    monkeypatch.setattr(runstate, "jcs_parsed", lambda state: calls.append(1) or runstate_jcs(state))
    for committed in records:
        before = rec["state"] if rec else None
        adv = runstate.advance(rec, committed["doc"], committed["hash"], snapshot_every=1000, handoff_mode="auto")
        if adv.state is before:  # an LLM call, a tool, usage: the fold returned the state as it was
            assert adv.state_hash == hashes[-1]
            unchanged += 1
        hashes.append(adv.state_hash)
        assert adv.state_hash == _reference(adv.state)
        rec = adv.record
    assert unchanged >= 5
    if threshold:  # hashed in full: once per changed state, never for an unchanged one
        assert len(calls) == len(records) - unchanged


def test_an_empty_member_is_spelled_without_the_encoder():
    for value in ({}, [], {"a": {}}, [[]], {"b": []}):
        assert ExactStateHash._spell(value) == rfc8785.dumps(value)
