"""No plaintext content past the sequencer (SPEC §12 "At rest"), on a real broker and worker.

Two subjects (alice, bob) run a planner that asks an LLM (system prompt, messages), calls a tool, sets a
variable, writes a channel and hands off to a child run; alice also sends a record the sequencer rejects, and
bob's run is replayed live with a value that diverges under a key of its own. Every content value carries a marker of its own
(``MARK-<uuid>-<field>``), so is the subject id. Once the worker has committed, folded, snapshotted, signed,
judged the replay and stored everything in ClickHouse, no marker may be found:

1. in any file under the test's ``AGENTLOG_HOME`` (worker state, RocksDB read back too, chdb, keys, logs);
2. in any record of any topic of the test's prefix but ``ingest`` (Faust's changelogs included), nor in the
   broker's partition folders of those topics;
3. in any row of any table of the audit store.

Markers are looked for as text and in base64 (the form of a rejection's raw bytes). The positive controls say
the search can fail: every marker is in the ingest records and folders, and reading the runs back through the
keyring (``read_run``, ``agentlog export``, the rejections, the verdict) gives the content as it was sent.

Two former leaks have tests of their own: a rejection's detail naming a key of a host's value, and the OTel
path (a refused OTLP body, held spans), where ``spans`` and ``otel-events`` may hold markers as ingest does.
Erasing the subject of an OTel run erases the spans of it the mapping refused.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from typer.testing import CliRunner

from agentlog import Publisher
from agentlog.audit.rows import TABLE_FOR_KIND
from agentlog.audit.server import query_via_worker
from agentlog.audit.sink import SINK_TOPICS
from agentlog.audit.store import open_store
from agentlog.cli import app
from agentlog.core.sealing import ERASED, sealed_paths
from agentlog.infra.kafka import local
from agentlog.replay.host import host_verdicts
from agentlog.streams.admin import ensure_topics, list_topic_names, topic_partitions
from agentlog.streams.reader import read_rejections, read_run, read_topic
from agentlog.streams.replay_client import start_replay
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings, settings_env
from agentlog.streams.topics import partition_for, topic_name
from tests.conftest import TEST_STACK_HOME
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, all_committed, free_port, redaction_off

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

BINDINGS = {"engineVersion": "1.4.0", "modeVersion": "m1", "configVersion": "c7", "policyVersion": "p2"}

#: Content fields of each subject's runs; alice's also holds the rejected records', bob's the replay's.
FIELDS = ("subject", "system-prompt", "llm-system-message", "llm-messages", "model-output", "tool-args",
          "tool-result", "variable", "channel", "decision", "child-variable", "child-output")
ALICE_ONLY = ("rejected-payload",)
BOB_ONLY = ("replay-variable", "replay-key")

#: A marker is ``MARK-<32 hex>-<field>``; its hex names it (what follows it in a record may be any byte).
_MARK = re.compile(rb"MARK-([0-9a-f]{32})")


def _b64_heads() -> dict[bytes, int]:
    """base64 of ``MARK-`` at each byte alignment in its 3-byte group: the first 6 characters made of its bits
    alone, and how far after the start of their 4-character group they stand (both alphabets agree on them)."""
    heads = {}
    for a in range(3):
        first = -(-a * 8 // 6)
        heads[base64.b64encode(b"\0" * a + b"MARK-")[first:first + 6]] = first
    return heads


_B64_HEADS = _b64_heads()
_B64_HEAD = re.compile(b"|".join(re.escape(h) for h in _B64_HEADS))
_B64_TEXT = re.compile(rb"[A-Za-z0-9+/_-]*")


def found_in(blob: bytes, marks: set[str]) -> set[str]:
    """The markers of ``marks`` that ``blob`` holds, as text or base64-encoded (standard or URL-safe)."""
    hexes = set(_MARK.findall(blob))
    for head in _B64_HEAD.finditer(blob):
        start = max(0, head.start() - _B64_HEADS[head.group()])
        text = _B64_TEXT.match(blob, start, start + 240).group()
        text = text[: len(text) // 4 * 4].replace(b"-", b"+").replace(b"_", b"/")
        hexes |= set(_MARK.findall(base64.b64decode(text)))
    return {m for m in marks if m[5:37].encode() in hexes}


def _subject_marks(name: str, extra: tuple[str, ...]) -> dict[str, str]:
    marks = {f: f"MARK-{uuid.uuid4().hex}-{f}" for f in (*FIELDS, *extra)}
    marks["subject"] = f"{name}-{marks['subject']}@example.com"  # the subject id is personal data too
    return marks


def _marker(value: str) -> str:
    """The marker in a marked value (a subject id holds one)."""
    return value[value.index("MARK-"):].split("@")[0]


@pytest.fixture
def settings(settings, tmp_path):
    """The test's settings with redaction off: this module checks sealing, and its markers (``MARK-<hex>``, which
    look random) and e-mail subject ids must read back as sent (redaction: ``tests/integration/test_redaction.py``)."""
    return redaction_off(settings, tmp_path)


@pytest.fixture
def worker(settings):
    """A worker with the audit sink, its web server (the sink's store answers queries through it) and an OTLP
    receiver on ports of its own."""
    settings = settings.replace(web_port=free_port(), otlp_port=free_port())
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings, sink=True, web=True, constants={  # a trace's spans are let go at once
        "agentlog.worker.spans:SETTLE_MS": 200, "agentlog.worker.spans:TICK_S": 0.2}).start()
    yield proc
    proc.stop()


async def _subject_runs(pub: Publisher, run_id: str, m: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """A planner run of subject ``m['subject']`` that hands off to a child run; its docs as published, by run."""
    child_id = f"{run_id}.child-a"
    run, child = pub.run(run_id), pub.run(child_id)
    docs: list[dict[str, Any]] = []
    started = await run.emit("run.started", {"bindings": dict(BINDINGS), "subjectId": m["subject"]}, node_id="start")
    docs.append(started)
    docs.append(await run.emit("variable.changed", {"name": "goal", "value": {"text": m["variable"]}},
                               node_id="start", caused_by=started))
    request = {"provider": "anthropic", "model": "claude-x", "system": m["system-prompt"], "temperature": 0,
               "messages": [{"role": "system", "content": m["llm-system-message"]},
                            {"role": "user", "content": m["llm-messages"]}]}
    asked = await run.llm_request(request, node_id="planner", caused_by=started)
    answered = await run.llm_response(asked, {"role": "assistant", "content": [{"type": "text",
                                                                                "text": m["model-output"]}]},
                                      {"inputTokens": 40, "outputTokens": 9})
    called = await run.tool_call("search", {"query": m["tool-args"], "limit": 3}, node_id="research",
                                 caused_by=answered)
    returned = await run.tool_result(called, {"hits": [m["tool-result"]]})
    docs += [asked, answered, called, returned]
    docs.append(await run.emit("channel.written", {"channel": "answer", "value": m["channel"]}, node_id="research"))
    decided = await run.emit("runOrchestrator.decided", {
        "agentId": "agent.planner", "iteration": 1,
        "decision": {"kind": "next-worker", "nextWorkerIds": ["worker-a"], "rationale": m["decision"],
                     "outputMapping": {"worker-a": {"result": "parentResult"}}}}, node_id="planner")
    dispatched = await run.emit("node.dispatched", {"childRunId": child_id, "childWorkflowId": "worker-a",
                                                    "childStatus": "running"}, node_id="dispatch", caused_by=decided)
    docs += [decided, dispatched]
    await pub.flush()
    kids = [await child.emit("run.started", {"bindings": dict(BINDINGS), "parentRunId": run_id}, node_id="start"),
            await child.emit("variable.changed", {"name": "result", "value": m["child-variable"]}, node_id="work"),
            await child.emit("run.completed", {"status": "completed", "outputs": {"result": m["child-output"]}},
                             node_id="end")]
    await pub.flush()
    docs.append(await run.emit("variable.changed", {"name": "parentResult", "value": m["child-output"]},
                               node_id="dispatch"))
    docs.append(await run.emit("run.completed", {"status": "completed"}, node_id="end"))
    await pub.flush()
    return {run_id: docs, child_id: kids}


def _doc(run_id: str, event_id: str, payload: str) -> bytes:
    """An ingest record of ``run_id``: a ``variable.changed`` doc whose payload is the JSON text ``payload``."""
    envelope = json.dumps({"eventId": f"{run_id}:{event_id}", "runId": run_id, "type": "variable.changed",
                           "timestamp": "2025-01-15T10:00:00.000Z", "sequence": 50})
    return f'{envelope[:-1]}, "payload": {payload}}}'.encode()


async def _send_raw(settings: Settings, run_id: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")
    await producer.start()
    try:
        partition = partition_for(settings, run_id, "ingest")
        for value in values:
            await producer.send_and_wait(topic_name(settings, "ingest"), value, key=run_id.encode(),
                                         partition=partition)
    finally:
        await producer.stop()


async def _records(settings: Settings, topic: str) -> list[bytes]:
    """Every record of ``topic`` (aborted transactions' too) as key, value and headers bytes, one blob each."""
    consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None, enable_auto_commit=False,
                                isolation_level="read_uncommitted", fetch_max_wait_ms=10)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in (await topic_partitions(settings, [topic])).get(topic, ())]
        assert parts, f"no partitions known for {topic}"
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: list[bytes] = []
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                for r in batch:
                    out.append(b"\0".join([r.key or b"", r.value or b"", *(v or b"" for _, v in r.headers)]))
        return out
    finally:
        await consumer.stop()


