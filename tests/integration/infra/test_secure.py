"""`agentlog infra up --secure`: a SASL_SSL broker where only the worker may write the log.

One secure broker for the module (a JVM start is slow on a busy 2-core box), started with the CLI as a
user would, on free ports in a tmp home, and purged at the end. Every principal's client is the real
one: kcat (librdkafka) for the refusals, the SDK and ``agentlog publish`` as ``host``, the Faust
worker as ``worker``, ``replay`` and ``export`` as ``worker`` and ``admin``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from agentlog.infra.kafka import local
from agentlog.schemas.canonical import jcs
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import read_run
from agentlog.streams.security import client_kwargs, load_security
from agentlog.streams.settings import Settings, load_settings, settings_env
from agentlog.streams.topics import topic_name
from tests.integration.streams.test_sdk import emit_a_run
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import require_tool
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
PRINCIPALS = ("admin", "worker", "host")


@dataclass(frozen=True)
class SecureStack:
    home: Path
    prefix: str
    bootstrap: str
    files: dict[str, Path]
    passwords: dict[str, str]
    up_output: str

    def settings(self, principal: str, home: Path, **changes: object) -> Settings:
        return load_settings(home=home, topic_prefix=self.prefix, kafka_config=str(self.files[principal]),
                             clickhouse_url=f"chdb://{home / 'ch'}", partitions=2, **changes)


def _free_port_pair() -> int:
    for port in range(29500, 29900, 2):
        if local.port_free(port) and local.port_free(port + 1):
            return port
    raise RuntimeError("no two free ports in 29500..29900")


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings)}
    env.pop("AGENTLOG_KAFKA_BOOTSTRAP", None)  # the properties file names the broker
    return subprocess.run([sys.executable, "-m", "agentlog", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    home = tmp_path_factory.mktemp("secure-home")
    prefix = f"s{uuid.uuid4().hex[:8]}"
    port = _free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    env.update(AGENTLOG_HOME=str(home), AGENTLOG_TOPIC_PREFIX=prefix, AGENTLOG_PARTITIONS="2")
    settings = load_settings(home=home, topic_prefix=prefix, kafka_bootstrap=f"127.0.0.1:{port}", kafka_config="")
    try:
        up = subprocess.run([sys.executable, "-m", "agentlog", "infra", "up", "--secure", "--port", str(port),
                             "--no-migrate"], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert up.returncode == 0, up.stdout + up.stderr
        files = local.secure_properties(settings)
        passwords = json.loads((home / "secure" / "credentials.json").read_text())
        yield SecureStack(home=home, prefix=prefix, bootstrap=f"127.0.0.1:{port}", files=files,
                          passwords=passwords, up_output=up.stdout + up.stderr)
    finally:
        local.stop(settings, purge=True)


# --------------------------------------------------------------------------- kcat


def _kcat_mechanism_args() -> list[str]:
    """librdkafka < 2.6.1 cannot finish SCRAM with Kafka 4 (confluentinc/librdkafka#4895): use PLAIN in TLS.

    Debian 12's kcat links librdkafka 2.0.2. The broker accepts PLAIN for the same users on the same
    TLS listener, so the test still runs kcat with host.properties' user, password and CA.
    """
    banner = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", banner)
    version = tuple(int(x) for x in found.groups()) if found else (0, 0, 0)
    return ["-X", "sasl.mechanism=PLAIN"] if version < (2, 6, 1) else []


def _kcat_produce(args: list[str], topic: str, line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kcat", "-P", *args, "-t", topic, "-K", "\t", "-m", "20",
                           "-X", "message.timeout.ms=15000"],
                          input=line, capture_output=True, text=True, timeout=120)


def _kcat_count(stack: SecureStack, topic: str) -> int:
    """Records on ``topic``, counted as admin."""
    out = subprocess.run(["kcat", "-C", "-F", str(stack.files["admin"]), *_kcat_mechanism_args(), "-t", topic,
                          "-e", "-o", "beginning", "-q", "-f", "x\n"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.count("x")


def test_infra_up_writes_private_client_files_and_prints_no_password(stack):
    assert set(stack.files) == set(PRINCIPALS)
    for principal, path in stack.files.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        security = load_security(load_settings(kafka_config=str(path)))
        assert security is not None
        assert (security.security_protocol, security.sasl_mechanism, security.sasl_username) == (
            "SASL_SSL", "SCRAM-SHA-512", principal)
        assert security.bootstrap_servers == stack.bootstrap
    server_properties = stack.home / "kafka" / "node-0" / "server.properties"
    assert stat.S_IMODE(server_properties.stat().st_mode) == 0o600
    assert str(stack.files["host"]) in stack.up_output
    assert not [p for p in stack.passwords.values() if p in stack.up_output]


def test_kcat_as_host_writes_ingest_and_is_refused_on_the_log(stack):
    require_tool("kcat")
    host = ["-F", str(stack.files["host"]), *_kcat_mechanism_args()]
    ingest, log = f"{stack.prefix}.ingest", f"{stack.prefix}.log"
    before_ingest, before_log = _kcat_count(stack, ingest), _kcat_count(stack, log)

    ok = _kcat_produce(host, ingest, 'kcat-run\t{"hello": "ingest"}\n')
    assert ok.returncode == 0, ok.stderr
    refused = _kcat_produce(host, log, 'kcat-run\t{"forged": "log"}\n')
    assert refused.returncode != 0
    assert "Topic authorization failed" in refused.stderr, refused.stderr

    assert _kcat_count(stack, ingest) == before_ingest + 1
    assert _kcat_count(stack, log) == before_log


def test_kcat_without_valid_credentials_is_refused(stack):
    require_tool("kcat")
    topic = f"{stack.prefix}.ingest"
    before = _kcat_count(stack, topic)
    # No TLS, no SASL: the broker's only client listener speaks neither.
    plain = _kcat_produce(["-b", stack.bootstrap], topic, 'anon\t{"a": 1}\n')
    assert plain.returncode != 0
    # TLS with the right CA but a wrong password: authentication fails.
    wrong = _kcat_produce(["-b", stack.bootstrap, "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=PLAIN",
                           "-X", "sasl.username=host", "-X", "sasl.password=not-the-password",
                           "-X", f"ssl.ca.location={stack.home / 'secure' / 'ca.pem'}"],
                          topic, 'anon\t{"a": 1}\n')
    assert wrong.returncode != 0
    assert "Authentication failed" in wrong.stderr, wrong.stderr
    assert _kcat_count(stack, topic) == before


def test_the_host_principal_may_not_write_any_worker_topic(stack, tmp_path):
    """SCRAM through aiokafka (what the SDK uses): every derived topic refuses ``host``."""
    settings = stack.settings("host", tmp_path)

    async def attempt() -> dict[str, str]:
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True)
        await producer.start()
        outcome = {}
        try:
            for short in ("ingest", "log", "snapshots", "transitions", "violations", "verdicts", "keyring",
                          "erasures"):
                try:
                    await producer.send_and_wait(topic_name(settings, short), b"{}", key=b"forged")
                    outcome[short] = "written"
                except TopicAuthorizationFailedError:
                    outcome[short] = "refused"
        finally:
            await producer.stop()
        return outcome

    assert asyncio.run(attempt()) == {"ingest": "written", "log": "refused", "snapshots": "refused",
                                      "transitions": "refused", "violations": "refused", "verdicts": "refused",
                                      "keyring": "refused", "erasures": "refused"}


def test_the_host_principal_may_not_read_the_keyring(stack, tmp_path):
    settings = stack.settings("host", tmp_path)

    async def attempt() -> None:
        consumer = AIOKafkaConsumer(topic_name(settings, "keyring"), **client_kwargs(settings), group_id=None,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            await consumer.getmany(timeout_ms=5000)
        finally:
            await consumer.stop()

    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(attempt())


def test_pipeline_end_to_end_on_the_secure_broker(stack, tmp_path):
    """host publishes (SDK and CLI), the worker commits to the log, replay and export read it back."""
    host = stack.settings("host", tmp_path / "host")
    worker_settings = stack.settings("worker", tmp_path / "worker")
    admin = stack.settings("admin", tmp_path / "admin")
    cli_run, sdk_run = f"cli-{uuid.uuid4().hex[:8]}", f"sdk-{uuid.uuid4().hex[:8]}"

    events = tmp_path / "run.jsonl"
    cli_docs = realistic_run(cli_run, mode="check")
    events.write_text("".join(json.dumps(d) + "\n" for d in cli_docs))
    published = cli(host, "publish", str(events), "--json", "--no-wait")  # the worker starts below
    assert published.returncode == 0, published.stdout + published.stderr

    async def sdk() -> list[dict]:
        async with Publisher(host) as pub:
            return await emit_a_run(pub, sdk_run)

    sdk_docs = asyncio.run(sdk())

    worker = WorkerProcess(worker_settings).start()
    try:
        async def committed(run_id: str, n: int):
            log = await read_run(worker_settings, run_id)
            return log if len(log) == n else None

        async def both():
            return (await wait_until(lambda: committed(cli_run, len(cli_docs)), timeout=300,
                                     what=f"{cli_run} on the log", worker=worker),
                    await wait_until(lambda: committed(sdk_run, len(sdk_docs)), timeout=120,
                                     what=f"{sdk_run} on the log", worker=worker))

        cli_log, sdk_log = asyncio.run(both())
    finally:
        worker.stop()
    assert [item["doc"]["eventId"] for item in cli_log] == [d["eventId"] for d in cli_docs]
    assert [item["doc"]["eventId"] for item in sdk_log] == [d["eventId"] for d in sdk_docs]

    replayed = cli(worker_settings, "replay", "--run", cli_run, "--from-seq", "0", "--json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["verdict"] == "match"

    out, signed = tmp_path / "export.jsonl", tmp_path / "export.checkpoints.jsonl"
    exported = cli(admin, "export", "--run", sdk_run, "--out", str(out), "--checkpoints", str(signed), "--json")
    assert exported.returncode == 0, exported.stderr
    # the docs, nothing else, in the stored form the checkpoints sign
    stored = asyncio.run(read_run(worker_settings, sdk_run, opened=False))
    assert out.read_bytes().splitlines() == [jcs(item["doc"]) for item in stored]
    assert signed.read_bytes().splitlines(), "the run's signed checkpoints are read as admin (the worker signs its end)"

    # The host may not read the log: export as host fails with a clear error, and shows no password.
    denied = cli(host, "export", "--run", sdk_run)
    assert denied.returncode == 2
    assert "ACLs do not let 'host'" in denied.stderr, denied.stderr

    # Erasing is the admin's alone: the worker principal (which holds the keys) is refused before anything changes.
    as_worker = cli(worker_settings, "erase", "--run", cli_run, "--json")
    assert as_worker.returncode == 2, as_worker.stdout + as_worker.stderr
    assert json.loads(as_worker.stdout)["error"]["code"] == "not_authorized", as_worker.stdout
    assert [item["doc"] for item in asyncio.run(read_run(worker_settings, cli_run))] == cli_docs  # still readable
    as_admin = cli(stack.settings("admin", tmp_path / "worker"), "erase", "--run", cli_run, "--json")
    assert as_admin.returncode == 0, as_admin.stdout + as_admin.stderr
    assert cli_run in json.loads(as_admin.stdout)["runs"]
    verified = cli(worker_settings, "verify", "--run", cli_run, "--json",
                   "--public-key", str(worker_settings.home / "keys" / "ed25519.pub.pem"))
    assert verified.returncode == 0 and json.loads(verified.stdout)["verified"], verified.stdout + verified.stderr
    assert [n for n in json.loads(verified.stdout)["notes"] if json.loads(as_admin.stdout)["receiptId"] in n]

    shown = "\n".join([published.stdout, published.stderr, replayed.stdout, replayed.stderr,
                       exported.stdout, exported.stderr, denied.stdout, denied.stderr, as_worker.stdout,
                       as_worker.stderr, as_admin.stdout, as_admin.stderr, worker.log_tail(10_000)])
    assert not [p for p in stack.passwords.values() if p in shown]


def test_the_demo_runs_with_the_worker_properties(stack, tmp_path):
    """`agentlog demo` with AGENTLOG_KAFKA_CONFIG=worker.properties: the whole tour on the secure broker."""
    from rich.console import Console

    from agentlog.demo.tour import run_demo, stop_worker
    from tests.tools import free_port

    settings = stack.settings("worker", tmp_path).replace(web_port=free_port())
    try:
        summary = run_demo(settings, Console(quiet=True))
    finally:
        stop_worker(settings)
    assert summary.head_verified and len(summary.head_hash) == 64
    assert summary.offset_replay["status"] == "match", summary.offset_replay
