"""compare skips volatile differences lazily; that must judge exactly like strip_volatile + JCS."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.replay.compare import first_difference
from agentlog.schemas.canonical import jcs
from agentlog.schemas.stability import is_volatile, strip_volatile

TYPES = ["agent.invocation.completed", "agent.toolReturned", "node.retried", "log.appended", "provider.usage"]
KEYS = ["latencyMs", "traceId", "message", "error", "code", "usage", "envelope", "rawResponse", "result",
        "side_effects", "timestamp", "type", "target", "raw", "attempt"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["a", "b"]))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
    max_leaves=12,
)
payloads = st.dictionaries(st.sampled_from(KEYS), values, max_size=5)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(TYPES), payloads, payloads)
def test_lazy_skip_equals_strip_then_compare(event_type: str, a: dict, b: dict) -> None:
    doc_a = {"type": event_type, "payload": a}
    doc_b = {"type": event_type, "payload": b}
    stripped_equal = jcs(strip_volatile(doc_a)) == jcs(strip_volatile(doc_b))
    lazy = first_difference(doc_a, doc_b, ignore=lambda p: is_volatile(event_type, p))
    assert (lazy is None) == stripped_equal, lazy


@settings(max_examples=100, deadline=None)
@given(payloads, payloads)
def test_first_difference_is_none_exactly_when_jcs_bytes_are_equal(a: dict, b: dict) -> None:
    found = first_difference(a, b)
    assert (found is None) == (jcs(a) == jcs(b))
