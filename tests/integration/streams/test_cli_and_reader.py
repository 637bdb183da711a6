"""`agentlog publish` / `export`, non-SDK producers (kcat), and the reader's dedup, against a real broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from aiokafka import AIOKafkaProducer

from agentlog.schemas.avro import encode_avro
from agentlog.schemas.upstream import upstream_file
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import encode_record
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import read_run
from agentlog.streams.security import client_kwargs, kcat_args
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from tests.integration.worker.worker_proc import WorkerProcess
from tests.tools import require_tool

pytestmark = pytest.mark.kafka

UPSTREAM_SCHEMA = upstream_file("openwop/schemas/run-event.schema.json")
AGENTLOG = [sys.executable, "-c", "from agentlog.cli import main; main()"]


def doc(run_id: str, seq: int, type_: str = "variable.changed", payload: object = None, **extra: object) -> dict:
    d = {
        "eventId": f"{run_id}-e{seq}",
        "runId": run_id,
        "type": type_,
        "payload": {"name": "v", "value": seq} if payload is None else payload,
        "timestamp": "2025-03-04T05:06:07.089Z",
        "sequence": seq,
    }
    d.update(extra)
    return d


def cli(settings: Settings, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        AGENTLOG_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        AGENTLOG_TOPIC_PREFIX=settings.topic_prefix,
        AGENTLOG_PARTITIONS=str(settings.partitions),
        AGENTLOG_HOME=str(settings.home),
    )
    return subprocess.run([*AGENTLOG, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120)


def test_publish_cli_reports_bad_lines_and_sends_good_ones(settings: Settings, tmp_path: Path,
                                                           worker: WorkerProcess) -> None:
    good = [doc("run-p", 0, "run.started", {"bindings": {}}), doc("run-p", 1), doc("run-p", 2)]
    lines = [
        json.dumps(good[0]),                                    # 1
        "{not json",                                            # 2 decode_error
        json.dumps(good[1]),                                    # 3
        "",                                                     # 4 blank: ignored
        json.dumps(doc("run-p", 3, "no.such.type", {})),        # 5 unknown_event_type
        json.dumps(doc("run-p", 3, payload={"name": "v", "value": 2**63 + 1})),  # 6 unsafe_integer (not a double)
        json.dumps({**doc("run-p", 3), "tenant": "x"}),         # 7 invalid_envelope
        '{"a": NaN}',                                           # 8 non_finite_number
        json.dumps(good[2]),                                    # 9
        "[1, 2]",                                               # 10 decode_error
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")

    result = cli(settings, "publish", str(path), "--json", "--timeout", "100")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["accepted"] == 3
    assert [(r["line"], r["code"]) for r in summary["rejected"]] == [
        (2, "decode_error"),
        (5, "unknown_event_type"),
        (6, "unsafe_integer"),
        (7, "invalid_envelope"),
        (8, "non_finite_number"),
        (10, "decode_error"),
    ]
    on_topic = [item["doc"] for item in asyncio.run(read_run(settings, "run-p", short_name="ingest"))]
    assert on_topic == good

    human = cli(settings, "publish", "-", "--wire", "json", "--timeout", "100", stdin=json.dumps(doc("run-q", 0)) + "\n")
    assert human.returncode == 0, human.stderr
    assert "1 accepted, 0 rejected" in human.stdout


def test_export_writes_upstream_valid_jcs_lines(settings: Settings, tmp_path: Path) -> None:
    async def emit() -> list[dict]:
        async with Publisher(settings) as pub:
            run = pub.run("run-x")
            first = await run.emit("run.started", {"bindings": {"engineVersion": "1"}})
            docs = [first]
            for i in range(5):
                docs.append(await run.emit("channel.written", {"channel": "c", "value": {"i": i, "ö": 1.5}}, caused_by=first))
            docs.append(await run.emit("run.completed", {"status": "completed"}))
            async with Publisher(settings) as other:  # another run on the same topic must not leak in
                await other.run("run-y").emit("run.started", {"bindings": {}})
            return docs

    sent = asyncio.run(emit())
    out = tmp_path / "run-x.jsonl"
    result = cli(settings, "export", "--run", "run-x", "--source", "ingest", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stderr.strip().splitlines()[-1])["events"] == len(sent)

    validator = jsonschema.Draft202012Validator(
        json.loads(UPSTREAM_SCHEMA.read_text()), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    raw_lines = out.read_bytes().splitlines()
    exported = [json.loads(line) for line in raw_lines]
    assert exported == sent
    for line, d in zip(raw_lines, exported, strict=False):
        validator.validate(d)
        # JCS: sorted keys, no whitespace, as an independent canonicaliser would write it
        assert line == json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    missing = cli(settings, "export", "--run", "nobody", "--source", "ingest")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error[run_not_found]")


def test_kcat_json_lines_decode_like_sdk_events(settings: Settings, tmp_path: Path) -> None:
    require_tool("kcat")
    asyncio.run(ensure_topics(settings))
    docs = [doc("run-k", 0, "run.started", {"bindings": {}}), doc("run-k", 1), doc("run-k", 2, causationId="run-k-e0")]
    # Plain json.dumps (not JCS), with spaces: any JSON a non-Python host writes must be accepted.
    lines = "".join(f"run-k\t{json.dumps(d)}\n" for d in docs)
    # librdkafka's default partitioner is consistent_random (CRC32); murmur2_random is the Java
    # client's, which the store assumes — hosts on librdkafka must set it, and so do we.
    proc = subprocess.run(
        ["kcat", "-P", *kcat_args(settings), "-t", topic_name(settings, "ingest"), "-K", "\t",
         "-X", "topic.partitioner=murmur2_random"],
        input=lines.encode(), capture_output=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    got = [item["doc"] for item in asyncio.run(read_run(settings, "run-k", short_name="ingest"))]
    assert got == docs


def test_reader_dedups_by_run_and_sequence(settings: Settings) -> None:
    async def produce() -> None:
        await ensure_topics(settings)
        producer = AIOKafkaProducer(**client_kwargs(settings), enable_idempotence=True, acks="all")
        await producer.start()
        try:
            ingest, log = topic_name(settings, "ingest"), topic_name(settings, "log")
            d0, d1 = doc("run-d", 0, "run.started", {"bindings": {}}), doc("run-d", 1)
            changed = {**d1, "payload": {"name": "v", "value": 999}}
            for value in (encode_avro(d0), encode_avro(d1), encode_avro(d1), b"garbage", encode_avro(changed)):
                await producer.send_and_wait(ingest, value, key=b"run-d")
            for i, d in enumerate([d0, d1, d1, changed, doc("run-d", 2)]):
                committed = {"doc": d, "prevHash": f"{i:064x}", "hash": f"{i + 1:064x}",
                             "source": {"topic": ingest, "partition": 0, "offset": i, "timestampMs": 0}}
                await producer.send_and_wait(log, encode_record(committed), key=b"run-d")
        finally:
            await producer.stop()

    asyncio.run(produce())
    from_ingest = asyncio.run(read_run(settings, "run-d", short_name="ingest"))
    assert [(i["doc"]["sequence"], i["doc"]["payload"]) for i in from_ingest] == [
        (0, {"bindings": {}}), (1, {"name": "v", "value": 1})
    ]
    assert [(c["sequence"], c["dropped"]["doc"]["payload"]["value"]) for c in from_ingest.conflicts] == [(1, 999)]

    from_log = asyncio.run(read_run(settings, "run-d"))
    assert [i["doc"]["sequence"] for i in from_log] == [0, 1, 2]
    assert from_log[1]["hash"] == f"{2:064x}"  # the first record of sequence 1 wins
    assert len(from_log.conflicts) == 1

    tail = asyncio.run(read_run(settings, "run-d", from_offset=3))
    assert [i["doc"]["sequence"] for i in tail] == [1, 2]


def test_offset_for_time_finds_first_record_at_or_after(settings: Settings) -> None:
    from agentlog.streams.reader import offset_for_time
    from agentlog.streams.topics import partition_for

    async def scenario() -> tuple[list[int], int, int, int]:
        # On the log, which keeps every record: ingest keeps three days, and the broker would delete these 2023
        # timestamps as soon as its retention check runs.
        await ensure_topics(settings)
        part = partition_for(settings, "run-t")
        producer = AIOKafkaProducer(**client_kwargs(settings), enable_idempotence=True, acks="all")
        await producer.start()
        try:
            offsets = []
            for seq, ts in enumerate((1_700_000_001_000, 1_700_000_002_000, 1_700_000_003_000)):
                meta = await producer.send_and_wait(
                    topic_name(settings, "log"), encode_avro(doc("run-t", seq)), key=b"run-t", timestamp_ms=ts
                )
                assert meta.partition == part
                offsets.append(meta.offset)
        finally:
            await producer.stop()
        between = await offset_for_time(settings, "log", part, 1_700_000_001_500)
        exact = await offset_for_time(settings, "log", part, 1_700_000_003_000)
        after = await offset_for_time(settings, "log", part, 1_800_000_000_000)
        return offsets, between, exact, after

    offsets, between, exact, after = asyncio.run(scenario())
    assert between == offsets[1]
    assert exact == offsets[2]
    assert after == offsets[2] + 1  # nothing that late: the end offset, so a read from it yields nothing


def test_one_topic_reader_reads_several_topics_in_turn(settings: Settings) -> None:
    """One consumer, reads one after another (what a replay does): each read is what a fresh
    ``read_topic`` yields, a read stopped early leaves the next one whole, and an empty partition
    is known from its offsets."""
    from agentlog.streams.reader import TopicReader, read_topic

    async def scenario() -> None:
        await ensure_topics(settings)
        producer = AIOKafkaProducer(**client_kwargs(settings), enable_idempotence=True, acks="all")
        await producer.start()
        try:
            for seq in range(30):
                committed = {"doc": doc("run-r", seq), "prevHash": f"{seq:064x}", "hash": f"{seq + 1:064x}",
                             "source": {"topic": "x", "partition": 0, "offset": seq, "timestampMs": 0}}
                await producer.send(topic_name(settings, "log"), encode_record(committed), key=b"run-r")
                await producer.send(topic_name(settings, "snapshots"), encode_record({"runId": "run-r", "atSequence": seq}),
                                    key=b"run-r")
            await producer.flush()
        finally:
            await producer.stop()
        fresh_log = [r async for r in read_topic(settings, "log", key="run-r")]
        fresh_snaps = [r async for r in read_topic(settings, "snapshots", key="run-r")]
        async with TopicReader(settings) as reader:
            assert [r async for r in reader.read("snapshots", key="run-r")] == fresh_snaps
            early = reader.read("log", key="run-r", from_offsets={fresh_log[0][0]: fresh_log[10][1]})
            assert [(await early.__anext__())[1] for _ in range(3)] == [r[1] for r in fresh_log[10:13]]
            await early.aclose()
            assert [r async for r in reader.read("log", key="run-r")] == fresh_log
            assert [r async for r in reader.read("snapshots", key="run-r")] == fresh_snaps
        assert len(fresh_log) == len(fresh_snaps) == 30

    asyncio.run(scenario())


def test_a_topic_the_broker_does_not_have_is_one_clear_error(settings: Settings) -> None:
    """No topics under this prefix yet: each read names the missing topic and the fix; a missing keyring is empty.
    Once the topics exist, their partitions are what the admin client describes."""
    from agentlog.schemas.errors import InfraError
    from agentlog.streams.admin import topic_partitions
    from agentlog.streams.keyring import load_keyring
    from agentlog.streams.reader import end_marks, read_topic

    def missing(short: str) -> str:
        return rf"^topic {topic_name(settings, short)} does not exist on {settings.kafka_bootstrap}; run `agentlog infra up`$"

    async def scenario() -> None:
        with pytest.raises(InfraError, match=missing("snapshots")):
            [r async for r in read_topic(settings, "snapshots")]
        with pytest.raises(InfraError, match=missing("verdicts")):
            await end_marks(settings, ("verdicts", "violations"))
        assert len(await load_keyring(settings)) == 0
        await ensure_topics(settings)
        log = topic_name(settings, "log")
        assert await topic_partitions(settings, [log, f"{settings.topic_prefix}.absent"]) == {log: [0, 1]}
        assert [r async for r in read_topic(settings, "log")] == []

    asyncio.run(scenario())
