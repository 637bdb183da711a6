"""Re-derivation keeps the run's snapshots as record bytes and decodes one when it is used (no broker).

What must hold: a snapshot read back from the mapping is what ``decode_record`` gives for its record
(the first record per atSequence), it is decoded once however often it is looked at, and the
mapping iterates the same sequences. Corrupt records still fail where they are read (``_snapshots``
decodes each record once to index it); the integration tests run that path on a broker.
"""

from __future__ import annotations

import pytest

from agentlog.core.fold import state_hash, states_by_index
from agentlog.replay.rederive import _index_snapshot, _pick_snapshot, _snapshot_before, _Snapshots
from agentlog.schemas.canonical import canonical_leaf
from agentlog.schemas.errors import EventRejected
from agentlog.streams.codec import decode_record, encode_record
from tests.unit.core.runs import realistic_run


def _snapshot_records(run_id: str) -> list[bytes]:
    states = states_by_index(realistic_run(run_id, "check"))
    return [encode_record({"runId": run_id, "atSequence": i, "logOffset": 100 + i, "logPartition": 0,
                           "state": state, "stateHash": s_hash, "headHash": f"{i:064x}"})
            for i, (state, s_hash) in enumerate(states) if i % 3 == 0]


def test_a_kept_snapshot_is_its_record_decoded_once_and_the_first_copy_wins():
    records = _snapshot_records("r")
    snapshots = _Snapshots()
    for raw in records:
        snapshots.add(decode_record(raw)["atSequence"], raw)
    first = decode_record(records[1])
    altered = encode_record({**first, "headHash": "f" * 64})
    snapshots.add(first["atSequence"], altered)  # a later copy of the same index: the first is kept
    assert list(snapshots) == [decode_record(r)["atSequence"] for r in records]
    assert len(snapshots) == len(records)
    for raw in records:
        at = decode_record(raw)["atSequence"]
        assert snapshots[at] == decode_record(raw)
        assert snapshots[at] is snapshots[at]  # decoded once
        assert state_hash(snapshots[at]["state"]) == snapshots[at]["stateHash"]
    assert 1 not in snapshots and snapshots.get(1) is None


def test_the_snapshot_picked_is_the_latest_before_the_start_as_with_decoded_snapshots():
    records = _snapshot_records("r")
    kept = _Snapshots()
    decoded: dict[int, dict] = {}
    for raw in records:
        value = decode_record(raw)
        kept.add(value["atSequence"], raw)
        decoded.setdefault(value["atSequence"], value)
    for start in range(0, max(decoded) + 3):
        assert _pick_snapshot(kept, {}, start) == _pick_snapshot(decoded, {}, start)


def test_a_replay_from_an_offset_decodes_only_the_snapshot_it_starts_from():
    """``_snapshot_before`` skips the snapshots at or after the start by the logOffset read when indexing.

    Same answer as with decoded snapshots for every start offset and sequence, malformed offsets
    included, and at most the chosen one is decoded again (the bench's replay from its middle
    decoded about a hundred whole states a second time before).
    """
    records = _snapshot_records("r")
    first = decode_record(records[2])
    records[2] = encode_record({**first, "logOffset": "not an offset"})
    kept, decoded = _Snapshots(), {}
    for raw in records:
        value = decode_record(raw)
        kept.add(value["atSequence"], raw, value.get("logOffset"))
        decoded.setdefault(value["atSequence"], value)
    offsets = [decode_record(r)["logOffset"] for r in records if isinstance(decode_record(r)["logOffset"], int)]
    for start in range(0, max(offsets) + 3):
        fresh = _Snapshots()
        for raw in records:
            value = decode_record(raw)
            fresh.add(value["atSequence"], raw, value.get("logOffset"))
        assert _snapshot_before(fresh, from_offset=start, from_seq=None) == \
            _snapshot_before(decoded, from_offset=start, from_seq=None)
        assert len(fresh._decoded) <= 1
    for seq in range(0, max(decoded) + 3):
        assert _snapshot_before(kept, from_offset=None, from_seq=seq) == \
            _snapshot_before(decoded, from_offset=None, from_seq=seq)


