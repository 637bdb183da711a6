"""Host replay comparison (RFC 0041 §C): a run that declares ``replayOf`` is
compared with its source when it reaches a terminal status (the worker's run-state
agent asks, :mod:`agentlog.worker.runstate`, and sends the verdict).

The comparison itself is :func:`agentlog.replay.tree.compare_tree` — the same
engine as ``agentlog compare`` — fed with both run trees as read back from the
committed log (deduplicated by sequence). ``dry_run`` replays are compared and
counted but emit no verdict record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from agentlog.core.sealing import DataKey, Place, open_record, seal_record, sealed_members
from agentlog.metrics import METRICS
from agentlog.replay.compare import ComparisonResult, compare_runs
from agentlog.replay.compare import record as record_counters
from agentlog.replay.served import TERMINAL_TYPES
from agentlog.replay.tree import compare_tree
from agentlog.schemas.errors import ReplayError
from agentlog.schemas.records import Verdict, verdict
from agentlog.streams.keyring import load_keyring
from agentlog.streams.reader import read_run, read_topic
from agentlog.streams.settings import Settings

log = logging.getLogger("agentlog.replay")


def verdict_record(request: Mapping[str, Any], result: ComparisonResult, detail: str | None = None) -> Verdict:
    """The verdict of a comparison that was made: the engine's result, told about the replay run it judged."""
    body = result.to_json_dict()
    return verdict(
        replay_run_id=request["replayRunId"],
        source_run_id=request.get("sourceRunId"),
        mode=request.get("mode", "live"),
        verdict=body["verdict"],
        error_code=body["errorCode"],
        first_divergence=body["firstDivergence"],
        events=body["events"],
        compared_through=result.compared_through,
        binding_diff=body.get("bindingDiff"),
        detail=detail,
        reordered=body.get("reordered"),
        path=body.get("path"),
    )


#: What a verdict holds of the runs' content (the values a divergence names, its path, its detail, a refusal's
#: reason): sealed under the replay run's key where the verdict is stored, like the run itself. The path is content
#: too: below a payload member it names the keys of a host's values (``variables.goal.<a key the host chose>``).
VERDICT_CONTENT: tuple[Place, ...] = (("firstDivergence", "expected"), ("firstDivergence", "actual"),
                                      ("firstDivergence", "path"), ("firstDivergence", "detail"))


def _verdict_paths(record: Mapping[str, Any]) -> list[Place]:
    events = record.get("events") or []
    return [*VERDICT_CONTENT, *((("events", i, "payload", "refusalReason")) for i in range(len(events)))]


def stored_verdict(record: Verdict, key: DataKey | None) -> Verdict:
    """``record`` as the verdicts topic and the audit store keep it: its content sealed (``[erased]`` without a key)."""
    return cast(Verdict, seal_record(dict(record), _verdict_paths(record), key, record["replayRunId"], "verdict"))


def opened_verdict(record: Verdict, key_for: Callable[[str], DataKey | None]) -> Verdict:
    """A stored verdict with its content readable."""
    return cast(Verdict, open_record(dict(record), key_for, record["replayRunId"], "verdict"))


def error_record(request: Mapping[str, Any], code: str, detail: str) -> Verdict:
    """A verdict that says the comparison could not be made, and why (never silence)."""
    return verdict(
        replay_run_id=request["replayRunId"],
        source_run_id=request.get("sourceRunId"),
        mode=request.get("mode", "live"),
        verdict="error",
        error_code=code,
        detail=detail,
        first_divergence=None,
        events=[],
        compared_through=None,
    )


