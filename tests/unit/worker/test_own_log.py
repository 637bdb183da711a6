"""The log offsets acknowledged to the sequencer, as the live log check asks about them."""

from __future__ import annotations

from agentlog.worker.wiring import OwnLogRecords


def test_a_run_of_acknowledged_offsets_is_one_range_and_nothing_else_is_ours() -> None:
    own = OwnLogRecords()
    for offset in range(100, 200):
        own.add(0, offset)
    assert len(own) == 1
    assert not own.ours(0, 99)
    assert not own.ours(1, 150)  # another partition
    assert [own.ours(0, offset) for offset in (100, 150, 199)] == [True, True, True]
    assert not own.ours(0, 200)
    assert len(own) == 0  # the check has passed the range


def test_a_foreign_record_between_ours_is_not_ours() -> None:
    own = OwnLogRecords()
    for offset in (10, 11, 13, 14):  # 12: another producer's append
        own.add(3, offset)
    assert len(own) == 2
    assert [own.ours(3, offset) for offset in range(10, 15)] == [True, True, False, True, True]


def test_acknowledgements_out_of_order_keep_the_ranges_sorted() -> None:
    own = OwnLogRecords()
    for offset in (20, 21, 5, 6, 21, 7):
        own.add(0, offset)
    assert [own.ours(0, offset) for offset in (4, 5, 6, 7, 8, 19, 20, 21, 22)] == [
        False, True, True, True, False, False, True, True, False]


def test_the_ranges_kept_are_bounded_oldest_dropped_first() -> None:
    own = OwnLogRecords()
    own.MAX_RANGES = 3
    for offset in (0, 2, 4, 6):  # four ranges of one offset each
        own.add(0, offset)
    assert len(own) == 3
    assert not own.ours(0, 0)  # dropped: checked in full
    assert own.ours(0, 2) and own.ours(0, 6)
