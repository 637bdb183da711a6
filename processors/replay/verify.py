"""``agentlog verify``'s I/O: a run's history and checkpoints from Kafka or an export, then the pure check.

The check itself is :func:`processors.core.checkpoint.verify_history`; this module only finds
what it checks. From Kafka: the run's committed log records (first copy of each sequence, as
every reader keeps it) and its records on the ``checkpoints`` topic. From an export
(``agentlog export``): the RunEventDoc lines and the checkpoint lines (:data:`CHECKPOINT_LINE_KEY`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from processors.core.checkpoint import VerifyResult, key_id, load_public_key, verify_history
from processors.replay.exported import json_lines
from schemas.errors import ReplayError
from streams.reader import read_run, read_topic
from streams.settings import Settings

__all__ = ["CHECKPOINT_LINE_KEY", "RunHistory", "checkpoint_line", "load_export", "load_from_log", "load_keys",
           "verify_run"]

#: An export line ``{"checkpoint": {…Checkpoint}}``: never a RunEventDoc (those have no such key).
CHECKPOINT_LINE_KEY = "checkpoint"


def checkpoint_line(record: Mapping[str, Any]) -> dict[str, Any]:
    """How ``agentlog export`` writes a checkpoint beside the run's docs."""
    return {CHECKPOINT_LINE_KEY: dict(record)}


@dataclass(frozen=True)
class RunHistory:
    """What a verification reads: the run's records in sequence order and its checkpoints."""

    records: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    notes: tuple[str, ...] = ()


def load_keys(pems: Iterable[tuple[str, bytes]]) -> dict[str, Ed25519PublicKey]:
    """``{keyId: key}`` from ``(where, PEM bytes)`` pairs (``--public-key`` files).

    Raises:
        CheckpointKeyError: one of them is not an Ed25519 public key PEM.
    """
    keys: dict[str, Ed25519PublicKey] = {}
    for where, pem in pems:
        key = load_public_key(pem, where=where)
        keys[key_id(key)] = key
    return keys


async def load_from_log(settings: Settings, run_id: str) -> RunHistory:
    """The run's committed log records (with prevHash/hash/stateHash) and its ``checkpoints`` records."""
    log = await read_run(settings, run_id)
    checkpoints = [value async for _, _, _, value in read_topic(settings, "checkpoints", key=run_id)
                   if value.get("runId") == run_id]
    notes: tuple[str, ...] = ()
    if log.conflicts:
        notes = (f"{len(log.conflicts)} later, different copies of committed sequences were ignored (the first "
                 f"copy is the committed one): sequences {sorted({c['sequence'] for c in log.conflicts})}",)
    return RunHistory(records=sorted(log, key=lambda r: r["doc"].get("sequence", -1)), checkpoints=checkpoints,
                      notes=notes)


def load_export(path: Path, run_id: str) -> RunHistory:
    """A run's docs (bare or as CommittedEvents) and checkpoint lines from an ``agentlog export`` file.

    Lines of other runs are skipped (a file may hold a run tree). Records keep file order; a
    verification expects sequence order, which is the order export writes.

    Raises:
        ReplayError: the file cannot be read or a line is not a JSON object.
    """
    records: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    for number, value in json_lines(path, code="export_unreadable"):
        if not isinstance(value, dict):
            raise ReplayError(f"{path}:{number}: expected a JSON object", code="export_unreadable")
        if isinstance(value.get(CHECKPOINT_LINE_KEY), dict):
            if value[CHECKPOINT_LINE_KEY].get("runId") == run_id:
                checkpoints.append(value[CHECKPOINT_LINE_KEY])
            continue
        doc = value["doc"] if isinstance(value.get("doc"), dict) else value
        if doc.get("runId") == run_id:
            records.append(value)
    return RunHistory(records=records, checkpoints=checkpoints)


def verify_run(history: RunHistory, run_id: str, keys: Mapping[str, Ed25519PublicKey], *, handoff_mode: str,
               allow_unsigned_tail: bool = False) -> VerifyResult:
    """:func:`verify_history` over a loaded history; the loader's notes are kept in the result."""
    result = verify_history(run_id, history.records, history.checkpoints, keys, handoff_mode=handoff_mode,
                            allow_unsigned_tail=allow_unsigned_tail)
    if history.notes:
        result = replace(result, notes=tuple(history.notes) + result.notes)
    return result
