"""Run lifetimes, as pure functions: when a run closes, and what becomes of an event that comes after.

The worker holds a run's head, index and state only while the run can still receive events.
A run **closes** ``grace`` seconds after its terminal event (stragglers and producer retries
still land in that window) and **expires** after ``idle`` seconds without an event. Its table
entries are then deleted, and a small marker remembers for ``closed_retention`` that it was
closed, so a later event of it is refused with its own reason (``run_closed`` /
``run_expired``) instead of starting the run again or being taken for a gap.

The decision to close is made in the sequencer's stream, not beside it: the worker publishes a
**close request** to the run's ingest partition, and the sequencer closes the run when it
reaches that record. Every record of the run before the request was handled with the run open,
every record after it is refused, whichever worker handles them and however often they are
delivered (a redelivery meets the same records in the same order). A request that finds the
run has moved on since it was made (its ``next`` sequence differs) does nothing; the next one
is timed from the run's new head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import orjson

from agentlog.schemas.canonical import jcs

Reason = Literal["completed", "expired"]

#: The first bytes of a close request on the ingest topic: neither Avro's magic byte nor JSON, so
#: any other reader of the topic skips the record as undecodable.
CLOSE_PREFIX = b"\x01agentlog.close\n"


class CloseRequest(TypedDict):
    runId: str
    next: int  # the run's next sequence when the request was made: a run that moved on stays open
    reason: Reason


class ClosedMarker(TypedDict):
    """What the ``closed`` table keeps of a closed run."""

    reason: Reason
    next: int  # the sequence its next event would have had
    hash: str  # its head hash
    at: int  # the ingest offset of the close request (its partition is the run's)


def close_request(run_id: str, next_sequence: int, reason: Reason) -> bytes:
    """The ingest record value asking the sequencer to close ``run_id`` at ``next_sequence``."""
    return CLOSE_PREFIX + jcs({"runId": run_id, "next": next_sequence, "reason": reason})


def read_close_request(value: bytes) -> CloseRequest | None:
    """The close request ``value`` carries, or None when it is not one."""
    if not value.startswith(CLOSE_PREFIX):
        return None
    try:
        request = orjson.loads(value[len(CLOSE_PREFIX):])
    except orjson.JSONDecodeError:
        return None
    if (not isinstance(request, dict) or not isinstance(request.get("runId"), str)
            or type(request.get("next")) is not int or request.get("reason") not in ("completed", "expired")):
        return None
    return {"runId": request["runId"], "next": request["next"], "reason": request["reason"]}


def due(record: Mapping[str, Any], *, grace_s: float, idle_s: float, now_s: float) -> tuple[float, Reason]:
    """When the run of ``record`` (its ``runs`` table record) closes (seconds since the epoch), and why.

    ``record["ts"]`` is the Kafka timestamp (ms) of its last accepted event and ``record["end"]``
    whether that run reached a terminal status; a record without a timestamp is timed from ``now_s``.
    """
    ts = record.get("ts")
    last = ts / 1000.0 if isinstance(ts, int | float) else now_s
    if record.get("end"):
        return last + grace_s, "completed"
    return last + idle_s, "expired"


def closed_marker(request: CloseRequest, head_hash: str, offset: int) -> ClosedMarker:
    return {"reason": request["reason"], "next": request["next"], "hash": head_hash, "at": offset}


def after_close(marker: ClosedMarker, run_id: str, offset: int) -> tuple[str, str] | None:
    """An event of a closed run read at ``offset``: None when it came before the close (already handled),
    else its rejection ``(reason, detail)``."""
    if offset < marker["at"]:
        return None
    reason = "run_closed" if marker["reason"] == "completed" else "run_expired"
    why = "ended" if marker["reason"] == "completed" else "had no event for longer than the idle retention"
    return reason, (f"run {run_id} {why} and was closed after sequence {marker['next'] - 1}; "
                    "events published after that are not appended (publish a new run)")
