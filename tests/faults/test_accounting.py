"""The fault suite's own bookkeeping (no broker): lost/duplicated are counted from source positions,
and the summary never reports a count nobody made."""

from __future__ import annotations

import pytest

from tests.faults.accounting import landing
from tests.faults.conftest import FaultLedger

pytestmark = [pytest.mark.faults]

T = "t.ingest"


def _log(partition: int, offset: int, seq: int, topic: str = T) -> dict:
    return {"doc": {"runId": "r", "sequence": seq}, "prevHash": "0" * 64, "hash": f"{seq:064d}",
            "source": {"topic": topic, "partition": partition, "offset": offset, "timestampMs": 0}}


def _rej(partition: int, offset: int, reason: str) -> dict:
    return {"reason": reason, "detail": "", "runId": None, "eventId": None, "sequence": None, "raw": "",
            "source": {"topic": T, "partition": partition, "offset": offset, "timestampMs": 0}}


def test_each_sent_position_lands_exactly_once():
    sent = [(0, 0), (0, 1), (1, 0)]
    got = landing(sent, [_log(0, 0, 0), _log(1, 0, 1)], [_rej(0, 1, "bad_magic")], T)
    assert (got.lost, got.duplicated, got.redelivered_copies, got.unaccounted) == (0, 0, 0, 0)
    assert (got.committed, got.rejected) == (2, 1)


def test_a_position_nothing_carries_is_lost():
    got = landing([(0, 0), (0, 1), (0, 2)], [_log(0, 0, 0)], [_rej(0, 2, "oversize")], T)
    assert (got.lost, got.lost_at) == (1, [(0, 1)])


def test_other_topics_do_not_count():
    got = landing([(0, 0)], [_log(0, 0, 0, topic="t.other")], [], T)
    assert got.lost == 1


def test_different_records_at_one_position_are_a_duplicate_identical_ones_a_redelivery():
    sent = [(0, 0), (0, 1), (0, 2), (0, 3)]
    log = [_log(0, 0, 0), _log(0, 0, 0),                    # redelivered, byte-identical
           _log(0, 1, 1), _log(0, 1, 2)]                    # committed twice at different sequences
    rejections = [_rej(0, 2, "sequence_gap"), _rej(0, 2, "oversize"),   # rejected for two reasons
                  _rej(0, 3, "bad_magic")]
    got = landing(sent, log + [_log(0, 3, 4)], rejections, T)  # (0, 3): rejected and committed
    assert got.redelivered_copies == 1
    assert (got.duplicated, got.duplicated_at) == (3, [(0, 1), (0, 2), (0, 3)])
    assert got.lost == 0


def test_a_record_from_a_position_never_sent_is_unaccounted():
    assert landing([(0, 0)], [_log(0, 0, 0), _log(0, 9, 1)], [], T).unaccounted == 1


def test_the_summary_says_who_did_not_count():
    ledger = FaultLedger()
    ledger.record("counted", sent=10, accepted=10, lost=2, duplicated=1)
    ledger.record("not_counted", sent=5, accepted=5)
    ledger.record("sent_nothing", injections_tried=3)
    d = ledger.to_dict()
    assert (d["lost"], d["duplicated"]) == (2, 1)
    assert d["lostAndDuplicatedNotCountedBy"] == ["not_counted"]
    assert d["tests"]["not_counted"]["lost"] is None
    assert any("not counted by: not_counted" in line for line in ledger.lines())