def _files(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                yield path


def _rocksdb_databases(home: Path) -> list[Path]:
    """Every RocksDB database under ``home`` (written to or not)."""
    return [current.parent for current in home.rglob("CURRENT") if (current.parent / "IDENTITY").exists()]


def _rocksdb_contents(home: Path) -> Iterator[tuple[Path, bytes]]:
    """Every key and value of every RocksDB database under ``home``, read back (SST blocks may be compressed)."""
    import rocksdict

    for db in _rocksdb_databases(home):
        assert rocksdict.Rdict.list_cf(str(db), rocksdict.Options(raw_mode=True)) == ["default"], db
        opened = rocksdict.Rdict(str(db), options=rocksdict.Options(raw_mode=True),
                                 access_type=rocksdict.AccessType.read_only())
        try:
            for key, value in opened.items():
                yield db, bytes(key) + b"\0" + bytes(value)
        finally:
            opened.close()


def _store_rows(settings: Settings) -> tuple[dict[str, bytes], int]:
    """Every table of the audit store as ``SELECT * ... FORMAT JSONEachRow``, and how many rows they hold."""
    store = open_store(settings)
    try:
        tables = store.query("SELECT database, name FROM system.tables WHERE database NOT IN "
                             "('system', 'INFORMATION_SCHEMA', 'information_schema') "
                             "AND engine NOT IN ('View', 'MaterializedView') ORDER BY database, name").rows
        out, rows = {}, 0
        for database, name in tables:
            data = store.client.raw_query(f"SELECT * FROM `{database}`.`{name}` FORMAT JSONEachRow")
            out[f"{database}.{name}"] = bytes(data)
            rows += bytes(data).count(b"\n")
        return out, rows
    finally:
        store.close()


class LeakFound(AssertionError):
    """A marker was found past the sequencer."""


def _topic_of(folder: Path) -> str:
    return folder.name.rsplit("-", 1)[0]


def _scan(settings: Settings, worker: WorkerProcess, marks: set[str], plaintext: set[str], *,
          state: bool = True) -> set[str]:
    """Stop ``worker``, then look for ``marks`` everywhere the store keeps anything; raise :class:`LeakFound`
    naming each place that holds one. ``plaintext``: the topics (short names) allowed to, whose records and
    partition folders are searched too; the markers found there are returned. ``state``: the worker's tables
    were written (so its RocksDB databases must be there to be read)."""
    buffers = {topic_name(settings, short) for short in plaintext}
    worker.stop()  # its state, chdb and log are then on disk as they stay
    leaks: dict[str, set[str]] = {}
    allowed: set[str] = set()

    async def topics() -> dict[str, list[bytes]]:
        names = sorted(n for n in await list_topic_names(settings)
                       if n.startswith((f"{settings.topic_prefix}.", f"{settings.topic_prefix}-")))
        assert any(n.endswith("-changelog") for n in names), names  # Faust's tables' changelogs
        return {name: await _records(settings, name) for name in names}

    read = asyncio.run(topics())
    for name, records in read.items():
        for i, record in enumerate(records):
            if not (hits := found_in(record, marks)):
                continue
            if name in buffers:
                allowed |= hits
            else:
                leaks.setdefault(f"topic {name} record {i}: {record[:600]!r}", set()).update(hits)

    if not os.environ.get("AGENTLOG_KAFKA_BOOTSTRAP"):  # the session's own broker: its partition folders
        nodes = sorted(local.kafka_home(settings.replace(home=TEST_STACK_HOME)).glob("node-*/data"))
        folders = [f for node in nodes for f in node.iterdir() if f.is_dir() and _topic_of(f) in read]
        assert {_topic_of(f) for f in folders} == set(read)
        in_folders: set[str] = set()
        for folder in folders:
            # .index / .timeindex hold offsets and positions only (and are preallocated, 10 MB each)
            hits = found_in(b"".join(f.read_bytes() for f in _files(folder)
                                     if f.suffix not in (".index", ".timeindex")), marks)
            if _topic_of(folder) in buffers:
                in_folders |= hits
            elif hits:
                leaks.setdefault(f"broker folder {folder}", set()).update(hits)
        assert in_folders == allowed, "the plaintext buffers' folders hold what their records hold"

    tables, rows = _store_rows(settings)
    assert rows, "the audit store is empty"
    for table, data in tables.items():
        for line in data.splitlines():
            if hits := found_in(line, marks):
                leaks.setdefault(f"table {table}: {line[:600]!r}", set()).update(hits)

    home = Path(settings.home)
    for path in _files(home):
        if hits := found_in(path.read_bytes(), marks):
            leaks.setdefault(f"file {path.relative_to(home)}", set()).update(hits)
    databases = _rocksdb_databases(home)
    for db, entry in _rocksdb_contents(home):
        if hits := found_in(entry, marks):
            leaks.setdefault(f"rocksdb {db.relative_to(home)}: {entry[:600]!r}", set()).update(hits)
    assert databases or not state, f"no RocksDB database under {home}"

    if leaks:
        raise LeakFound("content in plaintext past the sequencer:\n" + "\n".join(
            f"{where}\n    {sorted(hits)}" for where, hits in sorted(leaks.items())))
    return allowed


async def _sink_caught_up(settings: Settings, worker: WorkerProcess) -> None:
    """Wait until every table the audit sink fills holds as many rows as its topic has records."""
    async def sunk():
        behind = {}
        for short, kind in SINK_TOPICS.items():
            records = len([1 async for _ in read_topic(settings, short)])
            answer = query_via_worker(settings, {"sql": f"SELECT count() FROM {TABLE_FOR_KIND[kind]}"})
            rows = None if answer is None else int(answer["rows"][0][0])
            if rows is None or rows < records:
                behind[short] = (rows, records)
        return not behind or None

    await wait_until(sunk, timeout=180, interval=2, what="the audit sink caught up", worker=worker)


async def _rejections_of(settings: Settings, worker: WorkerProcess, run_id: str | None, n: int) -> list[dict]:
    """The ``n`` rejections of ``run_id`` (None: of no run), their raw bytes opened, once all are there."""
    async def found():
        got = [r for r in await read_rejections(settings) if r.get("runId") == run_id]
        return got if len(got) >= n else None

    return await wait_until(found, timeout=120, what=f"{n} rejections of {run_id}", worker=worker)


def test_found_in_reads_text_and_base64():
    mark = f"MARK-{uuid.uuid4().hex}-probe"
    marks = {mark}
    assert found_in(b"xx" + mark.encode() + b"yy", marks) == marks
    for pad in range(3):
        text = b"{}" * pad + b'"' + mark.encode() + b'" and more'
        assert found_in(b"raw=" + base64.b64encode(text) + b";", marks) == marks, pad
        assert found_in(base64.urlsafe_b64encode(b"\xfb\xff" * pad + text), marks) == marks, pad
    assert found_in(b"MARK-" + uuid.uuid4().hex.encode() + b"-probe", marks) == set()


def test_no_marker_past_the_sequencer(settings, worker):
    settings = worker.settings
    alice_run, bob_run = f"alice-{uuid.uuid4().hex[:8]}", f"bob-{uuid.uuid4().hex[:8]}"
    alice, bob = _subject_marks("alice", ALICE_ONLY), _subject_marks("bob", BOB_ONLY)
    marks = {_marker(v) for v in (*alice.values(), *bob.values())}
    assert len(marks) == len(alice) + len(bob)

    async def published() -> dict[str, list[dict[str, Any]]]:
        async with Publisher(settings) as pub:
            runs = {**await _subject_runs(pub, alice_run, alice), **await _subject_runs(pub, bob_run, bob)}
        await _send_raw(settings, alice_run, [_doc(alice_run, "no-name", json.dumps(
            {"value": alice["rejected-payload"]}))])  # no name: invalid_payload

        await wait_until(lambda: all_committed(settings, runs), timeout=180, what="every run committed",
                         worker=worker)
        async with Publisher(settings) as pub:  # a live replay of bob's run that diverges inside a value
            replay = await start_replay(pub, bob_run, mode="live")
            replayed = [await replay.started({"bindings": dict(BINDINGS), "subjectId": bob["subject"]},
                                             node_id="start")]
            replayed.append(await replay.run.emit("variable.changed", {"name": "goal", "value": {
                "text": bob["variable"], bob["replay-key"]: bob["replay-variable"]}}, node_id="start",
                caused_by=replayed[0]))
            replayed.append(await replay.run.emit("run.completed", {"status": "completed"}, node_id="end"))
        runs[replay.run_id] = replayed

        rejected = await _rejections_of(settings, worker, alice_run, 1)
        assert [r["reason"] for r in rejected] == ["invalid_payload"]
        assert found_in(base64.b64decode(rejected[0]["raw"]), marks) == {alice["rejected-payload"]}

        async def verdict():
            found = await host_verdicts(settings, replay.run_id)
            return found[-1] if found else None

        judged = await wait_until(verdict, timeout=180, what="the replay's verdict", worker=worker)
        assert judged["verdict"] == "diverged", judged
        assert bob["replay-key"] in judged["firstDivergence"]["path"]  # opened

        async def snapshotted_and_signed():
            snapshots = {(v["runId"], v["atSequence"]) async for _, _, _, v in read_topic(settings, "snapshots")}
            signed = {(v["runId"], v["sequence"]) async for _, _, _, v in read_topic(settings, "checkpoints")}
            last = {(run_id, docs[-1]["sequence"]) for run_id, docs in runs.items()}
            return not (last - snapshots or last - signed) or None

        await wait_until(snapshotted_and_signed, timeout=180, what="terminal snapshots and checkpoints",
                         worker=worker)
        await _sink_caught_up(settings, worker)

        for run_id, docs in runs.items():
            stored = await read_run(settings, run_id, opened=False)
            assert all(sealed_paths(c["doc"]) for c in stored if c["doc"]["type"] in (
                "variable.changed", "channel.written", "agent.toolCalled", "agent.invocation.started")), run_id
            assert [c["doc"] for c in await read_run(settings, run_id)] == docs, run_id  # opened: as published
        return runs

    runs = asyncio.run(published())
    runner = CliRunner()
    for run_id, docs in runs.items():
        exported = runner.invoke(app, ["export", "--run", run_id], env=settings_env(settings))
        assert exported.exit_code == 0, exported.output
        assert found_in(exported.stdout_bytes, marks) == found_in(json.dumps(docs).encode(), marks) != set(), run_id

    assert _scan(settings, worker, marks, {"ingest"}) == marks  # the one plaintext buffer holds them all


def test_a_rejection_detail_names_no_content(settings, worker):
    settings = worker.settings
    run_id = f"keys-{uuid.uuid4().hex[:8]}"
    twice, unsafe = (f"MARK-{uuid.uuid4().hex}-{f}" for f in ("key-twice", "key-unsafe"))

    async def rejected() -> None:
        await _send_raw(settings, run_id, [
            _doc(run_id, "twice", f'{{"name": "x", "value": {{"{twice}": 1, "{twice}": 2}}}}'),  # decode_error
            _doc(run_id, "unsafe", f'{{"name": "x", "value": {{"{unsafe}": 9007199254740993}}}}'),  # unsafe_integer
        ])
        found = await _rejections_of(settings, worker, run_id, 2)
        assert sorted(r["reason"] for r in found) == ["decode_error", "unsafe_integer"]
        await _sink_caught_up(settings, worker)

    asyncio.run(rejected())
    assert _scan(settings, worker, {twice, unsafe}, {"ingest"}) == {twice, unsafe}


def _otlp_json(trace_id: str, run_id: str, user: str, asked: str, answered: str) -> bytes:
    """An OTLP/JSON trace export: one GenAI chat span of conversation ``run_id``."""
    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    span = {"traceId": trace_id, "spanId": uuid.uuid4().hex[:16], "name": "chat claude-x", "kind": 3,
            "startTimeUnixNano": "1764000000000000000", "endTimeUnixNano": "1764000001000000000",
            "attributes": [attr("gen_ai.operation.name", "chat"), attr("gen_ai.provider.name", "anthropic"),
                           attr("gen_ai.request.model", "claude-x"), attr("gen_ai.conversation.id", run_id),
                           attr("user.id", user),
                           attr("gen_ai.input.messages", json.dumps([{"role": "user", "parts": [
                               {"type": "text", "content": asked}]}])),
                           attr("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": [
                               {"type": "text", "content": answered}]}]))]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}).encode()


