"""The publisher SDK against a real broker: what a host emits is what the ingest topic holds."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentlog.schemas.cachekey import RECIPE_IDS, cache_key
from agentlog.schemas.errors import ContractError, EventRejected
from agentlog.schemas.upstream import upstream_file
from agentlog.streams.admin import topic_partitions
from agentlog.streams.codec import decode_ingest
from agentlog.streams.publisher import Publisher, SyncPublisher
from agentlog.streams.reader import read_run, read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import partition_for, topic_name

pytestmark = pytest.mark.kafka

UPSTREAM_SCHEMA = upstream_file("openwop/schemas/run-event.schema.json")

REQUEST = {
    "provider": "openai",
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
}


@pytest.fixture(scope="module")
def upstream_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(UPSTREAM_SCHEMA.read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


async def raw_records(settings: Settings) -> list[tuple[int, bytes | None, bytes]]:
    """Every ingest record as (partition, key, value bytes), read with a bare consumer."""
    topic = topic_name(settings, "ingest")
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in (await topic_partitions(settings, [topic]))[topic]]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = []
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                for m in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    out.append((tp.partition, m.key, m.value))
        return out
    finally:
        await consumer.stop()


async def emit_a_run(pub: Publisher, run_id: str) -> list[dict]:
    run = pub.run(run_id, engine_version="test-1.0")
    docs = [await run.emit("run.started", {"bindings": {"engineVersion": "test-1.0"}})]
    docs.append(await run.emit("variable.changed", {"name": "x", "value": 1}, caused_by=docs[0]))
    started = await run.llm_request(REQUEST, node_id="planner", caused_by=docs[-1])
    docs.append(started)
    docs.append(await run.llm_response(started, {"text": "hello"}, usage={"inputTokens": 3, "outputTokens": 1}))
    call = await run.tool_call("search", {"q": "kafka"}, node_id="worker")
    docs += [call, await run.tool_result(call, {"hits": 2})]
    docs.append(await run.usage("openai", "gpt-4o", 3, 1, cost_cents=0.02))
    docs.append(await run.emit("run.completed", None, caused_by=docs[0]["eventId"]))
    return docs


@pytest.mark.parametrize("wire", ["avro", "json"])
def test_emitted_run_is_on_ingest_in_order_keyed_by_run(settings: Settings, wire: str, upstream_validator) -> None:
    async def scenario() -> tuple[list[dict], list]:
        async with Publisher(settings, wire=wire) as pub:
            docs = await emit_a_run(pub, "run-a")
        return docs, await raw_records(settings)

    sent, records = asyncio.run(scenario())
    assert len(records) == len(sent)
    part = partition_for(settings, "run-a")
    assert {(p, k) for p, k, _ in records} == {(part, b"run-a")}
    assert {v[0] for _, _, v in records} == ({0x00} if wire == "avro" else {ord("{")})
    got = [decode_ingest(v) for _, _, v in records]
    assert got == sent
    assert [d["sequence"] for d in got] == list(range(len(sent)))
    assert len({d["eventId"] for d in got}) == len(got)
    for doc in got:
        upstream_validator.validate(doc)
    # causation: explicit ids, docs, and the LLM/tool helpers' implicit links
    by_type = {d["type"]: d for d in got}
    assert got[1]["causationId"] == got[0]["eventId"]
    assert by_type["agent.invocation.completed"]["causationId"] == by_type["agent.invocation.started"]["eventId"]
    assert by_type["agent.toolReturned"]["causationId"] == by_type["agent.toolCalled"]["eventId"]
    assert by_type["run.completed"]["causationId"] == got[0]["eventId"]
    assert "causationId" not in by_type["agent.toolCalled"]
    # LLM payloads carry the key and recipe id computed by the schemas package
    started = by_type["agent.invocation.started"]["payload"]
    assert started["cacheKey"] == cache_key(REQUEST, recipe="v2")
    assert started["recipe"] == RECIPE_IDS["v2"]
    assert by_type["agent.invocation.completed"]["payload"]["cacheKey"] == started["cacheKey"]
    assert all(d["engineVersion"] == "test-1.0" for d in got)


def test_invalid_emit_raises_and_keeps_its_sequence(settings: Settings) -> None:
    async def scenario() -> list[dict]:
        async with Publisher(settings) as pub:
            run = pub.run("run-b", start_sequence=5)
            first = await run.emit("run.started", {"bindings": {}})
            with pytest.raises(EventRejected) as unsafe:
                await run.emit("variable.changed", {"name": "n", "value": 2**60})
            assert unsafe.value.code == "unsafe_integer"
            with pytest.raises(EventRejected) as unknown:
                await run.emit("no.such.type", {})
            assert unknown.value.code == "unknown_event_type"
            with pytest.raises(ContractError):
                await run.emit("variable.changed", {"name": "n", "value": 1}, caused_by={"no": "eventId"})
            assert run.next_sequence == 6
            second = await run.emit("variable.changed", {"name": "n", "value": 2}, caused_by=first)
            assert second["sequence"] == 6
        return [item["doc"] for item in await read_run(settings, "run-b", short_name="ingest")]

    docs = asyncio.run(scenario())
    assert [(d["type"], d["sequence"]) for d in docs] == [("run.started", 5), ("variable.changed", 6)]


def test_close_delivers_every_emit_without_explicit_flush(settings: Settings) -> None:
    n = 3000

    async def scenario() -> tuple[list[str], list[dict]]:
        ids = []
        async with Publisher(settings, linger_ms=50) as pub:
            runs = [pub.run(f"run-c{i}") for i in range(3)]
            for i in range(n):
                doc = await runs[i % 3].emit("variable.changed", {"name": "i", "value": i})
                ids.append(doc["eventId"])
            # leaving the block must flush: nothing awaited delivery so far
        got = [v async for _, _, _, v in read_topic(settings, "ingest")]
        return ids, got

    ids, got = asyncio.run(scenario())
    assert sorted(d["eventId"] for d in got) == sorted(ids)
    for i in range(3):
        seqs = [d["sequence"] for d in got if d["runId"] == f"run-c{i}"]
        assert seqs == list(range(n // 3))  # per-run order survives batching and retries


def test_emit_and_wait_is_acknowledged_before_return(settings: Settings) -> None:
    async def scenario() -> list[dict]:
        async with Publisher(settings) as pub:
            run = pub.run("run-d")
            doc = await run.emit_and_wait("run.started", {"bindings": {}})
            # Still inside the publisher, no flush: a fresh reader must already see it.
            seen = await read_run(settings, "run-d", short_name="ingest")
            assert [item["doc"] for item in seen] == [doc]
            return [doc]

    asyncio.run(scenario())


def test_sync_publisher(settings: Settings, upstream_validator) -> None:
    with SyncPublisher(settings, wire="json") as pub:
        run = pub.run("run-e")
        started = run.emit("run.started", {"bindings": {}})
        llm = run.llm_request(REQUEST, node_id="n1", recipe="v1", caused_by=started)
        refusal = run.llm_refusal(llm, "policy")
        run.flush()
        assert run.next_sequence == 3
    docs = [item["doc"] for item in asyncio.run(read_run(settings, "run-e", short_name="ingest"))]
    assert docs == [started, llm, refusal]
    assert llm["payload"]["recipe"] == RECIPE_IDS["v1"]
    assert refusal["payload"] == {"cacheKey": cache_key(REQUEST, recipe="v1"), "reason": "policy"}
    assert refusal["causationId"] == llm["eventId"]
    for doc in docs:
        upstream_validator.validate(doc)


def test_avro_and_json_share_the_ingest_topic(settings: Settings) -> None:
    async def scenario() -> list[dict]:
        async with Publisher(settings, wire="avro") as avro, Publisher(settings, wire="json") as plain:
            a = avro.run("run-f")
            j = plain.run("run-f", start_sequence=2)
            sent = [await a.emit("run.started", {"bindings": {}}), await a.emit("output.chunk", {"text": "ü"})]
            await avro.flush()
            sent.append(await j.emit("run.completed", {"status": "completed"}, caused_by=sent[0]))
        records = await raw_records(settings)
        assert sorted(v[0] for _, _, v in records) == sorted([0, 0, ord("{")])
        return sent

    sent = asyncio.run(scenario())
    got = [item["doc"] for item in asyncio.run(read_run(settings, "run-f", short_name="ingest"))]
    assert got == sent


def test_batches_keep_per_run_order_under_concurrent_emitters(settings: Settings) -> None:
    """The SDK fills its own per-partition batches: full ones, lingered ones and the ones
    emit_and_wait sends at once interleave across concurrent runs; each run still lands whole,
    once, in sequence order."""
    per_run, runs = 400, 6

    async def emitter(pub: Publisher, r: int) -> list[str]:
        run = pub.run(f"run-b{r}")
        ids = []
        for i in range(per_run):
            if i % 97 == 50:
                doc = await run.emit_and_wait("variable.changed", {"name": "w", "value": i})
            else:
                doc = await run.emit("variable.changed", {"name": "i", "value": i, "pad": "x" * (i % 300)})
            ids.append(doc["eventId"])
            if i % 7 == r:
                await asyncio.sleep(0.002 if i % 2 else 0)  # let timers fire and other runs interleave
        return ids

    async def scenario() -> tuple[list[list[str]], list[dict]]:
        async with Publisher(settings, linger_ms=1, max_batch_bytes=4096) as pub:
            ids = await asyncio.gather(*(emitter(pub, r) for r in range(runs)))
        got = [v async for _, _, _, v in read_topic(settings, "ingest")]
        return ids, got

    ids, got = asyncio.run(scenario())
    for r in range(runs):
        mine = [d for d in got if d["runId"] == f"run-b{r}"]
        assert [d["sequence"] for d in mine] == list(range(per_run))
        assert [d["eventId"] for d in mine] == ids[r]


def test_flush_returns_while_emitters_go_on_and_covers_what_came_before(settings: Settings) -> None:
    """``flush`` waits for what was emitted before it, not for what other emitters add meanwhile (were
    it to wait until nothing at all is pending, continuous emitters would keep it from returning),
    and every record emitted before it is on the topic when it returns."""
    emitted: list[str] = []
    stop = asyncio.Event()

    async def emitter(pub: Publisher, r: int) -> None:
        run = pub.run(f"run-f{r}")
        i = 0
        while not stop.is_set():
            doc = await run.emit("variable.changed", {"name": "i", "value": i, "pad": "x" * 200})
            emitted.append(doc["eventId"])
            i += 1
            if i % 3 == 0:
                await asyncio.sleep(0)

    async def scenario() -> None:
        async with Publisher(settings, linger_ms=20, max_batch_bytes=2048) as pub:
            tasks = [asyncio.ensure_future(emitter(pub, r)) for r in range(4)]
            try:
                for _ in range(4):
                    await asyncio.sleep(0.05)
                    before = set(emitted)
                    await pub.flush()
                    on_topic = {v["eventId"] async for _, _, _, v in read_topic(settings, "ingest")}
                    assert before <= on_topic, f"{len(before - on_topic)} emitted before flush are not on the topic"
            finally:
                stop.set()
                await asyncio.gather(*tasks)

    asyncio.run(scenario())
