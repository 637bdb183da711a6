"""Can Faust's ``processing_guarantee="exactly_once"`` run a re-keying agent exactly once? Measured, not assumed.

``python -m tests.bench.faust_eos_rekey`` starts a broker of its own on port 39192 (home
``/tmp/eos-home/.agentlog/test-stack``), and for each case makes an input and an output topic of 4 partitions
(names unique to the run) and runs a Faust worker in a subprocess: ``faust.App(...,
processing_guarantee="exactly_once")`` and one agent that sends, for each input record (key K, value V), one
record (key ``f(K)``, value V) with ``Topic.send``. Only public Faust and aiokafka API.

Cases (``--cases``): ``rekey`` (``f(K) = "out-" + K``; every key is picked so that ``f(K)`` lands on another
partition than K) and ``copartitioned`` (``f(K) = K``, the control), each once with the output topic read by
no agent of the app (``sink``) and once with a second agent of the app reading it (``consumed``), which puts it
in the input's topic group. Faust's ``TransactionManager.send`` places a send in the transaction
``{app}-{group}-{partition}`` of its destination partition only when the app's consumer has the destination
topic's metadata, that is when the app reads it; a send to any other topic goes out through the app's plain
producer, in no transaction. The output log's batch headers (Kafka's ``DumpLogSegments``) show which it was.

Scenario A (a quiet after a burst): N records (default 2,000) on keys of input partitions 0 and 1 only; once the
group's committed offsets reach the input's ends, wait 20 s and count the output records a ``read_committed``
consumer sees; count again past the producers' transaction timeout (aiokafka's 60 s), when the coordinator
has aborted whatever transaction is still open; then publish 200 records on all four partitions and count
those, to see whether the worker goes on.
Scenario B (crashes): N records (default 8,000 at 100/s) on keys of all four input partitions, published at a
steady rate while the worker is SIGKILLed and started again (``--kills``, default 3; each kill 3 to 5.8 s after
the worker joined its group, at a new phase of Faust's 2.8 s commit interval each time); then wait until the
committed offsets reach the input's ends (or 120 s) and count what ``read_committed`` sees: values missing
(lost) and values seen twice or more (duplicates).

Prints one JSON line. Worker logs go to ``/tmp/eos-home/runs/<run>/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import DefaultPartitioner

HOME = Path("/tmp/eos-home")
STACK_HOME = HOME / ".agentlog" / "test-stack"
BOOTSTRAP = "127.0.0.1:39192"
PARTITIONS = 4
REPO = Path(__file__).resolve().parents[2]
#: aiokafka's default ``transaction_timeout_ms``; Faust offers no setting for it. The coordinator aborts a
#: transaction open this long, so a count after it says whether an output was late or lost.
TRANSACTION_TIMEOUT_S = 60.0
#: Faust's default is 60 s: a SIGKILLed member would hold the group that long before its successor joins (6 s is the
#: broker's least).
SESSION_TIMEOUT_S = 6.0
QUIET_S = 20.0
SETTLE_TIMEOUT_S = 120.0
#: Scenario A's input partitions: the other two get no record, so their transactions never have an offset to commit.
BURST_PARTITIONS = (0, 1)
#: Scenario A's second input, on all four partitions, published once the first one's open transactions are aborted.
MORE = 200
#: Faust's default ``broker_commit_interval``: a commit (one transaction per source partition) every 2.8 s.
COMMIT_INTERVAL_S = 2.8


def kill_delay(k: int) -> float:
    """How long after its k-th (re)join the worker is SIGKILLed: 3 s or more, at a new phase of the commit interval."""
    return 3.0 + (k * 0.93) % COMMIT_INTERVAL_S

_partitioner = DefaultPartitioner()


# --------------------------------------------------------------------------- keys and counts (pure)


def partition_of(key: bytes) -> int:
    """The partition aiokafka's (and Faust's) default partitioner gives ``key`` in a 4-partition topic."""
    return int(_partitioner(key, list(range(PARTITIONS)), list(range(PARTITIONS))))


def out_key(key: bytes, *, rekey: bool) -> bytes:
    """The output record's key: another partition's key when re-keying, the input's key otherwise."""
    return b"out-" + key if rekey else key


def pick_keys(count: int, *, partitions: Iterable[int], rekey: bool) -> list[bytes]:
    """``count`` keys on ``partitions`` whose output key lands on another partition (rekey) or the same one."""
    wanted = set(partitions)
    keys: list[bytes] = []
    i = 0
    while len(keys) < count:
        key = f"k{i}".encode()
        i += 1
        p = partition_of(key)
        if p in wanted and (partition_of(out_key(key, rekey=rekey)) != p) == rekey:
            keys.append(key)
    return keys


