"""`agentlog publish` and the SDK wait for the sequencer's decisions; a rejected record keeps its Kafka key.

A real broker and a real ``agentlog worker`` process: what a user sees is what the sequencer
decided, found by each record's ingest position. A malformed record produced straight with
aiokafka (as a non-SDK host would) is filed under its key's run on the rejections topic and,
through the audit sink, in ClickHouse.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import Publisher, SyncPublisher
from agentlog.streams.reader import read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from tests.integration.streams.test_cli_and_reader import cli, doc
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

#: A bound on the wait for a worker that is still joining its group (under `cli`'s own 120 s); no test measures time with it.
WAIT = "100"


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_publish_reports_the_sequencers_decisions_with_lines(settings: Settings, worker, tmp_path: Path) -> None:
    run_id = f"dec-{uuid.uuid4().hex[:8]}"
    valid = [doc(run_id, 0, "run.started", {"bindings": {}}), doc(run_id, 1), doc(run_id, 2)]
    gap = doc(run_id, 5)
    path = _write(tmp_path / "run.jsonl", [json.dumps(d) for d in valid] + ["", json.dumps(gap)])  # gap on line 5

    result = cli(settings, "publish", str(path), "--json", "--timeout", WAIT)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert (summary["decided"], summary["sent"], summary["accepted"], summary["alreadyCommitted"]) == (True, 4, 3, [])
    [rejected] = summary["rejected"]
    assert (rejected["line"], rejected["code"], rejected["stage"]) == (5, "sequence_gap", "sequencer")
    assert f"run {run_id}: expected sequence 3, got 5" in rejected["detail"]

    # The same valid events again: already in the log, which is no error.
    again = cli(settings, "publish", str(_write(tmp_path / "again.jsonl", [json.dumps(d) for d in valid])),
                "--timeout", WAIT)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 accepted, 0 rejected, 3 already committed" in again.stdout
    assert "already committed (in the log from an earlier send): lines 1-3" in again.stdout

    human = cli(settings, "publish", str(_write(tmp_path / "gap.jsonl", [json.dumps(doc(run_id, 9))])),
                "--timeout", WAIT)
    assert human.returncode == 1, human.stdout + human.stderr
    assert "0 accepted, 1 rejected" in human.stdout
    assert "sequence_gap" in human.stdout


def test_the_sdk_waits_for_decisions_of_what_a_run_handle_emitted(settings: Settings, worker) -> None:
    run_id, late = f"sdk-{uuid.uuid4().hex[:8]}", f"late-{uuid.uuid4().hex[:8]}"

    async def scenario():
        async with Publisher(settings, track_decisions=True) as pub:
            run = pub.run(run_id)
            started = await run.emit("run.started", {"bindings": {}})
            changed = await run.emit("variable.changed", {"name": "v", "value": 1}, caused_by=started)
            skipped = await pub.run(late, start_sequence=4).emit("run.started", {"bindings": {}})
            first = await pub.decisions(timeout_s=float(WAIT))
            then = await run.emit("variable.changed", {"name": "v", "value": 2})
            second = await pub.decisions(timeout_s=float(WAIT))
        return (started, changed, skipped, then), first, second

    (started, changed, skipped, then), first, second = asyncio.run(scenario())
    assert [(d.doc, d.outcome, d.reason) for d in first] == [
        (started, "accepted", None), (changed, "accepted", None), (skipped, "rejected", "sequence_gap")]
    assert [(d.doc, d.outcome) for d in second] == [(then, "accepted")]

    with SyncPublisher(settings, track_decisions=True) as pub:  # a host without asyncio
        again = pub.run(run_id, start_sequence=3).emit("variable.changed", {"name": "v", "value": 3})
        [decision] = pub.decisions(timeout_s=float(WAIT))
    assert (decision.doc, decision.outcome) == (again, "accepted")


def test_no_wait_only_sends_and_says_so(settings: Settings, tmp_path: Path) -> None:
    run_id = f"nw-{uuid.uuid4().hex[:8]}"
    path = _write(tmp_path / "run.jsonl", [json.dumps(doc(run_id, 0, "run.started", {"bindings": {}})),
                                           json.dumps(doc(run_id, 7))])  # a gap nobody decides: no worker
    human = cli(settings, "publish", str(path), "--no-wait")
    assert human.returncode == 0, human.stdout + human.stderr
    assert "2 sent, 0 rejected" in human.stdout and "accepted" not in human.stdout

    machine = cli(settings, "publish", str(path), "--no-wait", "--json")
    assert machine.returncode == 0, machine.stdout + machine.stderr
    assert json.loads(machine.stdout) == {"topic": topic_name(settings, "ingest"), "decided": False, "sent": 2,
                                          "rejected": []}


def test_without_a_worker_the_wait_ends_with_a_clear_error(settings: Settings, tmp_path: Path) -> None:
    run_id = f"to-{uuid.uuid4().hex[:8]}"
    path = _write(tmp_path / "run.jsonl", [json.dumps(doc(run_id, 0, "run.started", {"bindings": {}})),
                                           json.dumps(doc(run_id, 1)), "{not json"])
    result = cli(settings, "publish", str(path), "--timeout", "2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error[no_decision]: no decision arrived for 2 of 2 events sent to ")
    assert "a worker must be running" in line


def test_a_malformed_keyed_record_is_rejected_under_its_key(settings: Settings, tmp_path: Path) -> None:
    """Its key names the run, in the rejection record and in ClickHouse's rejections table (through the sink)."""
    settings = settings.replace(web_port=free_port())
    asyncio.run(ensure_topics(settings))
    run_id = f"key-{uuid.uuid4().hex[:8]}"
    not_json, not_a_doc = b"{\"runId\": oops", json.dumps({"hello": "world"}).encode()
    unreadable_key = b"\xff\xfe-not-utf-8"

    async def produce() -> None:
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")
        await producer.start()
        try:
            topic = topic_name(settings, "ingest")
            for key, value in [(run_id.encode(), not_json), (run_id.encode(), not_a_doc), (unreadable_key, not_json)]:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()

    async def rejections():  # one per ingest record: a redelivered decision is the same record again
        found = {(r["source"]["partition"], r["source"]["offset"]): r
                 async for _, _, _, r in read_topic(settings, "rejections")}
        return list(found.values()) if len(found) >= 3 else None

    worker = WorkerProcess(settings, sink=True, web=True).start()
    try:
        asyncio.run(produce())
        found = asyncio.run(wait_until(rejections, timeout=180, what="three rejections", worker=worker))
        assert sorted((r["reason"], r["runId"] or "") for r in found) == sorted(
            [("decode_error", run_id), ("invalid_envelope", run_id), ("decode_error", "")])
        assert [r["runId"] for r in found if not r["runId"]] == [None]  # not UTF-8: no run id, not a guess

        async def stored():
            done = agentlog_cli(settings, "sql", "SELECT DISTINCT source_partition, source_offset, reason, run_id "
                                "FROM rejections", "--json")
            if done.returncode != 0:
                return None
            rows = json.loads(done.stdout)["rows"]
            return rows if len(rows) >= 3 else None

        rows = asyncio.run(wait_until(stored, timeout=180, interval=2, what="rejections in ClickHouse",
                                      worker=worker))
        assert sorted((r[2], r[3]) for r in rows) == sorted([("decode_error", run_id), ("invalid_envelope", run_id),
                                                             ("decode_error", "")])  # no run id: stored as ''
    finally:
        worker.stop()
