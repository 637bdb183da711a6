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


async def compare_host_replay(wiring, request: dict) -> dict | None:
    """Compare replay run ``request['replayRunId']`` with ``request['sourceRunId']``; send the verdict."""
    from processors import compare
    from processors.metrics import METRICS
    from streams.codec import encode_record
    from streams.reader import read_run

    try:
        original = [c["doc"] for c in await read_run(wiring.settings, request["sourceRunId"])]
        replayed = [c["doc"] for c in await read_run(wiring.settings, request["replayRunId"])]
        result = compare.compare_runs(original, replayed, from_seq=request.get("fromSeq"))
    except Exception:
        log.exception("replay comparison failed for %s", request)
        return None
    compare.record(result)
    record = verdict_record(request, result)
    METRICS.inc("agentlog_replay_verdicts_total", verdict=record["verdict"])
    if request.get("mode") != "dry_run":
        fut = await wiring.send("verdicts", request["replayRunId"], encode_record(record))
        await fut
    return record
