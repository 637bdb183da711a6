"""Host replay comparison (RFC 0041 §C): a run that declares ``replayOf`` is
compared with its source when it reaches a terminal status.

The comparison itself is :func:`processors.compare.compare_runs` — the same
engine as ``agentlog compare`` — fed with both runs as read back from the
committed log (deduplicated by sequence). ``dry_run`` replays are compared and
counted but emit no verdict record.
"""

from __future__ import annotations

import logging

log = logging.getLogger("agentlog.replay")


def verdict_record(request: dict, result) -> dict:
    body = result.to_json_dict()
    record = {
        "replayRunId": request["replayRunId"],
        "sourceRunId": request.get("sourceRunId"),
        "mode": request.get("mode", "live"),
        "verdict": body["verdict"],
        "errorCode": body["errorCode"],
        "firstDivergence": body["firstDivergence"],
        "events": body["events"],
        "comparedThrough": getattr(result, "compared_through", None),
    }
    if body.get("bindingDiff"):
        # A what-if must say which bound versions differ (MACP §3), not only that some did.
        record["bindingDiff"] = body["bindingDiff"]
    return record


def error_record(request: dict, code: str, detail: str) -> dict:
    """A verdict that says the comparison could not be made, and why (never silence)."""
    return {
        "replayRunId": request["replayRunId"],
        "sourceRunId": request.get("sourceRunId"),
        "mode": request.get("mode", "live"),
        "verdict": "error",
        "errorCode": code,
        "detail": detail,
        "firstDivergence": None,
        "events": [],
        "comparedThrough": None,
    }


async def compare_host_replay(wiring, request: dict) -> dict | None:
    """Compare replay run ``request['replayRunId']`` with ``request['sourceRunId']``; send the verdict.

    An operator waiting on a verdict must get one: a source run the log does not hold
    (``replay_source_missing``) or a comparison that raised (``replay_compare_failed``)
    yields an ``error`` verdict naming the cause, not only a line in the worker's log.
    """
    from processors import compare
    from processors.metrics import METRICS
    from streams.codec import encode_record
    from streams.reader import read_run

    source_id = request.get("sourceRunId")
    try:
        original = [c["doc"] for c in await read_run(wiring.settings, source_id)] if source_id else []
        replayed = [c["doc"] for c in await read_run(wiring.settings, request["replayRunId"])]
        if not original:
            record = error_record(request, "replay_source_missing",
                                  f"the committed log holds no events of source run {source_id!r}")
        else:
            result = compare.compare_runs(original, replayed, from_seq=request.get("fromSeq"))
            compare.record(result)
            record = verdict_record(request, result)
    except Exception as e:
        log.exception("replay comparison failed for %s", request)
        record = error_record(request, "replay_compare_failed", f"{type(e).__name__}: {e}")
    METRICS.inc("agentlog_replay_verdicts_total", verdict=record["verdict"])
    if request.get("mode") != "dry_run":
        fut = await wiring.send("verdicts", request["replayRunId"], encode_record(record))
        await fut
    return record