@dataclass(frozen=True)
class Tally:
    """What a reader saw of the values sent: how many records, how many values missing, how many seen twice or more."""

    sent: int
    visible: int
    distinct: int
    missing: int
    duplicated: int
    extra_copies: int

    @classmethod
    def of(cls, sent: range, seen: Counter[int]) -> Tally:
        counts = [seen[v] for v in sent if v in seen]
        return cls(
            sent=len(sent),
            visible=sum(counts),
            distinct=len(counts),
            missing=len(sent) - len(counts),
            duplicated=sum(1 for c in counts if c >= 2),
            extra_copies=sum(c - 1 for c in counts if c >= 2),
        )


# --------------------------------------------------------------------------- the Faust worker (a subprocess)


def worker_main() -> None:
    """The Faust app of one case, from ``EOS_*`` variables; runs until killed or stopped."""
    import faust

    env = os.environ
    rekey = env["EOS_MODE"] == "rekey"
    app = faust.App(
        env["EOS_APP_ID"],
        broker=f"kafka://{env['EOS_BOOTSTRAP']}",
        processing_guarantee="exactly_once",
        store="memory://",
        autodiscover=False,
        web_enabled=False,
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=1.0,
        datadir=env["EOS_DATADIR"],
    )
    raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
    source = app.topic(env["EOS_INPUT"], **raw)
    sink = app.topic(env["EOS_OUTPUT"], **raw)

    @app.agent(source)
    async def forward(stream: Any) -> None:
        async for key, value in stream.items():
            await sink.send(key=out_key(key, rekey=rekey), value=value)

    if env["EOS_OUTPUT_CONSUMED"] == "1":
        @app.agent(sink)
        async def drain(stream: Any) -> None:
            async for _ in stream:
                pass

    @app.on_rebalance_complete.connect
    async def ready(app: Any, **kwargs: Any) -> None:
        print("rebalance complete", flush=True)

    faust.Worker(app, loglevel="WARNING").execute_from_commandline()


# --------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class Case:
    run: str
    name: str
    rekey: bool
    consumed: bool

    @property
    def label(self) -> str:
        return f"{'rekey' if self.rekey else 'copartitioned'}/{'consumed' if self.consumed else 'sink'}"

    def topics(self, scenario: str) -> tuple[str, str, str]:
        base = f"eos-{self.run}-{self.name}-{scenario}"
        return f"{base}-in", f"{base}-out", f"{base}-app"


class Worker:
    """The Faust worker subprocess of one scenario; every start is logged to its own file."""

    def __init__(self, case: Case, app_id: str, source: str, sink: str, logs: Path) -> None:
        self.env = {
            **os.environ, "PYTHONUNBUFFERED": "1", "EOS_APP_ID": app_id, "EOS_BOOTSTRAP": BOOTSTRAP,
            "EOS_INPUT": source, "EOS_OUTPUT": sink, "EOS_MODE": "rekey" if case.rekey else "copartitioned",
            "EOS_OUTPUT_CONSUMED": "1" if case.consumed else "0", "EOS_DATADIR": str(logs / f"{app_id}-data"),
        }
        self.logs = logs
        self.app_id = app_id
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.starts += 1
        log = self.logs / f"{self.app_id}-{self.starts}.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.faust_eos_rekey", "worker"],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def log_text(self) -> str:
        return (self.logs / f"{self.app_id}-{self.starts}.log").read_text(errors="replace")

    async def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "rebalance complete" not in self.log_text():
            assert self.proc is not None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Faust worker did not join its group; see {self.logs}")
            await asyncio.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def errors(self) -> list[str]:
        """The distinct error lines of every start's log (the worker runs at WARNING)."""
        lines: list[str] = []
        for n in range(1, self.starts + 1):
            for line in (self.logs / f"{self.app_id}-{n}.log").read_text(errors="replace").splitlines():
                if "ERROR" in line or "Error" in line or "Exception" in line:
                    text = line.split("]", 1)[-1].strip()[:200]
                    if text not in lines:
                        lines.append(text)
        return lines[:8]


async def create_topics(*names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names])
    finally:
        await admin.close()


