"""``agentlog verify``'s I/O: a run's history and checkpoints from Kafka or from files, then the pure check.

The check itself is :func:`agentlog.core.checkpoint.verify_history`; this module only finds
what it checks. From Kafka: the run's committed log records (first copy of each sequence, as
every reader keeps it) and its records on the ``checkpoints`` topic. From files: an ``agentlog
export`` (RunEventDocs, or CommittedEvents) and, beside it, the checkpoints ``agentlog export
--checkpoints`` wrote (one signed checkpoint per line).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agentlog.core.checkpoint import VerifyFailure, VerifyResult, key_id, load_public_key, verify_history
from agentlog.core.erasure import verify_receipt
from agentlog.replay.exported import export_lines, json_lines
from agentlog.schemas.errors import ReplayError
from agentlog.streams.erasure import read_receipts
from agentlog.streams.reader import read_run, read_topic
from agentlog.streams.settings import Settings

__all__ = ["RunHistory", "load_checkpoints", "load_export", "load_from_log", "load_keys", "verify_run"]


@dataclass(frozen=True)
class RunHistory:
    """What a verification reads: the run's records in sequence order and its checkpoints."""

    records: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    notes: tuple[str, ...] = ()
    #: The erasure receipts that name the run (``agentlog erase``): each must be signed by a trusted key.
    receipts: tuple[dict[str, Any], ...] = ()


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
    """The run's committed log records (with prevHash/hash/stateHash) and its ``checkpoints`` records.

    A record without stateHash (log format 1) is read as it is: :func:`verify_run` refuses it.
    """
    log = await read_run(settings, run_id, opened=False)  # the stored form is what the chain covers
    checkpoints = [value async for _, _, _, value in read_topic(settings, "checkpoints", key=run_id)
                   if value.get("runId") == run_id]
    notes: tuple[str, ...] = ()
    if log.conflicts:
        notes = (f"{len(log.conflicts)} later, different copies of committed sequences were ignored (the first "
                 f"copy is the committed one): sequences {sorted({c['sequence'] for c in log.conflicts})}",)
    receipts = tuple(r for r in await read_receipts(settings)
                     if any(isinstance(e, dict) and e.get("runId") == run_id for e in r.get("runs", [])))
    return RunHistory(records=sorted(log, key=lambda r: r["doc"].get("sequence", -1)), checkpoints=checkpoints,
                      notes=notes, receipts=receipts)


def load_export(path: Path, run_id: str, *, checkpoints: Path | None = None) -> RunHistory:
    """A run's docs (bare or as CommittedEvents) from an ``agentlog export`` file, with its checkpoints file.

    Lines of other runs are skipped (a file may hold a run tree). Records keep file order; a
    verification expects sequence order, which is the order export writes. Without
    ``checkpoints`` nothing is signed, and the result's notes say so.

    Raises:
        ReplayError: ``export_unreadable`` (the export cannot be read, or a line is not a JSON
            object or is a checkpoint) or ``checkpoints_unreadable`` (see :func:`load_checkpoints`).
    """
    records = [value for _, value in export_lines(path, code="export_unreadable")
               if (value["doc"] if isinstance(value.get("doc"), dict) else value).get("runId") == run_id]
    if checkpoints is None:
        return RunHistory(records=records, checkpoints=[], notes=(
            "no checkpoints file given (--checkpoints PATH, as `agentlog export --checkpoints PATH` writes it): "
            "no signature covers this export",))
    return RunHistory(records=records, checkpoints=load_checkpoints(checkpoints, run_id))


def load_checkpoints(path: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's signed checkpoints from a file of them, one JSON object per line (``agentlog export --checkpoints``).

    Checkpoints of other runs are skipped. A checkpoint that is malformed but names its run is
    kept, so the verification reports it (``bad_checkpoint``, ``signature_invalid``).

    Raises:
        ReplayError (``checkpoints_unreadable``): the file cannot be read, or a line is not a JSON
            object naming its run, or is a run event (the export given in its place).
    """
    code = "checkpoints_unreadable"
    found: list[dict[str, Any]] = []
    for number, value in json_lines(path, code=code):
        if isinstance(value, dict) and ("eventId" in value or "doc" in value):
            raise ReplayError(f"{path}:{number}: a run event, not a signed checkpoint; give the export with "
                              "--export and the checkpoints with --checkpoints", code=code)
        if not isinstance(value, dict) or not isinstance(value.get("runId"), str):
            raise ReplayError(f"{path}:{number}: not a signed checkpoint (a JSON object with runId, sequence, "
                              "headHash, stateHash, keyId, signature)", code=code)
        if value["runId"] == run_id:
            found.append(value)
    return found


def verify_run(history: RunHistory, run_id: str, keys: Mapping[str, Ed25519PublicKey], *, handoff_mode: str,
               allow_unsigned_tail: bool = False) -> VerifyResult:
    """:func:`verify_history` over a loaded history; the loader's notes are kept in the result.

    Raises:
        LogFormatError: a log record of the history carries no ``stateHash`` (log format 1).
    """
    result = verify_history(run_id, history.records, history.checkpoints, keys, handoff_mode=handoff_mode,
                            allow_unsigned_tail=allow_unsigned_tail)
    if history.notes:
        result = replace(result, notes=tuple(history.notes) + result.notes)
    for receipt in history.receipts:
        problem = verify_receipt(receipt, keys)
        if problem is not None and result.failure is None:
            result = replace(result, failure=VerifyFailure(
                "erasure_receipt_invalid", 0, f"erasure receipt {receipt.get('receiptId')}: {problem}"))
        elif problem is None:
            erased_at = datetime.fromtimestamp(receipt["atMs"] / 1000, tz=UTC).isoformat(timespec="seconds")
            result = replace(result, notes=(*result.notes, f"content erased {erased_at} by {receipt.get('by')} "
                                                           f"(receipt {receipt['receiptId']}, signature verified)"))
    return result
