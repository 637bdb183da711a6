"""The fold's note of the one entry it set, and the state hash re-derivation takes from it (pure, no broker).

What must hold: (1) ``fold_noting`` folds exactly as ``fold`` does, and whenever it gives
a note ``(member, key)`` the new state differs from the old one in ``state[member][key]`` alone (every
other member and entry the same object), over random histories of every kind of event the fold
interprets; (2) ``ResumableStateHash.after_set`` with such a note is ``sha256(JCS(state))`` at every
index where orjson spells the values as JCS does, and whatever the history, the candidate a fresh
spelling gives; (3) a wrong note only costs time: the walk's verdicts are the general path's.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agentlog.core.fold import fold, fold_noting, state_hash
from agentlog.core.statehash import ExactStateHash, ResumableStateHash
from agentlog.replay import rederive
from agentlog.replay.rederive import _Walk
from agentlog.schemas.canonical import canonical_leaf, sha256_hex, utf16_key
from tests.unit.core.forgery import rechain
from tests.unit.replay.walks import walk_records, walk_summary

_names = st.sampled_from(["a", "b", "c", "goal", "é", "\ue000", "\U0001f600", "\u20ac", "A", "_"])
_plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["x", "y", "é", "\u20ac"]), inner,
                                                                max_size=3),
    max_leaves=12,
)
_hard_values = _plain_values | st.sampled_from([1e21, 5e-324, -0.0, 2.0, 1e16, 1e-7, {"\U0001f600": 1, "\ue000": 2}])
_TYPES = ["variable.changed", "variable.changed", "variable.changed", "channel.written", "run.started",
          "run.paused", "run.resumed", "provider.usage", "approval.requested"]


def _doc(i: int, type_: str, name: Any, value: Any) -> dict[str, Any]:
    if type_ == "variable.changed":
        payload: Any = {"name": name, "value": value}
        if i % 7 == 3:
            payload = {"name": name}  # no value: the fold leaves the state as it is
        elif i % 11 == 5:
            payload = {"name": 1, "value": value}  # not a name
    elif type_ == "channel.written":
        payload = {"channel": name, "value": value}
    elif type_ == "run.started":
        payload = {"bindings": {"engineVersion": "1"}}
    else:
        payload = {"note": value}
    return {"eventId": f"e{i}", "runId": "r", "type": type_, "payload": copy.deepcopy(payload),
            "timestamp": "2025-01-01T00:00:00.000Z", "sequence": i, "nodeId": "n"}


def _history(values: st.SearchStrategy[Any], names: st.SearchStrategy[str] = _names
             ) -> st.SearchStrategy[list[dict[str, Any]]]:
    steps = st.lists(st.tuples(st.sampled_from(_TYPES), names, values), min_size=1, max_size=24)
    return steps.map(lambda s: [_doc(i, *step) for i, step in enumerate(s)])


def _entry_spelled(state: dict[str, Any]) -> str:
    """The candidate after a noted set: members as ``_spelled``, the last one entry by entry in JCS order."""
    keys = sorted(state, key=utf16_key)

    def member(k: str) -> bytes:
        value = state[k]
        if k != keys[-1] or type(value) is not dict:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        entries = sorted(value, key=utf16_key)
        return b"{" + b",".join(canonical_leaf(e) + b":" + orjson.dumps(value[e], option=orjson.OPT_SORT_KEYS)
                                for e in entries) + b"}"

    return sha256_hex(b"{" + b",".join(canonical_leaf(k) + b":" + member(k) for k in keys) + b"}")


def _spelled(state: dict[str, Any]) -> str:
    keys = sorted(state, key=utf16_key)
    body = b",".join(canonical_leaf(k) + b":" + orjson.dumps(state[k], option=orjson.OPT_SORT_KEYS) for k in keys)
    return sha256_hex(b"{" + body + b"}")


@hsettings(max_examples=200, deadline=None)
@given(_history(_hard_values))
def test_every_note_names_the_one_entry_the_fold_set(docs):
    state = None
    noted = 0
    for doc in docs:
        new, outputs, note = fold_noting(state, doc)
        assert (new, outputs) == fold(state, doc)
        if note is not None:
            noted += 1
            member, key = note
            assert state is not None and new is not state and new.keys() == state.keys()
            assert all(new[k] is state[k] for k in new if k != member)
            before, after = state[member], new[member]
            assert after is not before and after[key] is doc["payload"]["value"]
            assert after.keys() == before.keys() | {key}
            assert all(after[k] is before[k] for k in before if k != key)
        state = new
    assert noted <= len(docs)


@hsettings(max_examples=150, deadline=None)
@given(_history(_plain_values, st.sampled_from(["a", "b", "c", "goal", "é", "\ue000", "\u20ac", "A", "_", '"'])))
def test_a_noted_set_hashes_to_the_reference_where_orjson_spells_as_jcs(docs):
    """No float, no key past U+FFFF: orjson's spelling is JCS, so every candidate is the reference itself."""
    hasher, state = ResumableStateHash(), None
    for doc in docs:
        prev = state
        state, _, note = fold_noting(prev, doc)
        got = hasher(state) if note is None else hasher.after_set(state, prev, *note)
        assert got == state_hash(state)


