"""Reading the sequencer's decisions and summing them up (no broker)."""

from __future__ import annotations

import pytest

from agentlog.cli import publish as publish_cli
from agentlog.streams import publisher
from agentlog.streams.publisher import Decision, PublishSummary, Reject, read_decision

INGEST = "p.ingest"


def _source(topic: str = INGEST, partition: object = 2, offset: object = 40) -> dict[str, object]:
    return {"topic": topic, "partition": partition, "offset": offset, "timestampMs": 1}


def test_a_log_record_accepts_the_ingest_record_it_names() -> None:
    committed = {"doc": {}, "prevHash": "0" * 64, "hash": "1" * 64, "stateHash": "2" * 64, "source": _source()}
    assert read_decision("log", committed, INGEST) == Decision(2, 40, "accepted")


@pytest.mark.parametrize(("reason", "outcome"), [
    ("sequence_gap", "rejected"),
    ("decode_error", "rejected"),
    ("duplicate_event_id", "already_committed"),  # its eventId is in the log from an earlier send
])
def test_a_rejection_rejects_the_ingest_record_it_names_with_its_reason(reason: str, outcome: str) -> None:
    rejected = {"reason": reason, "detail": "why", "runId": "r", "eventId": None, "sequence": None,
                "source": _source(), "raw": ""}
    assert read_decision("rejections", rejected, INGEST) == Decision(2, 40, outcome, reason, "why")  # type: ignore[arg-type]


@pytest.mark.parametrize("source", [
    _source(topic="p.spans", partition=2, offset=40),   # a span the mapper refused: a spans record, no ingest one
    _source(topic="q.ingest"),                           # another deployment's ingest topic
    _source(partition="2"),
    {"topic": INGEST},
    None,
])
def test_a_record_that_names_no_ingest_position_decides_nothing(source: object) -> None:
    assert read_decision("rejections", {"reason": "decode_error", "detail": "", "source": source}, INGEST) is None


def test_accepted_means_committed_once_decided_and_acknowledged_before() -> None:
    sent_only = PublishSummary(sent=4, rejected=[Reject(1, "decode_error", "x")])
    assert (sent_only.accepted, sent_only.decided) == (4, False)
    decided = PublishSummary(sent=4, decided=True, committed=2,
                             rejected=[Reject(3, "sequence_gap", "y", "sequencer")],
                             already_committed=[Reject(0, "duplicate_event_id", "z", "sequencer")])
    assert decided.accepted == 2
    assert decided.to_dict()["alreadyCommitted"] == [
        {"index": 0, "code": "duplicate_event_id", "detail": "z", "stage": "sequencer"}]


def test_the_cli_waits_as_long_as_the_sdk_by_default() -> None:
    assert publish_cli.DECISION_TIMEOUT_S == publisher.DECISION_TIMEOUT_S


@pytest.mark.parametrize(("numbers", "text"), [
    ([1, 2, 3], "1-3"),
    ([1, 2, 3, 7, 9, 10], "1-3, 7, 9-10"),
    ([4], "4"),
])
def test_line_numbers_are_listed_as_ranges(numbers: list[int], text: str) -> None:
    assert publish_cli._ranges(numbers) == text
