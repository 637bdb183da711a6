"""Erasure receipts: signed, bound to what was erased, the same id for a repeated erase."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentlog.core.checkpoint import key_id
from agentlog.core.erasure import receipt_id, sign_receipt, verify_receipt

KEY = Ed25519PrivateKey.generate()
KID = key_id(KEY)


def _receipt(**over):
    args = {"kid": KID, "subject_tag": "tag-1", "run": None, "key_ids": {"r2": "k2", "r1": "k1"},
            "events": {"r1": 20, "r2": 3}, "by": "ops@host", "at_ms": 1_700_000_000_000, **over}
    return sign_receipt(KEY, **args)


def test_a_receipt_verifies_under_its_key_and_lists_every_run_in_order():
    receipt = _receipt()
    assert verify_receipt(receipt, {KID: KEY.public_key()}) is None
    assert [(r["runId"], r["keyId"], r["events"]) for r in receipt["runs"]] == [("r1", "k1", 20), ("r2", "k2", 3)]


def test_its_id_is_what_was_erased_not_when():
    assert _receipt()["receiptId"] == _receipt(at_ms=1, by="someone else")["receiptId"] == receipt_id(
        subject_tag="tag-1", run=None, runs=["r2", "r1"])
    assert _receipt()["receiptId"] != _receipt(key_ids={"r1": "k1"})["receiptId"]


def test_an_altered_or_foreign_receipt_does_not_verify():
    receipt = _receipt()
    assert "altered" in verify_receipt({**receipt, "by": "mallory"}, {KID: KEY.public_key()})
    stranger = Ed25519PrivateKey.generate()
    assert "not among the trusted" in verify_receipt(receipt, {key_id(stranger): stranger.public_key()})
    fewer = {**receipt, "runs": receipt["runs"][:1]}
    assert verify_receipt(fewer, {KID: KEY.public_key()}) is not None
    assert "not an erasure receipt" in verify_receipt({**receipt, "type": "x"}, {KID: KEY.public_key()})