# --- snapshots indexed from their JCS prefix, decoded when used --------------------------------------

def _indexed(records: list[bytes], run_id: str) -> _Snapshots:
    out = _Snapshots()
    for raw in records:
        _index_snapshot(out, raw, run_id, canonical_leaf(run_id) + b',"state":')
    return out


def _decoded_index(records: list[bytes], run_id: str) -> dict[int, tuple[bytes, object]]:
    """What indexing by decoding every record (before this session) kept: atSequence -> (bytes, logOffset)."""
    out: dict[int, tuple[bytes, object]] = {}
    for raw in records:
        value = decode_record(raw)
        if value.get("runId") == run_id and isinstance(at := value.get("atSequence"), int):
            out.setdefault(at, (raw, value.get("logOffset")))
    return out


def test_snapshots_indexed_from_their_prefix_are_what_decoding_them_gives():
    """Worker-written records (the prefix), and every other shape (decoded): same sequences, bytes, offsets."""
    run_id = 'r"\u00e9\U0001f600'  # a run id that JCS escapes and one past U+FFFF
    records = _snapshot_records(run_id)
    first = decode_record(records[1])
    records += [
        encode_record({**first, "atSequence": 10**15 + 7, "logOffset": 10**15}),  # beyond the prefix's digits
        encode_record({**first, "atSequence": 99, "headHash": "A" * 64}),  # not lower-case hex
        encode_record({k: v for k, v in first.items() if k != "logPartition"} | {"atSequence": 98}),
        encode_record({**first, "atSequence": 97, "logOffset": "x"}),
        encode_record({**first, "atSequence": 96, "runId": "another run"}),
        encode_record({**first, "atSequence": 95, "runId": run_id + "x"}),
        encode_record({**first, "atSequence": 94.5}),
        b'{"runId":' + canonical_leaf(run_id) + b',"atSequence":93,"logOffset":5,"state":{}}',  # not in JCS order
        encode_record({**first, "headHash": "e" * 64}),  # a later copy of an index: the first is kept
    ]
    kept = _indexed(records, run_id)
    expected = _decoded_index(records, run_id)
    assert list(kept) == list(expected)
    for at, (raw, log_offset) in expected.items():
        assert kept._raw[at] == raw and kept.log_offset(at) == log_offset
        assert kept[at] == decode_record(raw)
    assert {99, 98, 97, 93, 10**15 + 7} <= set(kept) and not {96, 95} & set(kept)
    assert kept._decoded.keys() == expected.keys()  # decoded just now, by the loop above


def test_a_record_that_is_no_snapshot_still_fails_when_read_and_a_broken_one_when_used():
    run_id = "r"
    good = _snapshot_records(run_id)[0]
    with pytest.raises(EventRejected):
        _indexed([b"not json at all"], run_id)
    with pytest.raises(EventRejected):
        _indexed([good[:40]], run_id)  # cut inside the prefix: decoded when read, and fails
    cut = good[:-40]  # the prefix intact, the state cut off
    kept = _indexed([cut], run_id)
    at = decode_record(good)["atSequence"]
    assert list(kept) == [at]
    with pytest.raises(EventRejected):
        kept[at]  # noqa: B018 - decoding it is the point
    with pytest.raises(EventRejected):
        _snapshot_before(kept, from_offset=None, from_seq=at + 1)


def test_worker_written_snapshots_are_indexed_without_decoding(monkeypatch):
    from agentlog.replay import rederive

    decoded = []
    monkeypatch.setattr(rederive, "decode_record", lambda raw: decoded.append(raw) or decode_record(raw))
    for run_id in ("r", 'r"\u00e9\U0001f600', "bench-replay-1"):
        records = _snapshot_records(run_id)
        kept = _indexed(records, run_id)
        assert not decoded and len(kept) == len(records)
        assert list(kept) == list(_decoded_index(records, run_id))
