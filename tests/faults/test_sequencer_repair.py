"""Pure checks of what the sequencer decides for records it has committed before (no broker).

A record delivered again after its transaction committed is recognised by its index entry (same
source partition and offset) and appends nothing; a rejection stays encodable whatever it quotes.
"""

from __future__ import annotations

import pytest

from agentlog.core.runstate import advance
from agentlog.core.sequencing import Redelivered, Source, decide

pytestmark = [pytest.mark.faults]


def _doc(seq: int) -> dict:
    return {"eventId": f"r:{seq}", "runId": "r", "type": "variable.changed",
            "payload": {"name": "x", "value": seq}, "timestamp": "2025-01-15T10:00:00.000Z", "sequence": seq}


def _head(record):
    return None if record is None else {"next": record["next"], "hash": record["head"]}


def test_redelivery_of_a_record_already_folded_changes_nothing():
    index: dict[str, list] = {}
    record = None
    for seq in range(3):
        d = decide(_head(record), index.get, _doc(seq), Source("in", 0, seq, 0))
        index[d.index_entry[0]] = d.index_entry[1]
        record = advance(record, d.committed["doc"], d.committed["hash"], snapshot_every=100,
                         handoff_mode="auto").record
    d = decide(_head(record), index.get, _doc(1), Source("in", 0, 1, 0))
    assert isinstance(d, Redelivered) and d.sequence == 1


def test_a_rejection_of_an_unsafe_sequence_is_itself_encodable():
    from agentlog.core.sequencing import rejection_record
    from agentlog.streams.codec import encode_record

    doc = {**_doc(0), "sequence": 2 ** 60}
    record = rejection_record("unsafe_integer", "sequence too large", b"{}", Source("in", 0, 1, 0), doc)
    assert record["sequence"] is None and record["eventId"] == "r:0"
    encode_record(record)  # raised EventRejected before: the sequencer agent crashed on it


def test_a_rejection_of_an_oversize_value_stays_small_and_says_what_it_dropped():
    import base64
    import hashlib

    from agentlog.core.sequencing import RAW_MAX_BYTES, rejection_record
    from agentlog.streams.codec import encode_record

    raw = b"{" + b"x" * (3 * RAW_MAX_BYTES)
    record = rejection_record("oversize", "too big", raw, Source("in", 0, 1, 0), {"runId": "r" * 10_000})
    assert len(encode_record(record)) < 2 * RAW_MAX_BYTES
    assert base64.b64decode(record["raw"]) == raw[:RAW_MAX_BYTES]
    assert (record["rawTruncated"], record["rawBytes"], record["rawSha256"]) == (
        True, len(raw), hashlib.sha256(raw).hexdigest())
    assert record["runId"] is None
    small = rejection_record("decode_error", "x", b"abc", Source("in", 0, 2, 0))
    assert "rawTruncated" not in small and base64.b64decode(small["raw"]) == b"abc"
