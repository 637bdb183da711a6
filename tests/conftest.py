"""Shared fixtures: one real Apache Kafka broker per machine for the whole suite, chdb per test.

The broker: ``AGENTLOG_KAFKA_BOOTSTRAP`` if set (an existing Kafka), otherwise the local KRaft
broker from ``infra/kafka/local.py`` in ``<repo>/.agentlog/test-stack`` on port 19192. Several
pytest sessions (several engineers, or xdist) may run at once, so:

- starting is serialised by the flock inside ``local.start``; a broker already running is reused;
- every session holds a *shared* flock on ``users.lock`` while it runs; at the end a session may
  stop the broker only if it can take that lock *exclusively* (nobody else is using it), and only if
  a test session started it (marker file) and ``AGENTLOG_KEEP_TEST_BROKER`` is unset. A broker you
  started yourself with ``agentlog infra up`` on that home is never stopped by the tests.

Imports stay light: Kafka/ClickHouse client libraries are imported by the tests that use them.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_STACK_HOME = REPO / ".agentlog" / "test-stack"
# AGENTLOG_TEST_KAFKA_PORT moves it, e.g. to run a second checkout's suite beside a running one.
TEST_STACK_PORT = int(os.environ.get("AGENTLOG_TEST_KAFKA_PORT", "19192"))
KAFKA_TEST_TIMEOUT_S = 900
_STARTED_BY_TESTS = "started-by-pytest"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Kafka tests wait on consumer groups, compaction and broker restarts: give them room."""
    for item in items:
        if item.get_closest_marker("kafka") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(KAFKA_TEST_TIMEOUT_S))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses the broker says so: ``-m "not kafka"`` must never start or reach one."""
    if "kafka_bootstrap" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("kafka"):
        pytest.fail(f"{item.nodeid} uses the kafka_bootstrap fixture (directly or via `settings`) but is not "
                    "marked kafka: add `pytestmark = pytest.mark.kafka` to its module", pytrace=False)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port[,host:port]`` of a real Kafka broker, shared by every test of the session."""
    external = os.environ.get("AGENTLOG_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return

    from agentlog.infra.kafka import local
    from agentlog.streams.settings import load_settings

    settings = load_settings(home=TEST_STACK_HOME, kafka_bootstrap=f"127.0.0.1:{TEST_STACK_PORT}")
    kafka_dir = local.kafka_home(settings)
    kafka_dir.mkdir(parents=True, exist_ok=True)
    users = open(kafka_dir / "users.lock", "a+")  # noqa: SIM115 - held for the whole session
    # Shared before start(): a session that is stopping the broker holds it exclusively, so we wait
    # for its stop to finish instead of reusing a broker that is about to disappear.
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another session uses (or is stopping) the broker
    else:
        # Nobody else is here: a broker left stopped by an earlier session starts empty, not after
        # loading every partition earlier sessions made (a minute per start once they pile up).
        local.wipe_stopped(settings)
    fcntl.flock(users, fcntl.LOCK_SH)
    try:
        nodes = local.start(settings)
        if any(n.started for n in nodes):
            (kafka_dir / _STARTED_BY_TESTS).touch()
        yield local.bootstrap_servers(nodes)
    finally:
        fcntl.flock(users, fcntl.LOCK_UN)
        if not os.environ.get("AGENTLOG_KEEP_TEST_BROKER") and (kafka_dir / _STARTED_BY_TESTS).exists():
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another session is still using it; the last one out stops it
            else:
                try:
                    local.stop(settings)
                    (kafka_dir / _STARTED_BY_TESTS).unlink(missing_ok=True)
                finally:
                    fcntl.flock(users, fcntl.LOCK_UN)
        users.close()


@pytest.fixture
def topic_prefix() -> str:
    """A prefix no other test (or concurrent session) uses, so topics never collide."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def chdb_url(tmp_path: Path) -> str:
    """An embedded ClickHouse (chdb) directory private to this test."""
    return f"chdb://{tmp_path / 'ch'}"


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, chdb_url: str):
    """Settings for one test: the session broker, a unique topic prefix, a tmp home and chdb."""
    from agentlog.streams.settings import load_settings

    return load_settings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        home=tmp_path,
        clickhouse_url=chdb_url,
        replication_factor=1,
        partitions=2,
    )
