"""Run lifetimes as pure rules: when a run is due to close, the close request on the wire, the marker's verdict."""

from __future__ import annotations

import pytest

from agentlog.core.lifetimes import CLOSE_PREFIX, after_close, close_request, closed_marker, due, read_close_request
from agentlog.streams.codec import decode_ingest


def test_a_finished_run_is_due_its_grace_after_its_last_event_an_unfinished_one_its_idle_retention():
    assert due({"next": 9, "hash": "h", "ts": 1_000_000, "end": True}, grace_s=30, idle_s=3600, now_s=0) == (
        1030.0, "completed")
    assert due({"next": 3, "hash": "h", "ts": 1_000_000, "end": False}, grace_s=30, idle_s=3600, now_s=0) == (
        4600.0, "expired")
    # A head repaired after a crash has no timestamp: timed from now.
    assert due({"next": 3, "hash": "h"}, grace_s=30, idle_s=3600, now_s=50.0) == (3650.0, "expired")


def test_a_close_request_reads_back_and_no_ingest_reader_takes_it_for_an_event():
    value = close_request("run-1", 7, "completed")
    assert value.startswith(CLOSE_PREFIX)
    assert read_close_request(value) == {"runId": "run-1", "next": 7, "reason": "completed"}
    with pytest.raises(Exception) as info:
        decode_ingest(value)
    assert getattr(info.value, "code", None) == "bad_magic"


@pytest.mark.parametrize("value", [
    b'{"runId": "r", "next": 1, "reason": "completed"}',  # an ordinary JSON record
    CLOSE_PREFIX + b"not json",
    CLOSE_PREFIX + b'{"runId": "r", "next": "1", "reason": "completed"}',
    CLOSE_PREFIX + b'{"runId": "r", "next": 1, "reason": "bored"}',
    CLOSE_PREFIX + b'["r", 1]',
])
def test_anything_else_is_not_a_close_request(value):
    assert read_close_request(value) is None


def test_the_marker_refuses_what_comes_after_the_request_and_lets_what_came_before_pass_as_handled():
    marker = closed_marker({"runId": "r", "next": 12, "reason": "expired"}, "f" * 64, offset=500)
    assert marker == {"reason": "expired", "next": 12, "hash": "f" * 64, "at": 500}
    assert after_close(marker, "r", 499) is None
    reason, detail = after_close(marker, "r", 500)
    assert reason == "run_expired" and "sequence 11" in detail
    assert after_close({**marker, "reason": "completed"}, "r", 900)[0] == "run_closed"
