"""Erasure receipts: what an ``agentlog erase`` did, signed by the worker's checkpoint key.

A receipt names what was erased (a subject's tag or a run), every run its keys were deleted for with the key
ids and how many log events each holds, who erased and when. Its id is a digest of what was erased (the request
and the runs), not of when: an erase interrupted and run again finds the receipt it already wrote, so each
erasure has exactly one. ``agentlog verify`` checks the receipts that name a run: an erased run must have one,
signed by a trusted key, and every receipt's signature must hold.

The receipt holds no content and no subject id (only its tag, :meth:`agentlog.core.keyring.KeyWrapper.tag`).

Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agentlog.schemas.canonical import jcs

__all__ = ["RECEIPT_TYPE", "receipt_id", "sign_receipt", "verify_receipt"]

RECEIPT_TYPE = "agentlog.erasure/1"


def receipt_id(*, subject_tag: str | None, run: str | None, runs: list[str]) -> str:
    """The id of the erasure of ``subject_tag`` (or of ``run``) reaching ``runs``: the same for a repeated erase."""
    return hashlib.sha256(jcs({"subject": subject_tag, "run": run, "runs": sorted(runs)})).hexdigest()


def sign_receipt(key: Ed25519PrivateKey, *, kid: str, subject_tag: str | None, run: str | None,
                 key_ids: Mapping[str, str], events: Mapping[str, int], by: str, at_ms: int) -> dict[str, Any]:
    """A signed receipt: ``key_ids`` and ``events`` map every erased run to its key id and its log event count."""
    runs = sorted(key_ids)
    body: dict[str, Any] = {
        "type": RECEIPT_TYPE,
        "receiptId": receipt_id(subject_tag=subject_tag, run=run, runs=runs),
        "subject": subject_tag,
        "run": run,
        "runs": [{"runId": r, "keyId": key_ids[r], "events": int(events.get(r, 0))} for r in runs],
        "by": by,
        "atMs": at_ms,
        "keyId": kid,
    }
    return {**body, "signature": base64.b64encode(key.sign(jcs(body))).decode("ascii")}


def verify_receipt(receipt: Mapping[str, Any], keys: Mapping[str, Ed25519PublicKey]) -> str | None:
    """None when ``receipt`` is signed by one of ``keys`` and unaltered; else what is wrong with it."""
    if receipt.get("type") != RECEIPT_TYPE:
        return f"not an erasure receipt (type {receipt.get('type')!r})"
    key = keys.get(str(receipt.get("keyId")))
    if key is None:
        return f"signed by key {receipt.get('keyId')}, which is not among the trusted public keys"
    body = {k: v for k, v in receipt.items() if k != "signature"}
    try:
        key.verify(base64.b64decode(str(receipt.get("signature", "")), validate=True), jcs(body))
    except (InvalidSignature, ValueError):
        return "its signature does not verify: the receipt was altered"
    runs = [r.get("runId") for r in receipt.get("runs", []) if isinstance(r, Mapping)]
    expected = receipt_id(subject_tag=receipt.get("subject"), run=receipt.get("run"), runs=runs)  # type: ignore[arg-type]
    if receipt.get("receiptId") != expected:
        return "its receiptId does not match what it erased"
    return None
