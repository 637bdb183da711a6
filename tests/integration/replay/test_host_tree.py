"""Host-replay verdicts over run trees, read from a real broker's committed log.

The logs are the golden tree pairs (``tests/unit/replay/make_golden.py``), written to the log
topic as an honest worker would commit them; ``host_replay_verdict`` reads them back, follows the
dispatches into the child runs and waits (bounded) for replay children that have not ended.
Expected verdicts are the golden pairs' (written from how each pair was made).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from agentlog.replay import host
from agentlog.replay.host import host_replay_verdict
from tests.integration.replay.helpers import HandLog, chained
from tests.unit.replay.make_golden import tree_pairs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

PAIRS = tree_pairs()


async def _write(settings, *docs_lists: list[dict]) -> None:
    async with HandLog(settings) as hand:
        for docs in docs_lists:
            runs: dict[str, list[dict]] = defaultdict(list)
            for doc in docs:
                runs[doc["runId"]].append(doc)
            for run in runs.values():
                await hand.log(chained(run))


def _verdict(settings, name: str, *, drop_terminal_of: str | None = None) -> dict:
    original, replay = PAIRS[name]
    if drop_terminal_of is not None:
        replay = [d for d in replay if not (d["runId"] == drop_terminal_of and d["type"] == "run.completed")]
    asyncio.run(_write(settings, original, replay))
    request = {"replayRunId": replay[0]["runId"], "sourceRunId": original[0]["runId"], "mode": "live"}
    return asyncio.run(host_replay_verdict(settings, request))


def test_divergence_inside_a_child_run_reaches_the_parent_verdict(settings, monkeypatch) -> None:
    monkeypatch.setattr(host, "CHILD_WAIT_S", 30.0)
    record = _verdict(settings, "child-diverged")
    assert record["verdict"] == "diverged" and record["firstDivergence"]["atSequence"] == 4
    assert [(hop["worker"], hop["sourceChildRunId"]) for hop in record["path"]] == [("worker-a", "par-3.child-a")]
    assert "detail" not in record


def test_refusal_inside_a_child_run(settings, monkeypatch) -> None:
    monkeypatch.setattr(host, "CHILD_WAIT_S", 30.0)
    record = _verdict(settings, "child-refusal")
    assert (record["verdict"], record["errorCode"]) == ("diverged_at_refusal", "replay_diverged_at_refusal")
    assert record["path"][0]["worker"] == "worker-a"


def test_a_child_that_does_not_end_is_waited_for_only_so_long_and_the_verdict_says_so(settings, monkeypatch) -> None:
    # child-b of the faithful replay never reaches a terminal status: after the wait the verdict
    # compares what was committed (run.completed missing) and says it gave up.
    monkeypatch.setattr(host, "CHILD_WAIT_S", 1.0)
    record = _verdict(settings, "child-diverged",
                      drop_terminal_of="replay-par-3-fresh.child-b")
    assert "gave up waiting for replay child run replay-par-3-fresh.child-b" in record["detail"]


def test_interleaving_is_a_match_with_reordered_and_strict_keeps_index_semantics(settings, monkeypatch) -> None:
    monkeypatch.setattr(host, "CHILD_WAIT_S", 1.0)
    original, replay = PAIRS["interleaved"]
    asyncio.run(_write(settings, original, replay))
    request = {"replayRunId": replay[0]["runId"], "sourceRunId": original[0]["runId"], "mode": "live"}
    lanes = asyncio.run(host_replay_verdict(settings, request))
    assert lanes["verdict"] == "match" and len(lanes["reordered"]) == 6
    strict = asyncio.run(host_replay_verdict(settings, request, strict=True))
    assert strict["verdict"] == "diverged" and strict["firstDivergence"]["atSequence"] == 3
    assert "reordered" not in strict
