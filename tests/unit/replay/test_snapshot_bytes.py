"""Re-derivation keeps the run's snapshots as record bytes and decodes one when it is used (no broker).

What must hold: a snapshot read back from the mapping is what ``decode_record`` gives for its record
(the first record per atSequence, as before), it is decoded once however often it is looked at, and the
mapping iterates the same sequences. Corrupt records still fail where they are read (``_snapshots``
decodes each record once to index it); the integration tests run that path on a broker.
"""

from __future__ import annotations

from processors.core.fold import state_hash, states_by_index
from processors.replay.rederive import _pick_snapshot, _snapshot_before, _Snapshots
from streams.codec import decode_record, encode_record
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
