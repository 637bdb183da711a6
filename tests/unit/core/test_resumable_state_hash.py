"""The resumable candidate state hash re-derivation checks first (pure, no broker).

What it must be: (1) on the states runs really have, ``sha256(JCS(state))`` itself; (2) whatever came
before, the same digest a fresh instance gives (resuming SHA-256 from a member boundary, reusing the
bytes of unchanged members, is only a shortcut); (3) on values orjson spells unlike JCS, something
the caller's exact path then decides, so the walk's state hash is always the reference one.
"""

from __future__ import annotations

import copy
import random

import orjson
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agentlog.core.fold import fold, state_hash, states_by_index
from agentlog.core.statehash import ResumableStateHash
from agentlog.replay.rederive import _Walk
from agentlog.schemas.canonical import GENESIS, canonical_leaf, sha256_hex, utf16_key
from tests.unit.core.runs import child_runs, realistic_run
from tests.unit.replay.runs import llm_run

_keys = st.text(alphabet=st.sampled_from(["a", "b", "é", "\ue000", "\U0001f600", "\u20ac", "A", "_", '"', "\x01"]),
                min_size=0, max_size=4)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e21, 5e-324, -0.0, 2.0, 1e16, 1e-7])
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


def _spelled(state: dict) -> str:
    """The candidate by definition: sorted members, each value in orjson's sorted bytes, hashed at once."""
    keys = sorted(state, key=utf16_key)
    body = b",".join(canonical_leaf(k) + b":" + orjson.dumps(state[k], option=orjson.OPT_SORT_KEYS) for k in keys)
    return sha256_hex(b"{" + body + b"}")


def _walk() -> _Walk:
    return _Walk(state=None, head=GENESIS, next_seq=0, collect_all=False, digests={}, snapshots={},
                 handoff_mode="auto")


def test_equals_the_reference_at_every_index_of_realistic_runs():
    runs = [realistic_run("r", "check"), realistic_run("r", "derive"), llm_run("r"), *child_runs("r").values()]
    for docs in runs:
        candidate = ResumableStateHash()
        for state, reference in states_by_index(docs):
            assert candidate(state) == reference


def _steps_to_states(steps) -> list[dict]:
    states, state = [], None
    for i, (type_, name, value) in enumerate(steps):
        payload = {"name": name, "value": value} if type_ == "variable.changed" else {"channel": name, "value": value}
        if type_ == "run.started":
            payload = {"bindings": {name: value}}
        event = {"eventId": f"e{i}", "runId": "r", "type": type_, "payload": copy.deepcopy(payload),
                 "timestamp": "2025-01-01T00:00:00.000Z", "sequence": i}
        state, _ = fold(state, event)
        states.append(state)
    return states


_steps = st.lists(st.tuples(st.sampled_from(["variable.changed", "channel.written", "run.started", "run.paused",
                                             "provider.usage"]), _keys, _values), max_size=14)


@hsettings(max_examples=150, deadline=None)
@given(_steps, st.randoms(use_true_random=False))
def test_any_history_gives_what_a_fresh_instance_gives(steps, rnd: random.Random):
    states = _steps_to_states(steps)
    # Out of order, repeated, and copies loaded from JSON (other objects, other insertion order)
    # and states with other key sets, as a snapshot start or a hand-made state would be.
    extra = [orjson.loads(orjson.dumps(s)) for s in states[:3]] + [{"status": "x"}, {}, {"é": 1, "e": [2.0]},
                                                              {"a": 1, "b": 2}, {"a": 1, "c": 2}, {"c": 2, "a": 1}]
    order = states + extra + [rnd.choice(states + extra) for _ in range(len(states))] if states else extra
    candidate = ResumableStateHash()
    for state in order:
        assert candidate(state) == ResumableStateHash()(state) == _spelled(state)


@hsettings(max_examples=150, deadline=None)
@given(_steps)
def test_the_walk_state_hash_is_the_reference_whatever_was_recorded(steps):
    """Recorded = the reference hash, or a wrong one: the walk's hash is the reference hash either way."""
    walk = _walk()
    for state in _steps_to_states(steps):
        walk.state = state
        reference = state_hash(state)
        assert walk._state_hash(reference) == reference
        assert walk._state_hash("0" * 64) == reference


def test_hard_values_fall_back_to_the_reference():
    """Values whose orjson spelling is not JCS (exponents, integral floats, non-BMP key order)."""
    walk, unlike = _walk(), 0
    for value in (1e21, 5e-324, -0.0, 2.0, 1e-7, {"\U0001f600": 1, "\ue000": 2}, [1e16, 123456789012345680000.0]):
        walk.state, _ = fold(walk.state, {"runId": "r", "type": "variable.changed", "sequence": 0,
                                          "payload": {"name": "v", "value": value}})
        reference = state_hash(walk.state)
        unlike += ResumableStateHash()(walk.state) != reference
        assert walk._state_hash(reference) == reference
        assert walk._state_hash(None) == reference
    assert unlike >= 4  # the fallback was really taken, not only the candidate