def _post(url: str, body: bytes, content_type: str) -> int | None:
    """The HTTP status of a POST; None while nothing listens."""
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def test_otel_content_stays_in_the_plaintext_topics(settings, worker):
    settings = worker.settings
    run_id = f"otel-{uuid.uuid4().hex[:8]}"
    asked, answered, body, user = (f"MARK-{uuid.uuid4().hex}-{f}" for f in ("otel-asked", "otel-answered",
                                                                           "otel-body", "otel-user"))
    url = f"http://127.0.0.1:{settings.otlp_port}/v1/traces"

    async def exported() -> None:
        async def refused():  # a body that is no trace export: a 400 also says the receiver is up
            return await asyncio.to_thread(_post, url, b"\x00not a trace export " + body.encode(),
                                           "application/x-protobuf")

        assert await wait_until(refused, timeout=120, what="the OTLP receiver", worker=worker) == 400
        assert _post(url, _otlp_json(uuid.uuid4().hex, run_id, f"{user}@example.com", asked, answered),
                     "application/json") == 200

        async def committed():
            docs = [c["doc"] for c in await read_run(settings, run_id)]  # opened
            return docs if found_in(json.dumps(docs).encode(), {asked, answered}) == {asked, answered} else None

        await wait_until(committed, timeout=180, what="the span's run committed", worker=worker)
        await _rejections_of(settings, worker, None, 1)
        await _sink_caught_up(settings, worker)

    asyncio.run(exported())
    assert _scan(settings, worker, {asked, answered, body, user}, {"ingest", "spans", "otel-events"}) >= {
        asked, answered}