async def delete_topics(names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


async def publish(topic: str, keys: list[bytes], values: range, *, per_second: float | None = None) -> None:
    """``values`` as text, key ``keys[v % len(keys)]``; at ``per_second`` in batches of 20, or at once."""
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        batch = 20
        started = time.monotonic()
        for first in range(0, len(values), batch):
            futures = [await producer.send(topic, str(v).encode(), key=keys[v % len(keys)])
                       for v in values[first:first + batch]]
            await asyncio.gather(*futures)
            if per_second:
                await asyncio.sleep(max(0.0, started + (first + batch) / per_second - time.monotonic()))
    finally:
        await producer.stop()


async def end_offsets(topic: str, isolation_level: str) -> dict[int, int]:
    """Each partition's end: the high watermark (read_uncommitted) or the last stable offset (read_committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, isolation_level=isolation_level,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def committed(group: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0}
    finally:
        await admin.close()


async def settle(group: str, topic: str, timeout_s: float) -> tuple[bool, float]:
    """Wait until ``group``'s committed offsets reach ``topic``'s ends; (reached, seconds waited)."""
    ends = await end_offsets(topic, "read_uncommitted")
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        done = await committed(group, topic)
        if all(done.get(p, 0) >= end for p, end in ends.items()):
            return True, time.monotonic() - started
        await asyncio.sleep(1.0)
    return False, time.monotonic() - started


async def read_values(topic: str, isolation_level: str, timeout_s: float = 30.0) -> tuple[Counter[int], dict[int, int]]:
    """Every value of ``topic`` a reader at ``isolation_level`` sees now, and how many records each partition gave."""
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, isolation_level=isolation_level,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    seen: Counter[int] = Counter()
    per_partition = {p: 0 for p in range(PARTITIONS)}
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            positions = {tp: await consumer.position(tp) for tp in tps}
            if all(positions[tp] >= ends[tp] for tp in tps):
                break
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    if record.offset < ends[tp]:
                        seen[int(record.value)] += 1
                        per_partition[tp.partition] += 1
    finally:
        await consumer.stop()
    return seen, per_partition


async def observe(sink: str, sent: range) -> dict[str, Any]:
    """What ``read_committed`` sees of the output, beside everything written to it (read_uncommitted).

    ``visible`` is a Counter: looking up a value it never saw adds nothing to its counts.
    """
    visible, visible_by_partition = await read_values(sink, "read_committed")
    written, written_by_partition = await read_values(sink, "read_uncommitted")
    return {
        **asdict(Tally.of(sent, visible)),
        "written": sum(written.values()),
        "visible_by_partition": visible_by_partition,
        "written_by_partition": written_by_partition,
        "stable_end": await end_offsets(sink, "read_committed"),
        "high_watermark": await end_offsets(sink, "read_uncommitted"),
        "duplicated_values": [v for v in sent if visible[v] >= 2],
    }


def log_batches(sink: str) -> dict[str, dict[int, int]] | None:
    """What the broker's log holds for ``sink``, per partition, read with Kafka's own ``DumpLogSegments``.

    Data records written in a transaction or outside one, and the transactions' COMMIT and ABORT markers: a
    consumer cannot tell a transactional record from another, the log segment's batch header can.
    """
    java = shutil.which("java")
    if java is None:
        return None
    from agentlog.infra.kafka import local

    data = local.status(load_stack_settings())[0].node_dir / "data"
    libs = local.ensure_kafka_jars()
    tally: dict[str, dict[int, int]] = {k: {} for k in ("transactional", "plain", "commit", "abort")}
    for p in range(PARTITIONS):
        files = sorted(str(f) for f in (data / f"{sink}-{p}").glob("*.log"))
        out = subprocess.run([java, "-cp", f"{libs}/*", "kafka.tools.DumpLogSegments", "--deep-iteration",
                              "--files", ",".join(files)], capture_output=True, text=True, check=True).stdout
        counts = dict.fromkeys(tally, 0)
        for line in out.splitlines():
            if line.startswith("baseOffset:") and "isControl: false" in line:
                n = int(re.search(r"count: (\d+)", line).group(1))  # type: ignore[union-attr]
                counts["transactional" if "isTransactional: true" in line else "plain"] += n
            elif "endTxnMarker: COMMIT" in line:
                counts["commit"] += 1
            elif "endTxnMarker: ABORT" in line:
                counts["abort"] += 1
        for k, v in counts.items():
            tally[k][p] = v
    return tally


def load_stack_settings() -> Any:
    """The settings of this experiment's own broker (port 39192, its own home)."""
    from agentlog.streams.settings import load_settings

    return load_settings(home=STACK_HOME, kafka_bootstrap=BOOTSTRAP)


async def scenario_a(case: Case, logs: Path, n: int) -> dict[str, Any]:
    source, sink, app_id = case.topics("a")
    await create_topics(source, sink)
    worker = Worker(case, app_id, source, sink, logs)
    worker.start()
    try:
        await worker.wait_ready()
        keys = pick_keys(64, partitions=BURST_PARTITIONS, rekey=case.rekey)
        burst = range(n)
        await publish(source, keys, burst)
        reached, waited = await settle(app_id, source, SETTLE_TIMEOUT_S)
        await asyncio.sleep(QUIET_S)
        quiet = await observe(sink, burst)
        await asyncio.sleep(max(0.0, TRANSACTION_TIMEOUT_S + 10.0 - QUIET_S))
        late = await observe(sink, burst)
        # Then input on every partition: does the worker go on, and do these outputs reach readers?
        more = range(n, n + MORE)
        await publish(source, pick_keys(64, partitions=range(PARTITIONS), rekey=case.rekey), more)
        more_reached, _ = await settle(app_id, source, 60.0)
        await asyncio.sleep(2 * COMMIT_INTERVAL_S)
        assert worker.proc is not None
        return {"input_partitions": list(BURST_PARTITIONS),
                "output_partitions": sorted({partition_of(out_key(k, rekey=case.rekey)) for k in keys}),
                "offsets_committed": reached, "settle_s": round(waited, 1),
                f"after_{QUIET_S:.0f}s": quiet, f"after_{TRANSACTION_TIMEOUT_S + 10.0:.0f}s": late,
                "then_all_partitions": {"offsets_committed": more_reached, "worker_alive": worker.proc.poll() is None,
                                        **await observe(sink, more)},
                "log": log_batches(sink), "worker_errors": worker.errors()}
    finally:
        worker.stop()


async def scenario_b(case: Case, logs: Path, n: int, rate: float, n_kills: int) -> dict[str, Any]:
    source, sink, app_id = case.topics("b")
    await create_topics(source, sink)
    worker = Worker(case, app_id, source, sink, logs)
    worker.start()
    try:
        await worker.wait_ready()
        keys = pick_keys(64, partitions=range(PARTITIONS), rekey=case.rekey)
        publishing = asyncio.create_task(publish(source, keys, range(n), per_second=rate))
        started = time.monotonic()
        kills: list[float] = []
        for k in range(n_kills):
            await worker.wait_ready()
            await asyncio.sleep(kill_delay(k))
            worker.kill()
            kills.append(round(time.monotonic() - started, 1))
            worker.start()
        await publishing
        span = time.monotonic() - started
        reached, waited = await settle(app_id, source, SETTLE_TIMEOUT_S)
        seen = await observe(sink, range(n))
        duplicated_at = Counter(round(v / rate) for v in seen["duplicated_values"])
        return {"kills_at_s": kills,
                # when each duplicated value was published (s, how many), beside the kills' times
                "duplicates_published_at_s": sorted(duplicated_at.items()),
                "publish_s": round(n / rate, 1), "kills_and_publish_s": round(span, 1),
                "offsets_committed": reached,
                "settle_s": round(waited, 1), "after_settle": seen,
                "log": log_batches(sink), "worker_errors": worker.errors()}
    finally:
        worker.stop()


async def run_case(case: Case, logs: Path, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if "a" in args.scenarios:
        result["A"] = await scenario_a(case, logs, args.n_a)
    if "b" in args.scenarios:
        result["B"] = await scenario_b(case, logs, args.n_b, args.rate, args.kills)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.faust_eos_rekey", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="rekey/sink,copartitioned/sink,rekey/consumed,copartitioned/consumed")
    parser.add_argument("--scenarios", default="ab", help="a, b or ab")
    parser.add_argument("--n-a", type=int, default=2000)
    parser.add_argument("--n-b", type=int, default=8000)
    parser.add_argument("--rate", type=float, default=100.0, help="scenario B's records per second")
    parser.add_argument("--kills", type=int, default=3, help="scenario B's SIGKILLs (give it input to last them)")
    parser.add_argument("--keep-broker", action="store_true", help="leave the broker running afterwards")
    args = parser.parse_args(argv)

    from agentlog.infra.kafka import local

    settings = load_stack_settings()
    local.start(settings)
    run = uuid.uuid4().hex[:8]
    logs = HOME / "runs" / run
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "run": run, "kafka": local.KAFKA_VERSION,
        "versions": {p: version(p) for p in ("faust-streaming", "aiokafka", "mode-streaming")},
        "n_a": args.n_a, "n_b": args.n_b, "rate": args.rate, "kills": args.kills, "cases": {},
    }
    try:
        for label in args.cases.split(","):
            mode, output = label.split("/")
            case = Case(run=run, name=f"{mode[:2]}{output[:2]}", rekey=mode == "rekey", consumed=output == "consumed")
            results["cases"][case.label] = asyncio.run(
                run_case(case, logs, args))
            print(json.dumps({case.label: results["cases"][case.label]}), file=sys.stderr, flush=True)
    finally:
        if not args.keep_broker:
            local.stop(settings)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.argv = sys.argv[:1]
        worker_main()
    else:
        main()
