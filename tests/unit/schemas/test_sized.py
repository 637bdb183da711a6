"""Encodings that are kept take the memory of their length, not of orjson's buffer.

orjson (3.12 on) returns its output in a buffer of 4 KiB or more however short the output; the
encodings the worker and the sink keep (table writes, log records, sink rows, the state hasher's
members) are copied out of it (:func:`agentlog.schemas.canonical.sized`). Measured with tracemalloc,
which sees the bytes objects' allocations.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from agentlog.schemas.canonical import jcs, jcs_parsed, jcs_parsed_and_member
from agentlog.worker.tables import encode

KEPT = 2_000

ENCODERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "jcs": jcs,
    "jcs_parsed": jcs_parsed,
    "jcs_parsed_and_member": lambda value: jcs_parsed_and_member(value, "payload"),
    "table encode": encode,
}


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_a_kept_encoding_takes_about_its_length(name: str) -> None:
    values = [{"runId": f"run-{i}", "sequence": i, "payload": {"text": "x" * 40}} for i in range(KEPT)]
    encode_one = ENCODERS[name]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [encode_one(value) for value in values]
        per_value = (tracemalloc.get_traced_memory()[0] - before) / KEPT
    finally:
        tracemalloc.stop()
    assert kept
    assert per_value < 512, f"{name}: {per_value:.0f} bytes kept per ~100-byte encoding"