def _otlp_refused_span(trace_id: str, run_id: str, user: str, tokens: str) -> bytes:
    """An OTLP/JSON trace export: an agent span starting run ``run_id`` of subject ``user``, and a chat span in it
    whose token count is text (``tokens``), which the mapping refuses (quoting it)."""
    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    agent = {"traceId": trace_id, "spanId": uuid.uuid4().hex[:16], "name": "invoke_agent planner", "kind": 1,
             "startTimeUnixNano": "1764000000000000000", "endTimeUnixNano": "1764000003000000000",
             "attributes": [attr("gen_ai.operation.name", "invoke_agent"), attr("gen_ai.agent.name", "planner"),
                            attr("gen_ai.conversation.id", run_id), attr("user.id", user)]}
    chat = {"traceId": trace_id, "spanId": uuid.uuid4().hex[:16], "parentSpanId": agent["spanId"],
            "name": "chat claude-x", "kind": 3,
            "startTimeUnixNano": "1764000001000000000", "endTimeUnixNano": "1764000002000000000",
            "attributes": [attr("gen_ai.operation.name", "chat"), attr("gen_ai.provider.name", "anthropic"),
                           attr("gen_ai.request.model", "claude-x"), attr("gen_ai.usage.input_tokens", tokens)]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "t"}, "spans": [agent, chat]}]}]}).encode()


