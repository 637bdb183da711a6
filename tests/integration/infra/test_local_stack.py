"""`agentlog infra` on a stack of its own (separate home and ports), so the session broker is untouched.

What a user relies on: ``up`` twice is harmless, ``down`` leaves no process behind, data survives
``down``/``up``, and misuse answers in one line with a stable code.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentlog.infra.kafka import local
from agentlog.schemas.errors import InfraError
from agentlog.streams.settings import load_settings
from tests.tools import free_port_range

# Every test here runs the local-stack machinery (java, the Maven jars, a broker of its own on free
# ports, or a start that must fail): never part of the broker-free selection.
pytestmark = pytest.mark.kafka

AGENTLOG = [sys.executable, "-m", "agentlog"]


def _cli(home: Path, port: int, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "AGENTLOG_HOME": str(home), "AGENTLOG_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", **env}
    return subprocess.run([*AGENTLOG, *args], capture_output=True, text=True, env=full_env, timeout=600)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


async def _produce_and_count(bootstrap: str, topic: str, value: bytes | None) -> int:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    if value is not None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            await producer.send_and_wait(topic, key=b"k", value=value)
        finally:
            await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()


@pytest.mark.slow
def test_up_is_idempotent_down_leaves_no_process_and_data_survives(tmp_path: Path) -> None:
    port = free_port_range(2)
    bootstrap = f"127.0.0.1:{port}"
    try:
        first = _cli(tmp_path, port, "infra", "up", "--no-migrate", "--json")
        assert first.returncode == 0, first.stderr
        up = json.loads(first.stdout)
        assert up["alreadyRunning"] is False and up["bootstrap"] == bootstrap
        pid = up["nodes"][0]["pid"]
        assert _process_exists(pid)
        assert asyncio.run(_produce_and_count(bootstrap, "survivor", b"kept")) == 1

        again = _cli(tmp_path, port, "infra", "up", "--no-migrate")
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stdout

        status = _cli(tmp_path, port, "infra", "status", "--json")
        assert status.returncode == 0
        assert [n["pid"] for n in json.loads(status.stdout)["nodes"]] == [pid]

        down = _cli(tmp_path, port, "infra", "down")
        assert down.returncode == 0, down.stderr
        assert f"pid {pid}" in down.stdout
        assert not _process_exists(pid)
        assert not (tmp_path / "kafka" / "node-0" / "kafka.pid").exists()
        assert local.port_free(port) and local.port_free(port + 1)
        stopped = _cli(tmp_path, port, "infra", "status")
        assert stopped.returncode == 1

        restarted = _cli(tmp_path, port, "infra", "up", "--no-migrate", "--json")
        assert restarted.returncode == 0, restarted.stderr
        assert asyncio.run(_produce_and_count(bootstrap, "survivor", None)) == 1

        # The test fixture's fresh start: a running stack is never wiped; a stopped one loses its
        # data and topology but keeps its lock files.
        settings = load_settings(home=tmp_path, kafka_bootstrap=bootstrap)
        assert local.wipe_stopped(settings) is False
        assert (tmp_path / "kafka" / "node-0").exists()
        assert _cli(tmp_path, port, "infra", "down").returncode == 0
        assert local.wipe_stopped(settings) is True
        assert not (tmp_path / "kafka" / "node-0").exists() and not (tmp_path / "kafka" / "cluster.json").exists()
        assert (tmp_path / "kafka" / ".lock").exists()
    finally:
        _cli(tmp_path, port, "infra", "down", "--purge")
    assert not (tmp_path / "kafka" / "node-0").exists()


def test_port_taken_is_reported_with_the_port_and_the_process(tmp_path: Path) -> None:
    port = free_port_range(2)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        settings = load_settings(home=tmp_path, kafka_bootstrap=f"127.0.0.1:{port}")
        with pytest.raises(InfraError) as err:
            local.start(settings)
    assert err.value.code == "port_in_use"
    assert f"127.0.0.1:{port}" in str(err.value)
    assert f"pid {os.getpid()}" in str(err.value)
    assert local.status(settings) == [] or not any(n.alive for n in local.status(settings))


def test_port_taken_via_cli_is_one_line_with_exit_2(tmp_path: Path) -> None:
    port = free_port_range(2)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + 1))  # the controller port this time
        squatter.listen()
        result = _cli(tmp_path, port, "infra", "up", "--no-migrate")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error[port_in_use]:") and str(port + 1) in result.stderr


def test_java_missing(tmp_path: Path) -> None:
    local.ensure_kafka_jars()  # so the first thing start() needs is java itself
    result = _cli(tmp_path, free_port_range(2), "infra", "up", "--no-migrate", PATH=str(tmp_path), JAVA_HOME="")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error[java_missing]:")


def test_maven_missing(tmp_path: Path) -> None:
    result = _cli(
        tmp_path, free_port_range(2), "infra", "up", "--no-migrate",
        PATH=str(tmp_path), HOME=str(tmp_path / "empty-home"),  # no jars cached under this home
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error[maven_failed]:") and "mvn" in result.stderr


def test_maven_failure_names_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "KAFKA_VERSION", "0.0.0-no-such-release")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(InfraError) as err:
        local.ensure_kafka_jars()
    assert err.value.code == "maven_failed"
    assert "0.0.0-no-such-release" in str(err.value)
    assert not (local.kafka_cache_dir() / "libs").exists()


def test_broker_that_cannot_start_points_at_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port_range(2)
    monkeypatch.setattr(local, "KAFKA_HEAP", "-Xmx1m")
    settings = load_settings(home=tmp_path, kafka_bootstrap=f"127.0.0.1:{port}")
    with pytest.raises(InfraError) as err:
        local.start(settings)
    assert err.value.code == "broker_start_failed"
    assert "heap" in str(err.value).lower() and "stdout.log" in str(err.value)
    assert not any(n.alive for n in local.status(settings))
