"""The host side of a replay (RFC 0041 §C): start run R' that re-executes recorded run R.

A replay run is an ordinary run with two obligations: its ``run.started`` declares
``replayOf {sourceRunId, fromSeq, mode}`` (that is what makes the store compare it with R when
it ends), and its events before ``fromSeq`` are R's, copied — same content, fresh eventIds,
causation re-pointed at the copies. :func:`start_replay` does both and hands back a run
handle positioned at ``fromSeq``; the host then re-executes from there.

In ``mock`` mode the host must not call the model or the tool but take the result R recorded;
that lookup needs the observable-result cache, which lives with the processors
(``agentlog.replay.mock.MockReplaySession``) — ``streams`` never imports ``processors``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from agentlog.schemas.errors import ReplayError
from agentlog.streams.publisher import Publisher, Run, uuid7
from agentlog.streams.reader import read_run

__all__ = ["REPLAY_MODES", "ReplayRun", "replay_of", "start_replay"]

#: SPEC §7 modes. ``dry_run`` is compared but leaves no verdict record.
REPLAY_MODES = ("verify", "mock", "live", "dry_run")


def replay_of(source_run_id: str, from_seq: int = 0, mode: str = "live") -> dict[str, Any]:
    """The ``replayOf`` object a replay's ``run.started`` payload carries.

    Raises:
        ReplayError: unknown mode or negative ``from_seq``.
    """
    if mode not in REPLAY_MODES:
        raise ReplayError(f"replay mode must be one of {', '.join(REPLAY_MODES)}, not {mode!r}")
    if from_seq < 0:
        raise ReplayError(f"fromSeq must be >= 0, got {from_seq}")
    return {"sourceRunId": source_run_id, "fromSeq": from_seq, "mode": mode}


@dataclass
class ReplayRun:
    """A replay in progress: the run handle plus the source↔replay eventId mapping of the prefix.

    ``run`` emits the replay's events from ``from_seq`` on. Before anything else, when
    ``from_seq == 0``, emit ``run.started`` through :meth:`started` so it carries ``replayOf``.
    """

    run: Run
    source_run_id: str
    from_seq: int
    mode: str
    source: list[dict[str, Any]]
    event_ids: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def replay_id(self, source_event_id: str) -> str | None:
        """The replay's eventId for an event copied from the source prefix."""
        return self.event_ids.get(source_event_id)

    async def started(self, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """Emit ``run.started`` with ``replayOf`` added (only when re-executing from 0)."""
        if self.run.next_sequence != 0:
            raise ReplayError("run.started was copied from the source; the replay continues from fromSeq")
        return await self.run.emit(
            "run.started", {**payload, "replayOf": replay_of(self.source_run_id, 0, self.mode)}, **kw)


async def start_replay(
    publisher: Publisher,
    source_run_id: str,
    *,
    new_run_id: str | None = None,
    mode: str = "live",
    from_seq: int = 0,
) -> ReplayRun:
    """Open replay run R' of ``source_run_id``: copy R's events before ``from_seq``, return the handle.

    The copies keep R's content (payload, nodeId, type) with fresh eventIds and timestamps; a
    ``parentRunId`` naming R is rewritten to R' (it names the run itself). R must be committed.

    Raises:
        ReplayError: R has no committed events, or fewer than ``from_seq``, or a bad mode.
    """
    marker = replay_of(source_run_id, from_seq, mode)
    source = [c["doc"] for c in await read_run(publisher.settings, source_run_id, refuse_erased=True)]
    if not source:
        raise ReplayError(f"run {source_run_id} has no committed events; nothing to replay")
    if len(source) < from_seq or [d["sequence"] for d in source[:from_seq]] != list(range(from_seq)):
        raise ReplayError(f"run {source_run_id} has no contiguous committed prefix of {from_seq} events")
    run_id = new_run_id or f"{source_run_id}.replay-{uuid7()[-12:]}"
    handle = ReplayRun(run=publisher.run(run_id), source_run_id=source_run_id, from_seq=from_seq, mode=mode,
                       source=source)
    for doc in source[:from_seq]:
        payload = copy.deepcopy(doc["payload"])
        if isinstance(payload, dict):
            if doc["type"] == "run.started":
                payload["replayOf"] = marker
            if payload.get("parentRunId") == source_run_id:
                payload["parentRunId"] = run_id
        cause = handle.event_ids.get(doc["causationId"], doc["causationId"]) if "causationId" in doc else None
        sent = await handle.run.emit(doc["type"], payload, node_id=doc.get("nodeId"), caused_by=cause)
        handle.event_ids[doc["eventId"]] = sent["eventId"]
    return handle