def test_erasing_a_subject_erases_the_rejected_spans_of_its_otel_runs(settings, worker):
    settings = worker.settings
    run_id, user = f"otel-{uuid.uuid4().hex[:8]}", f"{uuid.uuid4().hex[:8]}@example.com"
    tokens = f"MARK-{uuid.uuid4().hex}-tokens"
    url = f"http://127.0.0.1:{settings.otlp_port}/v1/traces"
    body = _otlp_refused_span(uuid.uuid4().hex, run_id, user, tokens)

    async def rejected() -> dict[str, Any]:
        async def posted():
            return await asyncio.to_thread(_post, url, body, "application/json")

        assert await wait_until(posted, timeout=120, what="the OTLP receiver", worker=worker) == 200
        async def committed():  # run.started, the refused span's place (log.appended), run.completed
            return len(await read_run(settings, run_id, opened=False)) >= 3 or None

        await wait_until(committed, timeout=180, what="the OTel run committed", worker=worker)
        [found] = await _rejections_of(settings, worker, run_id, 1)
        return found

    found = asyncio.run(rejected())
    assert found["reason"] == "invalid_payload" and tokens in found["detail"]  # opened: the reason quotes it
    assert found_in(base64.b64decode(found["raw"]), {tokens}) == {tokens}

    done = agentlog_cli(settings, "erase", "--subject", user, "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    erased = json.loads(done.stdout)["runs"]
    spans_topic = topic_name(settings, "spans")
    assert run_id in erased and any(r.startswith(f"rejections/~{spans_topic}/") and r.endswith(f"/{run_id}")
                                    for r in erased), erased

    async def after() -> dict[str, Any]:
        [again] = [r for r in await read_rejections(settings) if r.get("runId") == run_id]
        return again

    again = asyncio.run(after())
    assert (again["raw"], again["detail"], again["reason"]) == (ERASED, ERASED, "invalid_payload")
