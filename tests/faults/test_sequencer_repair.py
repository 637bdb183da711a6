"""Pure checks of the crash windows the fault suite found in the sequencer's tables (no broker).

A SIGKILL between the index's changelog write and the head's leaves an index entry for a
committed record and a head that is behind it; the redelivered record must move the head
on, or the run's next event is rejected as a gap and everything after it is lost.
"""

from __future__ import annotations

import pytest

from processors.core.sequencing import Accepted, Redelivered, Source, decide
from schemas.canonical import GENESIS, chain_hash

pytestmark = [pytest.mark.faults]


def _doc(seq: int) -> dict:
    return {"eventId": f"r:{seq}", "runId": "r", "type": "variable.changed",
            "payload": {"name": "x", "value": seq}, "timestamp": "2025-01-15T10:00:00.000Z", "sequence": seq}


def test_redelivery_repairs_a_head_left_behind_by_a_crash():
    index: dict[str, list] = {}
    live = durable = None
    for seq in range(3):
        d = decide(live, index.get, _doc(seq), Source("in", 0, 10 + seq, 0))
        assert isinstance(d, Accepted)
        index[d.index_entry[0]] = d.index_entry[1]
        live = d.head
        if seq == 0:
            durable = d.head  # the crash: the heads of 1 and 2 never became durable, their index entries did
    head = durable
    assert head["next"] == 1
    for seq in (1, 2):  # redelivered from the uncommitted offsets
        d = decide(head, index.get, _doc(seq), Source("in", 0, 10 + seq, 0))
        assert isinstance(d, Redelivered) and d.sequence == seq
        assert d.head == {"next": seq + 1, "hash": index[f"r:{seq}"][1]}
        head = d.head
    d = decide(head, index.get, _doc(3), Source("in", 0, 13, 0))
    assert isinstance(d, Accepted)
    expected = GENESIS
    for seq in range(4):
        expected = chain_hash(expected, _doc(seq))
    assert d.committed["hash"] == expected


def test_a_run_state_made_durable_before_its_head_is_neither_refolded_nor_skipped():
    """``heads`` and ``runs`` share one round trip: a crash may leave the run state ahead."""
    from processors.core.fold import fold
    from processors.core.runstate import advance, refold_due

    index: dict[str, list] = {}
    head = durable_head = None
    record = None
    for seq in range(3):
        d = decide(head, index.get, _doc(seq), Source("in", 0, 10 + seq, 0))
        assert isinstance(d, Accepted)
        index[d.index_entry[0]] = d.index_entry[1]
        record = advance(record, d.committed["doc"], d.head["hash"], snapshot_every=100, handoff_mode="auto").record
        head = d.head
        if seq == 0:
            durable_head = d.head  # the crash: the run state of 1 and 2 became durable, their heads did not
    durable_record = record
    assert durable_head["next"] == 1 and durable_record["next"] == 3
    head = durable_head
    for seq in (1, 2):  # redelivered from the uncommitted offsets
        d = decide(head, index.get, _doc(seq), Source("in", 0, 10 + seq, 0))
        assert isinstance(d, Redelivered) and d.head == {"next": seq + 1, "hash": index[f"r:{seq}"][1]}
        assert not refold_due(durable_record, seq)  # already folded: applying it again would count it twice
        head = d.head
    d = decide(head, index.get, _doc(3), Source("in", 0, 13, 0))
    assert isinstance(d, Accepted) and d.committed["doc"]["sequence"] == durable_record["next"]
    after = advance(durable_record, d.committed["doc"], d.head["hash"], snapshot_every=100, handoff_mode="auto")
    state = None
    for seq in range(4):
        state, _ = fold(state, _doc(seq))
    assert after.record["state"] == state  # every event folded exactly once


def test_redelivery_of_an_old_record_leaves_a_current_head_alone():
    index: dict[str, list] = {}
    head = None
    for seq in range(3):
        d = decide(head, index.get, _doc(seq), Source("in", 0, seq, 0))
        index[d.index_entry[0]] = d.index_entry[1]
        head = d.head
    d = decide(head, index.get, _doc(1), Source("in", 0, 1, 0))
    assert isinstance(d, Redelivered) and d.head is None


def test_a_rejection_of_an_unsafe_sequence_is_itself_encodable():
    from processors.core.sequencing import rejection_record
    from streams.codec import encode_record

    doc = {**_doc(0), "sequence": 2 ** 60}
    record = rejection_record("unsafe_integer", "sequence too large", b"{}", Source("in", 0, 1, 0), doc)
    assert record["sequence"] is None and record["eventId"] == "r:0"
    encode_record(record)  # raised EventRejected before: the sequencer agent crashed on it


def test_a_rejection_of_an_oversize_value_stays_small_and_says_what_it_dropped():
    import base64
    import hashlib

    from processors.core.sequencing import RAW_MAX_BYTES, rejection_record
    from streams.codec import encode_record

    raw = b"{" + b"x" * (3 * RAW_MAX_BYTES)
    record = rejection_record("oversize", "too big", raw, Source("in", 0, 1, 0), {"runId": "r" * 10_000})
    assert len(encode_record(record)) < 2 * RAW_MAX_BYTES
    assert base64.b64decode(record["raw"]) == raw[:RAW_MAX_BYTES]
    assert (record["rawTruncated"], record["rawBytes"], record["rawSha256"]) == (
        True, len(raw), hashlib.sha256(raw).hexdigest())
    assert record["runId"] is None
    small = rejection_record("decode_error", "x", b"abc", Source("in", 0, 2, 0))
    assert "rawTruncated" not in small and base64.b64decode(small["raw"]) == b"abc"
