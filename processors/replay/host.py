"""Host replay comparison (RFC 0041 §C): a run that declares ``replayOf`` is
compared with its source when it reaches a terminal status (the worker's run-state
agent asks, :mod:`processors.worker.runstate`, and sends the verdict).

The comparison itself is :func:`processors.replay.compare.compare_runs` — the same
engine as ``agentlog compare`` — fed with both runs as read back from the
committed log (deduplicated by sequence). ``dry_run`` replays are compared and
counted but emit no verdict record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from processors.metrics import METRICS
from processors.replay.compare import ComparisonResult, compare_runs
from processors.replay.compare import record as record_counters
from schemas.records import Verdict, verdict
from streams.reader import read_run, read_topic
from streams.settings import Settings

log = logging.getLogger("agentlog.replay")


def verdict_record(request: Mapping[str, Any], result: ComparisonResult) -> Verdict:
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
    )


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


async def host_replay_verdict(settings: Settings, request: Mapping[str, Any]) -> Verdict:
    """Compare replay run ``request['replayRunId']`` with ``request['sourceRunId']``: the verdict record.

    An operator waiting on a verdict must get one: a source run the log does not hold
    (``replay_source_missing``) or a comparison that raised (``replay_compare_failed``)
    yields an ``error`` verdict naming the cause, not only a line in the worker's log.
    Whether to send it (``dry_run`` does not) is the caller's choice.
    """
    source_id = request.get("sourceRunId")
    try:
        original = [c["doc"] for c in await read_run(settings, source_id)] if source_id else []
        replayed = [c["doc"] for c in await read_run(settings, request["replayRunId"])]
        if not original:
            record = error_record(request, "replay_source_missing",
                                  f"the committed log holds no events of source run {source_id!r}")
        else:
            result = compare_runs(original, replayed, from_seq=request.get("fromSeq"))
            record_counters(result)
            record = verdict_record(request, result)
    except Exception as e:
        log.exception("replay comparison failed for %s", request)
        record = error_record(request, "replay_compare_failed", f"{type(e).__name__}: {e}")
    METRICS.inc("agentlog_replay_verdicts_total", verdict=record["verdict"])
    return record


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
    return list(latest.values())
