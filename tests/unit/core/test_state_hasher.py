"""The incremental state hash used by re-derivation equals the reference ``state_hash`` (pure, no broker)."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agentlog.core.fold import fold, state_hash, states_by_index
from agentlog.core.statehash import StateHasher as _StateHasher
from tests.unit.core.runs import child_runs, realistic_run
from tests.unit.replay.runs import llm_run


def test_equals_reference_at_every_index_of_realistic_runs():
    runs = [realistic_run("r", "check"), realistic_run("r", "derive"), llm_run("r"), *child_runs("r").values()]
    for docs in runs:
        hasher = _StateHasher()
        for state, reference in states_by_index(docs):
            assert hasher(state) == reference


_keys = st.text(alphabet=st.sampled_from(["a", "b", "é", "\ue000", "\U0001f600", "\u20ac", "A", "_"]),
                min_size=0, max_size=4)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@hsettings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["variable.changed", "channel.written"]), _keys, _values), max_size=12))
def test_equals_reference_for_arbitrary_values_and_keys(steps):
    hasher = _StateHasher()
    state = None
    for i, (type_, name, value) in enumerate(steps):
        payload = {"name": name, "value": value} if type_ == "variable.changed" else {"channel": name, "value": value}
        event = {"eventId": f"e{i}", "runId": "r", "type": type_, "payload": copy.deepcopy(payload),
                 "timestamp": "2025-01-01T00:00:00.000Z", "sequence": i}
        state, _ = fold(state, event)
        assert hasher(state) == state_hash(state)


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.integers(-(2**53) + 1, 2**53 - 1), st.booleans(), st.none(),
                 st.floats(allow_nan=False, allow_infinity=False)))
def test_leaf_bytes_are_jcs_bytes(value):
    from agentlog.schemas.canonical import canonical_leaf as _leaf
    from agentlog.schemas.canonical import jcs

    assert _leaf(value) == jcs(value)


def test_leaf_bytes_for_escapes_and_non_bmp():
    from agentlog.schemas.canonical import canonical_leaf as _leaf
    from agentlog.schemas.canonical import jcs

    for text in ["\x00\x01\x1f\x7f", "\b\t\n\f\r", '"\\/', "\u2028\u2029", "é€😀", "\ue000"]:
        assert _leaf(text) == jcs(text)


@hsettings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=6))
def test_fast_chain_hash_equals_reference(payload):
    from agentlog.schemas.canonical import GENESIS, chain_hash
    from agentlog.schemas.canonical import chain_hash as _chain_hash

    doc = {"eventId": "e", "runId": "r", "type": "variable.changed", "payload": payload, "sequence": 0}
    assert _chain_hash(GENESIS, doc) == chain_hash(GENESIS, doc)