async def host_replay_verdict(settings: Settings, request: Mapping[str, Any], *, strict: bool = False,
                              ended: bool = False) -> Verdict:
    """Compare replay run ``request['replayRunId']`` with ``request['sourceRunId']``: the verdict record.

    The whole run tree is judged (:mod:`agentlog.replay.tree`): the source run's dispatches are
    followed into its child runs and the replay's. A replay's children may still be running when
    the replay itself ends, so their logs are awaited — at most :data:`CHILD_WAIT_S`
    in all, asynchronously, so only this verdict waits — and a verdict that gave up says so in
    ``detail`` (the unfinished child is then compared as far as it was committed).
    ``strict`` compares index by index (RFC 0041 conformance) instead of per lane.

    ``ended`` says the caller saw the replay run's terminal event committed (the worker's sequencer):
    the read of the replay run then waits, within the same bound, until the log shows that event. A
    transaction's commit returns before the broker has written its markers, and a ``read_committed``
    read stops at the last marker written, so a read right after the commit can miss the whole run.

    An operator waiting on a verdict must get one: a source run the log does not hold
    (``replay_source_missing``) or a comparison that raised (``replay_compare_failed``)
    yields an ``error`` verdict naming the cause, not only a line in the worker's log.
    Whether to send it (``dry_run`` does not) is the caller's choice.
    """
    source_id = request.get("sourceRunId")
    try:
        original = [c["doc"] for c in await read_run(settings, source_id, refuse_erased=True)] if source_id else []
        deadline = time.monotonic() + CHILD_WAIT_S
        if ended:
            replayed, _ = await _await_end(settings, request["replayRunId"], deadline)
        else:
            replayed = [c["doc"] for c in await read_run(settings, request["replayRunId"])]
        if not original:
            record = error_record(request, "replay_source_missing",
                                  f"the committed log holds no events of source run {source_id!r}")
        else:
            root = str(source_id)  # a source run with events has an id
            o_runs, r_runs, notes = await _load_tree(settings, root, original, request["replayRunId"], replayed,
                                                     request.get("fromSeq"), deadline, strict=strict)
            tree = compare_tree(o_runs, r_runs, original_root=root, replay_root=request["replayRunId"],
                                from_seq=request.get("fromSeq"), strict=strict)
            notes += [f"child run {hop['sourceChildRunId']} not compared: the log holds none of its events"
                      for hop in tree.unchecked]
            record_counters(tree.result)
            record = verdict_record(request, tree.result, "; ".join(notes) or None)
    except ReplayError as e:
        record = error_record(request, e.code, str(e))
    except Exception as e:
        log.exception("replay comparison failed for %s", request)
        record = error_record(request, "replay_compare_failed", f"{type(e).__name__}: {e}")
    METRICS.inc("agentlog_replay_verdicts_total", verdict=record["verdict"])
    return record


#: Pause between two reads of a replay run's log while waiting for it to end.
_CHILD_POLL_S = 0.5
#: How long a verdict waits for the replay runs of its tree to end, the root's end to show (``ended``) and
#: the child runs', before it compares what is committed (and says which child it gave up on in its
#: ``detail``). The worker makes verdicts one after the other in a task of their own, so the wait holds up
#: only the verdicts queued behind it: 10 s covers a child a host is still finishing, without holding them
#: up for a child that never ends.
CHILD_WAIT_S = 10.0


async def _load_tree(
    settings: Settings, source_id: str, original: list[dict[str, Any]], replay_id: str,
    replayed: list[dict[str, Any]], from_seq: int | None, deadline: float, *, strict: bool,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]], list[str]]:
    """Both run trees' logs, child runs included; the notes say which replay child was not awaited to its end."""
    o_runs, r_runs = {source_id: original}, {replay_id: replayed}
    notes: list[str] = []
    todo = [(source_id, replay_id, from_seq)]
    while todo:
        o_id, r_id, seq = todo.pop()
        pairs = compare_runs(o_runs[o_id], r_runs[r_id], from_seq=seq, strict=strict).child_pairs
        for pair in pairs:
            if pair.original_child in o_runs or pair.replay_child is None:
                continue
            o_child = [c["doc"] for c in await read_run(settings, pair.original_child)]
            if not o_child:
                continue  # reported as unchecked by the tree comparison
            o_runs[pair.original_child] = o_child
            r_child, ended = await _await_end(settings, pair.replay_child, deadline)
            if not ended:
                notes.append(f"gave up waiting for replay child run {pair.replay_child} after "
                             f"{CHILD_WAIT_S:g}s; compared the {len(r_child)} events committed")
            if r_child:
                r_runs[pair.replay_child] = r_child
                todo.append((pair.original_child, pair.replay_child, None))
    return o_runs, r_runs, notes


async def _await_end(settings: Settings, run_id: str, deadline: float) -> tuple[list[dict[str, Any]], bool]:
    while True:
        docs = [c["doc"] for c in await read_run(settings, run_id)]
        if any(d.get("type") in TERMINAL_TYPES for d in docs):
            return docs, True
        if time.monotonic() >= deadline:
            return docs, False
        await asyncio.sleep(_CHILD_POLL_S)


async def host_verdicts(settings: Settings, replay_run_id: str | None = None) -> list[Verdict]:
    """Verdict records from the verdicts topic, one per replay run (the latest), in topic order.

    A redelivered comparison re-emits an identical record, so the latest per replay run is
    the verdict; ``replay_run_id`` narrows the read to that run's partition.
    """
    latest: dict[str | None, Verdict] = {}  # keyed by replayRunId, which a malformed record may lack
    async for _, _, _, value in read_topic(settings, "verdicts", key=replay_run_id):
        rid = value.get("replayRunId")
        if replay_run_id is None or rid == replay_run_id:
            latest.pop(rid, None)
            latest[rid] = cast(Verdict, value)
    found = list(latest.values())
    if not any(sealed_in(v) for v in found):
        return found
    keyring = await load_keyring(settings, None if replay_run_id is None else [replay_run_id])
    return [opened_verdict(v, keyring.key_for) if isinstance(v.get("replayRunId"), str) else v for v in found]


def sealed_in(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` holds a sealed member anywhere."""
    return next(sealed_members(record), None) is not None