@hsettings(max_examples=150, deadline=None)
@given(_history(_hard_values), st.randoms(use_true_random=False))
def test_any_history_and_any_note_give_a_fresh_candidate(docs, rnd: random.Random):
    """Right notes, wrong notes (another key, another member, a key not there, the wrong previous state),
    states out of order: a right note gives the entry-by-entry spelling or the fresh one, and once a
    candidate that is not the fresh one is dropped (``forget``, as the walk does), every plain call
    is what a fresh instance gives."""
    states, notes, state = [], [], None
    for doc in docs:
        state, _, note = fold_noting(state, doc)
        states.append(state)
        notes.append(note)
    hasher = ResumableStateHash()
    prev = None
    for i in list(range(len(states))) + [rnd.randrange(len(states)) for _ in range(len(states))]:
        state, note = states[i], notes[i]
        if note is not None and rnd.random() < 0.8:
            right = prev is (states[i - 1] if i else None)
            member, key = note
            if rnd.random() < 0.3:
                right = False
                member, key = rnd.choice([(member, rnd.choice([*state[member], "absent"])), ("status", key),
                                          ("variables", "absent")])
            got = hasher.after_set(state, prev, member, key)
            if right:
                assert got in (_entry_spelled(state), _spelled(state), None)
            if got != _spelled(state):
                hasher.forget()
        else:
            assert hasher(state) == _spelled(state) == ResumableStateHash()(state)
        prev = state


def test_the_live_hash_ignores_notes():
    """The worker's exact hash gives the reference with or without a note (it never takes the candidate)."""
    exact, state = ExactStateHash(), None
    for i, value in enumerate([1, 2.0, 1e21, {"\U0001f600": 1, "\ue000": 2}, "x", -0.0]):
        prev = state
        state, _, note = fold_noting(prev, _doc(i + 1, "variable.changed", "v" if i else "w", value))
        assert exact.after_set(state, prev, *(note or ("variables", "v"))) == state_hash(state)


# --- the walk: a noted index takes the short way, anything else the general one, same verdicts ----------

def _variable_run(n: int = 60) -> list[dict[str, Any]]:
    docs = [_doc(0, "run.started", "", None)]
    for i in range(1, n):
        type_ = "provider.usage" if i % 10 == 0 else "variable.changed"
        docs.append(_doc(i, type_, f"var{i % 7}", {"step": i, "note": "x" * (i % 5)}))
    return docs


def _walk(records: list[dict[str, Any]], *, collect_all: bool = True) -> _Walk:
    return walk_records(records, collect_all=collect_all)


_summary = walk_summary


def _general(records: list[dict[str, Any]], monkeypatch) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setattr(rederive, "fold_noting", lambda s, e, handoff_mode: (*fold(s, e, handoff_mode=handoff_mode), None))
        return _summary(_walk(records))


def test_a_noted_walk_ends_as_the_general_one_on_clean_and_altered_logs(monkeypatch):
    clean = rechain(_variable_run())
    k = len(clean) // 2 + 1  # a variable.changed
    other = copy.deepcopy(clean)
    other[k]["stateHash"] = state_hash(fold(_walk(clean[:k]).state, {**clean[k]["doc"], "payload": {
        "name": "var0", "value": "recorded by another fold"}})[0])
    hard = rechain(_variable_run()[:k] + [_doc(k, "variable.changed", "var1", 2.0)]
                   + [_doc(i, "variable.changed", f"var{i % 3}", 1e21) for i in range(k + 1, k + 6)])
    logs = {"clean": clean, "stateHash of another state": other, "floats orjson spells unlike JCS": hard}
    for name, records in logs.items():
        noted = _summary(_walk(records))
        assert noted == _general(records, monkeypatch), name
        assert (not noted["divergences"]) == (name != "stateHash of another state"), name
    assert _summary(_walk(clean))["compared"] == len(clean)


def test_a_wrong_note_only_costs_time(monkeypatch):
    """A note naming another entry than the one set: the candidate misses, the exact path decides."""
    clean = rechain(_variable_run())

    def wrong(state, event, handoff_mode):
        new, outputs, note = fold_noting(state, event, handoff_mode=handoff_mode)
        if note is not None and event["sequence"] % 3 == 0:
            note = ("variables", next(k for k in new["variables"] if k != note[1]) if len(new["variables"]) > 1
                    else "absent")
        return new, outputs, note

    general = _general(clean, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(rederive, "fold_noting", wrong)
        walked = _summary(_walk(clean))
    assert walked == general and not walked["divergences"] and walked["compared"] == len(clean)
