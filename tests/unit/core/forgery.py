"""A signed history as the worker writes it, and a forger's rewrite of it, for the checkpoint tests.

:func:`signed_history` builds what the one-pass sequencer writes for a run (format-2 log records
and a checkpoint every ``every`` events and at terminal events) with the same core functions;
:func:`forge` is what someone with write access to the log does to hide a change: rewrite one
doc and recompute every ``hash`` and ``stateHash`` after it, so the chain checks out again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentlog.core.checkpoint import is_due, sign_checkpoint
from agentlog.core.fold import states_by_index
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.schemas.records import committed_event, record_source

__all__ = ["forge", "rechain", "signed_history"]


def rechain(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Format-2 CommittedEvents for ``docs``: chain from GENESIS, state hash of the fold at each index."""
    out, head = [], GENESIS
    for i, (doc, (_, state_hash)) in enumerate(zip(docs, states_by_index(docs), strict=True)):
        h = chain_hash(head, doc)
        out.append(committed_event(doc=doc, prev_hash=head, hash=h, state_hash=state_hash,
                                   source=record_source(topic="t.ingest", partition=0, offset=i, timestamp_ms=0)))
        head = h
    return out


def signed_history(docs: list[dict[str, Any]], key: Ed25519PrivateKey, *, every: int
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(log records, checkpoints) as the worker writes them for ``docs``."""
    records = rechain(docs)
    checkpoints = [sign_checkpoint(key, run_id=r["doc"]["runId"], sequence=r["doc"]["sequence"], head_hash=r["hash"],
                                   state_hash=r["stateHash"])
                   for r in records if is_due(r["doc"]["sequence"], r["doc"]["type"], every)]
    return records, checkpoints


def forge(records: list[dict[str, Any]], k: int, change: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """``records`` with doc ``k`` changed by ``change`` and every hash and state hash recomputed."""
    docs = [copy.deepcopy(r["doc"]) for r in records]
    change(docs[k])
    forged = rechain(docs)
    for original, new in zip(records, forged, strict=True):
        new["source"] = original["source"]
    return forged
