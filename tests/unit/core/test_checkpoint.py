"""Signed checkpoints: the statement's bytes, signatures, key ids and rotation, and what
:func:`verify_history` finds in an untouched, a forged, a truncated and an unsigned history."""

from __future__ import annotations

import copy
import hashlib

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentlog.core.checkpoint import (
    CheckpointKeyError,
    is_due,
    key_id,
    load_private_key,
    load_public_key,
    private_key_pem,
    public_key_pem,
    sign_checkpoint,
    statement_bytes,
    verify_checkpoint,
    verify_history,
)
from agentlog.core.fold import states_by_index
from agentlog.core.runstate import chain_problem
from agentlog.schemas.errors import LogFormatError
from tests.faults.gen import synthetic_run
from tests.unit.core.forgery import forge, signed_history
from tests.unit.core.runs import realistic_run

# RFC 8032 §7.1 TEST 1: a fixed key, so the expected bytes below are hand-checkable.
SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
KEY = Ed25519PrivateKey.from_private_bytes(SEED)
PUB = KEY.public_key()
KID = hashlib.sha256(bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")).hexdigest()
OTHER = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _keys(*private: Ed25519PrivateKey) -> dict:
    return {key_id(k): k.public_key() for k in private}


def _run(n: int = 25) -> list[dict]:
    import random

    return synthetic_run("r-sign", n, random.Random(7))


# -- the statement ------------------------------------------------------------------------------


def test_key_id_is_the_sha256_of_the_raw_public_key_for_both_halves():
    assert key_id(PUB) == key_id(KEY) == KID
    assert key_id(load_public_key(public_key_pem(PUB))) == KID
    assert key_id(load_private_key(private_key_pem(KEY))) == KID


def test_statement_bytes_are_jcs_written_out_by_hand():
    data = statement_bytes(run_id="run-é", sequence=99, head_hash="a" * 64, state_hash="b" * 64, key=KID)
    expected = ('{"headHash":"' + "a" * 64 + '","keyId":"' + KID + '","purpose":"agentlog/checkpoint/v1",'
                '"runId":"run-é","sequence":99,"stateHash":"' + "b" * 64 + '"}').encode("utf-8")
    assert data == expected


def test_signatures_are_deterministic_and_verify():
    a = sign_checkpoint(KEY, run_id="r", sequence=9, head_hash="a" * 64, state_hash="b" * 64)
    b = sign_checkpoint(KEY, run_id="r", sequence=9, head_hash="a" * 64, state_hash="b" * 64)
    assert a == b  # a redelivered batch re-signs to the same bytes
    assert set(a) == {"runId", "sequence", "headHash", "stateHash", "keyId", "signature"}
    assert a["keyId"] == KID
    assert verify_checkpoint(a, _keys(KEY)) is None


def test_a_checkpoint_of_an_unknown_or_wrong_key_does_not_verify():
    cp = sign_checkpoint(KEY, run_id="r", sequence=9, head_hash="a" * 64, state_hash="b" * 64)
    assert verify_checkpoint(cp, _keys(OTHER)) == "unknown_key"
    assert verify_checkpoint(cp, {KID: OTHER.public_key()}) == "signature_invalid"  # the id names another key
    forged = sign_checkpoint(OTHER, run_id="r", sequence=9, head_hash="a" * 64, state_hash="b" * 64, kid=KID)
    assert verify_checkpoint(forged, _keys(KEY)) == "signature_invalid"  # claims KEY's id, signed by another


@pytest.mark.parametrize("field, value", [("runId", "r2"), ("sequence", 10), ("headHash", "c" * 64),
                                          ("stateHash", "c" * 64), ("keyId", key_id(OTHER)),
                                          ("signature", "AAAA"), ("signature", "not base64!")])
def test_every_statement_field_is_covered_by_the_signature(field, value):
    cp = dict(sign_checkpoint(KEY, run_id="r", sequence=9, head_hash="a" * 64, state_hash="b" * 64))
    cp[field] = value
    assert verify_checkpoint(cp, _keys(KEY, OTHER)) == "signature_invalid"


def test_malformed_checkpoints_are_named_so():
    cp = dict(sign_checkpoint(KEY, run_id="r", sequence=9, head_hash="a" * 64, state_hash="b" * 64))
    assert verify_checkpoint({k: v for k, v in cp.items() if k != "signature"}, _keys(KEY)) == "bad_checkpoint"
    assert verify_checkpoint({**cp, "sequence": "9"}, _keys(KEY)) == "bad_checkpoint"


def test_key_files_of_another_kind_are_refused_with_a_clear_error():
    with pytest.raises(CheckpointKeyError):
        load_public_key(b"not a pem")
    ecdsa = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(CheckpointKeyError, match="not an Ed25519 key"):
        load_private_key(ecdsa.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    with pytest.raises(CheckpointKeyError, match="not an Ed25519 key"):
        load_public_key(ecdsa.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))


def test_due_every_n_events_and_at_every_terminal_event():
    assert [s for s in range(25) if is_due(s, "variable.changed", 10)] == [9, 19]
    assert is_due(3, "run.completed", 10) and is_due(3, "run.failed", 0) and is_due(3, "run.cancelled", 100)
    assert not any(is_due(s, "variable.changed", 0) for s in range(50))


# -- a history ----------------------------------------------------------------------------------


def test_an_untouched_history_verifies_from_log_records_and_from_bare_docs():
    docs = _run()
    records, cps = signed_history(docs, KEY, every=10)
    assert [c["sequence"] for c in cps] == [9, 19, 24]
    for history in (records, docs):
        result = verify_history("r-sign", history, cps, _keys(KEY))
        assert result.verified, result.failure
        assert (result.events, result.checkpoints_verified, result.last_signed) == (25, 3, 24)
        assert result.key_ids == (KID,) and result.unsigned_tail is None
        assert result.head_hash == records[-1]["hash"]


def test_the_realistic_run_verifies_under_its_handoff_mode():
    docs = realistic_run("run-1", mode="derive")
    records, cps = signed_history(docs, KEY, every=4)
    assert verify_history("run-1", records, cps, _keys(KEY), handoff_mode="auto").verified


def test_a_forgery_with_recomputed_hashes_passes_the_chain_check_and_fails_at_its_checkpoint():
    docs = _run()
    records, cps = signed_history(docs, KEY, every=10)
    k = 13

    def change(doc):
        doc["payload"] = {"name": "forged", "value": -1}
        doc["type"] = "variable.changed"

    forged = forge(records, k, change)
    # today's chain check: every record's hash continues the chain and its stateHash is the fold's
    assert all(chain_problem(r) is None for r in forged)
    assert all(a["prevHash"] == b["hash"] for a, b in zip(forged[1:], forged, strict=False))
    assert [r["stateHash"] for r in forged] == [h for _, h in states_by_index([r["doc"] for r in forged])]
    result = verify_history("r-sign", forged, cps, _keys(KEY))
    f = result.failure
    assert f is not None and f.code == "checkpoint_mismatch"
    assert (f.at_sequence, f.checkpoint_sequence) == (10, 19)  # the forgery lies in 10..19; 0..9 still verify
    assert f.at_sequence <= k <= f.checkpoint_sequence
    assert result.last_signed == 9 and result.checkpoints_verified == 1
    # exported without hashes the same forgery fails the same way
    assert verify_history("r-sign", [r["doc"] for r in forged], cps, _keys(KEY)).failure == f


def test_with_a_checkpoint_at_every_event_the_forged_index_is_exact():
    docs = _run()
    records, cps = signed_history(docs, KEY, every=1)
    forged = forge(records, 13, lambda d: d.update(timestamp="2030-01-01T00:00:00.000Z"))
    f = verify_history("r-sign", forged, cps, _keys(KEY)).failure
    assert (f.code, f.at_sequence, f.checkpoint_sequence) == ("checkpoint_mismatch", 13, 13)


def test_a_log_record_without_state_hash_is_log_format_1_and_is_not_verified():
    records, cps = signed_history(_run(), KEY, every=10)
    old = copy.deepcopy(records)
    for r in old[7:]:
        del r["stateHash"]  # what an agentlog before 0.2 committed
    with pytest.raises(LogFormatError) as e:
        verify_history("r-sign", old, cps, _keys(KEY))
    assert e.value.code == "log_format_unsupported"
    assert str(e.value).startswith("log record run r-sign, sequence 7: this log was written by an agentlog before 0.2")
    # its docs alone (an export) carry no hashes to hold against it: they are verified as docs
    assert verify_history("r-sign", [r["doc"] for r in old], cps, _keys(KEY)).verified


def test_a_naive_rewrite_fails_the_chain_check_at_its_index():
    records, cps = signed_history(_run(), KEY, every=10)
    tampered = copy.deepcopy(records)
    tampered[13]["doc"]["payload"] = {"name": "x", "value": 1}
    f = verify_history("r-sign", tampered, cps, _keys(KEY)).failure
    assert (f.code, f.at_sequence) == ("hash_chain_broken", 13)
    restamped = copy.deepcopy(records)
    restamped[13]["stateHash"] = "0" * 64
    assert verify_history("r-sign", restamped, cps, _keys(KEY)).failure.code == "state_hash_mismatch"


def test_a_rewritten_checkpoint_fails_its_signature():
    docs = _run()
    records, cps = signed_history(docs, KEY, every=10)
    forged = forge(records, 13, lambda d: d.update(nodeId="evil"))
    resigned = [dict(c) for c in cps]
    resigned[1]["headHash"], resigned[1]["stateHash"] = forged[19]["hash"], forged[19]["stateHash"]
    f = verify_history("r-sign", forged, resigned, _keys(KEY)).failure
    assert (f.code, f.at_sequence, f.checkpoint_sequence) == ("signature_invalid", 10, 19)
    # ... and a forger's own key is not one the verifier was given
    own = [cps[0], sign_checkpoint(OTHER, run_id="r-sign", sequence=19, head_hash=forged[19]["hash"],
                                   state_hash=forged[19]["stateHash"]), cps[2]]
    assert verify_history("r-sign", forged, own, _keys(KEY)).failure.code == "unknown_key"


def test_rotated_keys_verify_with_every_key_given():
    docs = _run()
    records, old = signed_history(docs, KEY, every=10)
    _, new = signed_history(docs, OTHER, every=10)
    rotated = [old[0], new[1], new[2]]  # the worker restarted with a new key after sequence 9
    result = verify_history("r-sign", records, rotated, _keys(KEY, OTHER))
    assert result.verified and result.key_ids == (KID, key_id(OTHER))
    f = verify_history("r-sign", records, rotated, _keys(OTHER)).failure
    assert (f.code, f.at_sequence, f.checkpoint_sequence) == ("unknown_key", 0, 9)


def test_a_deleted_terminal_checkpoint_is_detected_and_a_deleted_middle_one_is_not():
    records, cps = signed_history(_run(), KEY, every=10)
    f = verify_history("r-sign", records, cps[:2], _keys(KEY)).failure
    assert (f.code, f.at_sequence, f.checkpoint_sequence) == ("terminal_checkpoint_missing", 20, 24)
    # the README's limit: a lost middle checkpoint only widens the span the next one vouches for
    assert verify_history("r-sign", records, [cps[0], cps[2]], _keys(KEY)).verified


def test_a_truncated_history_is_detected_by_the_checkpoints_beyond_it():
    records, cps = signed_history(_run(), KEY, every=10)
    f = verify_history("r-sign", records[:20], cps, _keys(KEY)).failure
    assert (f.code, f.at_sequence) == ("checkpoint_beyond_history", 20)


def test_an_unsigned_tail_fails_unless_allowed():
    docs = _run()
    records, cps = signed_history(docs[:15], KEY, every=10)  # a run in progress: 10..14 not yet signed
    f = verify_history("r-sign", records, cps, _keys(KEY)).failure
    assert (f.code, f.at_sequence) == ("unsigned_tail", 10)
    allowed = verify_history("r-sign", records, cps, _keys(KEY), allow_unsigned_tail=True)
    assert allowed.verified and allowed.unsigned_tail == (10, 14) and allowed.last_signed == 9
    assert verify_history("r-sign", records, [], _keys(KEY), allow_unsigned_tail=True).unsigned_tail == (0, 14)


def test_gaps_other_runs_and_empty_histories_are_named():
    records, cps = signed_history(_run(), KEY, every=10)
    f = verify_history("r-sign", records[:5] + records[6:], cps, _keys(KEY)).failure
    assert (f.code, f.at_sequence) == ("log_gap", 5)
    assert verify_history("other", records, cps, _keys(KEY)).failure.code == "wrong_run"
    assert verify_history("r-sign", [], cps, _keys(KEY)).failure.code == "empty_history"


def test_redelivered_checkpoints_count_once():
    records, cps = signed_history(_run(), KEY, every=10)
    result = verify_history("r-sign", records, cps + [dict(c) for c in cps], _keys(KEY))
    assert result.verified and result.checkpoints_verified == 3


def test_an_event_that_cannot_be_canonicalised_and_a_negative_checkpoint_are_named():
    records, cps = signed_history(_run(), KEY, every=10)
    docs = [r["doc"] for r in records]
    bad = copy.deepcopy(docs)
    bad[3]["payload"] = {"name": "n", "value": 2**60}  # beyond I-JSON: no JCS form, so no hash
    f = verify_history("r-sign", bad, cps, _keys(KEY)).failure
    assert (f.code, f.at_sequence) == ("bad_event", 3)
    negative = dict(cps[0], sequence=-1)
    assert verify_history("r-sign", docs, [negative, *cps], _keys(KEY)).failure.code == "bad_checkpoint"
