"""``agentlog compare`` with run ids, files, or one of each, as a user runs it: a subprocess on a real broker.

The runs reach the log the way a host's do: published to ingest and committed by a running worker. A
run tree is written to the log by hand (as :mod:`tests.integration.replay.test_host_tree` does), so the
compare of two run ids is seen to follow the dispatches into the child runs the log holds.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from pathlib import Path

import pytest

from agentlog.streams.publisher import publish_docs
from tests.integration.replay.helpers import HandLog, chained, committed
from tests.integration.replay.test_cli import cli
from tests.integration.worker.worker_proc import wait_until
from tests.unit.replay.make_golden import tree_pairs
from tests.unit.replay.runs import TOOL_RESULT, as_replay, index_of, llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

FROM_SEQ = 4


def _commit(settings, worker, *runs: list[dict]) -> None:
    async def go():
        summary = await publish_docs(settings, [d for run in runs for d in run], wire="avro")
        assert summary.accepted == sum(len(run) for run in runs), summary.rejected
        for run in runs:
            await wait_until(lambda run=run: committed(settings, run[0]["runId"], len(run)),
                             what=f"{run[0]['runId']} committed", worker=worker)

    asyncio.run(go())


def test_compare_run_ids_and_a_run_id_against_a_file(settings, worker, tmp_path: Path):
    tag = uuid.uuid4().hex[:8]
    source = llm_run(f"src-{tag}")
    faithful = as_replay(source, replay_run_id=f"rep-{tag}", from_seq=FROM_SEQ)
    changed = as_replay(source, replay_run_id=f"chg-{tag}", from_seq=FROM_SEQ)
    returned = index_of(source, "agent.toolReturned")
    changed[returned]["payload"]["result"] = {**copy.deepcopy(TOOL_RESULT), "hits": 4}
    _commit(settings, worker, source, faithful, changed)

    both_ids = cli(settings, "compare", source[0]["runId"], faithful[0]["runId"], "--json")
    assert both_ids.returncode == 0, both_ids.stderr
    body = json.loads(both_ids.stdout)
    assert (body["verdict"], body["fromSeq"], body["comparedThrough"]) == ("match", FROM_SEQ, len(source) - 1)

    exported = {}
    for run in (source, changed):
        exported[run[0]["runId"]] = tmp_path / f"{run[0]['runId']}.jsonl"
        wrote = cli(settings, "export", "--run", run[0]["runId"], "--out", str(exported[run[0]["runId"]]))
        assert wrote.returncode == 0, wrote.stderr

    file_and_id = cli(settings, "compare", str(exported[source[0]["runId"]]), faithful[0]["runId"], "--json")
    assert file_and_id.returncode == 0, file_and_id.stderr
    assert json.loads(file_and_id.stdout)["verdict"] == "match"

    id_and_file = cli(settings, "compare", source[0]["runId"], str(exported[changed[0]["runId"]]), "--json")
    assert id_and_file.returncode == 1, id_and_file.stderr
    first = json.loads(id_and_file.stdout)["firstDivergence"]
    assert (first["atSequence"], first["kind"], first["path"]) == (returned, "output", "payload.result.hits")
    assert (first["expected"], first["actual"]) == (TOOL_RESULT["hits"], 4)

    human = cli(settings, "compare", source[0]["runId"], changed[0]["runId"], "--all")
    assert human.returncode == 1, human.stderr
    assert "verdict: diverged" in human.stdout and "payload.result.hits" in human.stdout


def test_an_argument_that_is_neither_a_file_nor_a_run_is_one_error_line(settings, worker):
    run = llm_run(f"src-{uuid.uuid4().hex[:8]}")
    _commit(settings, worker, run)
    out = cli(settings, "compare", run[0]["runId"], "no-such-run", "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error[run_not_found]: 'no-such-run' is neither an existing file nor a run")
    assert len(out.stderr.strip().splitlines()) == 1
    missing_file = cli(settings, "compare", "absent.jsonl", run[0]["runId"])
    assert missing_file.returncode == 2 and missing_file.stderr.startswith("error[replay_error]: absent.jsonl")


def test_run_ids_bring_their_child_runs_from_the_log(settings):
    # The golden tree pair: worker-a's child run of the replay returned another tool result at its
    # sequence 4 (tests/unit/replay/make_golden.py), so the verdict is made inside that child run.
    original, replay = tree_pairs()["child-diverged"]

    async def write():
        async with HandLog(settings) as hand:
            for run_id in dict.fromkeys(d["runId"] for d in original + replay):
                await hand.log(chained([d for d in original + replay if d["runId"] == run_id]))

    asyncio.run(write())
    out = cli(settings, "compare", original[0]["runId"], replay[0]["runId"], "--json")
    assert out.returncode == 1, out.stderr
    body = json.loads(out.stdout)
    assert body["verdict"] == "diverged" and body["firstDivergence"]["atSequence"] == 4
    assert [(hop["worker"], hop["sourceChildRunId"]) for hop in body["path"]] == [("worker-a", "par-3.child-a")]
    assert "unchecked" not in body
