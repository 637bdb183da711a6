"""The worker process: its agents, tasks and timers wired together, hosted by a Faust app.

Which agent does what:

==============  ====================  ==========================================  ===============
agent           reads                 writes                                      table
==============  ====================  ==========================================  ===============
sequencer       ingest                log (with stateHash), rejections,           index, runs,
                                      transitions, violations, snapshots,         closed
                                      handoff-links, verdicts, checkpoints
log-check       log (plain consumer)  violations (hash_chain_broken)              —
handoff         handoff-links         transitions (derive mode)                   links
audit sink      every output topic    ClickHouse (:mod:`agentlog.audit`)         (none: a plain
                                                                                  consumer task, its
                                                                                  state in ClickHouse)
otel-spans      spans                 otel-events, rejections                     otel-held
otel-sequencer  otel-events           ingest, rejections                          otel-seq
==============  ====================  ==========================================  ===============

Every agent in the table but the log check and the sink runs on its own loop of Kafka transactions
(:mod:`agentlog.worker.txruntime`): a batch's outputs, its table changelog records and its next input offset are
committed together, and readers read committed only. The Faust app hosts the process: it runs the agents' loops,
the sink and the other tasks and timers, and its producer sends what is outside any agent's transaction (OTLP
spans, close requests, ticks). It consumes nothing itself (``producer_only``), so it joins no consumer group; the
agents' groups are ``<prefix>-worker-<agent>``. The adapters here (:class:`FaustRunner`, :class:`FaustProducer`)
implement the ports of :mod:`agentlog.worker.ports` on it; :mod:`agentlog.worker.memory` implements them for the
unit tests.

Roles (``agentlog worker --role``): ``process`` runs every row above but the audit sink and opens no store; ``sink``
runs only the audit sink (and the HTTP endpoints, which read the store); ``all`` runs both. With the embedded chdb
store one process owns the directory (:func:`agentlog.audit.store.open_store` takes an exclusive lock), so a second
``sink``/``all`` worker on one home stops at start with ``store_locked``; with a ClickHouse server any number of
sinks share the ``<prefix>.audit-sink`` group's partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import faust
from faust.worker import Worker

from agentlog.audit import sink as audit_sink
from agentlog.core.redaction import Redactor
from agentlog.metrics import METRICS
from agentlog.schemas.errors import ConfigError
from agentlog.streams.admin import ensure_topics_patiently
from agentlog.streams.erasure import shred_keys
from agentlog.streams.keyring import Keyring, RocksKeyStore, follow_keyring
from agentlog.streams.redaction import load_policy, load_redactor
from agentlog.streams.security import bootstrap, load_security
from agentlog.streams.settings import Settings, check_web_access
from agentlog.streams.topics import TopicSpec, catalogue, durability_config, topic_name
from agentlog.worker import gcpause, halves, handoff, logs, runstate, sequencer, txruntime
from agentlog.worker import spans as otel_spans
from agentlog.worker import web as web_endpoints
from agentlog.worker.owned import Owned
from agentlog.worker.ports import NamedTopic, TaskFn, Topic
from agentlog.worker.tables import RocksBudget, lock_state_dir
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.worker")

#: ``agentlog worker --role`` values; see the module docstring.
ROLES = ("all", "process", "sink")


def worker_role(settings: Settings) -> str:
    """The role to run: ``settings.worker_role``.

    Raises:
        ConfigError: ``bad_worker_role`` for a role not in :data:`ROLES`.
    """
    role = settings.worker_role
    if role not in ROLES:
        raise ConfigError(f"AGENTLOG_WORKER_ROLE / --role {role!r} is not one of {', '.join(ROLES)}",
                          code="bad_worker_role")
    return role


def faust_broker_kwargs(settings: Settings) -> dict[str, Any]:
    """``broker=`` (and, when configured, ``broker_credentials=``) for ``faust.App``: the same properties file as
    every other client's.

    Faust builds its own aiokafka producer, consumers and admin client and passes them the credentials
    given as ``broker_credentials`` (``faust.SASLCredentials`` with an SSL context for SASL_SSL, a bare
    ``ssl.SSLContext`` for SSL), so this covers all of them.

    Any: the values are what those keyword arguments take (URL list, Faust credentials object).
    """
    urls = [f"kafka://{host.strip()}" for host in bootstrap(settings).split(",") if host.strip()]
    kwargs: dict[str, Any] = {"broker": urls}
    security = load_security(settings)
    if security is None or security.security_protocol == "PLAINTEXT":
        return kwargs
    if security.uses_sasl:
        assert security.sasl_password is not None  # parse_properties guarantees it
        kwargs["broker_credentials"] = faust.SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password.get_secret_value(),
            mechanism=security.sasl_mechanism,
            # None = SASL_PLAINTEXT: Faust picks the protocol from whether a context is given.
            ssl_context=security.ssl_context() if security.uses_tls else None,
        )
    else:
        kwargs["broker_credentials"] = security.ssl_context()
    return kwargs


class FaustRunner:
    """The ``Runner`` port on a Faust app: its tasks and timers."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    def task(self, fn: TaskFn) -> None:
        self.app.task(fn)

    def timer(self, interval: float, fn: TaskFn) -> None:
        self.app.timer(interval)(fn)


class FaustProducer:
    """The ``Producer`` port on the Faust app's producer."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None) -> Awaitable[Any]:
        sent: Awaitable[Any] = await self._app.producer.send(topic, key, value, partition, None, None)
        return sent


def build_app(settings: Settings, *, replay: bool = True, web: bool = False, web_loopback: bool = False) -> Wiring:
    """Create the worker for ``settings.worker_role`` (the ``process`` role leaves ClickHouse out).

    ``web``: serve the console, the query API and ``/metrics`` on ``settings.web_port``.
    ``web_loopback``: on loopback whatever ``settings.web_host`` says (a process half's web server, which
    only its parent reads; its OTLP receivers still listen on ``web_host``).
    """
    role = worker_role(settings)
    if web or (role != "sink" and settings.otlp_port):
        check_web_access(settings)  # never serve beyond loopback without a token (the OTLP receivers too)
    # A bad policy stops the worker here, before anything runs: never a half-read one.
    # A sink redacts nothing: it reads the policy only to refuse a bad one, and needs no salt.
    redactor = load_redactor(settings, create_salt=True) if role != "sink" else Redactor()
    if role == "sink":
        load_policy(settings)
    settings.state_path.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        f"{settings.topic_prefix}-worker",
        **faust_broker_kwargs(settings),  # SASL/TLS from AGENTLOG_KAFKA_CONFIG
        autodiscover=False,
        # Faust's own directory (it keeps no table here): under the worker's state, not the working directory.
        datadir=str(settings.state_path / f"{settings.topic_prefix}-worker"),
        producer_acks=-1,
        producer_max_batch_size=1 << 20,
        producer_linger=0.005,
        web_enabled=False,  # the worker's own server serves HTTP (agentlog.worker.web)
    )
    # Faust's own switch for "no consumer, no agents, no tables": its tasks, timers and producer only. Every
    # agent reads with its own consumer (:mod:`agentlog.worker.txruntime`), the sink too.
    app.producer_only = True
    topics: dict[str, Topic] = {
        short: NamedTopic(topic_name(settings, short))
        for short in (
            "ingest", "log", "transitions", "violations", "rejections",
            "snapshots", "verdicts", "handoff-links", "checkpoints", "keyring",
        )
    }
    wiring = Wiring(settings=settings, runner=FaustRunner(app), producer=FaustProducer(app), topics=topics,
                    tables={}, app=app)
    budget = RocksBudget(settings.state_cache_mb)
    METRICS.add_collector(budget.series)
    # The keyring in a database of the state directory, within the tables' memory budget: it holds every run.
    wiring.keyring = Keyring.from_settings(settings, store=RocksKeyStore(
        txruntime.state_root(settings), opener=lambda path: budget.open(path, None)))
    wiring.redactor = redactor
    _install_keyring(wiring)

    if role != "sink":
        _install_sequencer(wiring, budget, replay=replay)
        runstate.install_log_check(wiring)
        agents = txruntime.TxAgents(wiring, budget.open)
        handoff.install(agents)
        # OpenTelemetry ingest: OTLP/HTTP receiver + span mapper (spans → ingest).
        otel_spans.install(wiring, agents)
    if role != "process":
        keyring, ready = wiring.keyring, wiring.keyring_ready
        wiring.store = audit_sink.install(settings, wiring.runner.task,
                                          shred=lambda runs: shred_keys(settings, keyring, ready, runs))

    @app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
    async def quiet_client_loggers() -> None:
        # A profile of the worker showed ~10 DEBUG log records built per event by the Kafka client
        # stack (about 10% of CPU) although nothing prints them; cap those loggers at INFO.
        level = max(logging.getLogger().getEffectiveLevel(), logging.INFO)
        for name in ("aiokafka", "faust", "mode"):
            logging.getLogger(name).setLevel(level)

    gcpause.install(wiring.runner)  # no generation-2 pauses over the tables' heap
    if web:  # on AGENTLOG_WEB_HOST: loopback unless a token is set (check_web_access)
        web_endpoints.install(wiring, "127.0.0.1" if web_loopback else settings.web_host)
    return wiring


def _install_sequencer(wiring: Wiring, budget: RocksBudget, *, replay: bool) -> None:
    """The sequencer on its own loop of Kafka transactions (:mod:`agentlog.worker.txruntime`).

    Its tables join ``wiring.tables`` (the lifetimes sweep reads ``runs``).
    """
    owned = Owned()  # the ingest partitions the runtime holds (the lifetimes sweep asks closes for those)
    agent = sequencer.build(wiring, owned, replay=replay)
    tables = txruntime.sequencer_tables(wiring.settings, budget.open)
    wiring.tables.update(tables)
    txruntime.install(wiring, agent, tables, owned, short="ingest", name="sequencer",
                      fetch_wait_ms=txruntime.SEQUENCER_FETCH_WAIT_MS)


def _install_keyring(wiring: Wiring) -> None:
    """Follow the keyring topic: the sequencer waits for what it held at start, then sees every key and erasure."""
    keyring = wiring.keyring
    assert keyring is not None

    async def keyring_follower() -> None:
        await follow_keyring(keyring, wiring.settings, wiring.keyring_ready)

    wiring.runner.task(keyring_follower)


#: How soon a table changelog's records can be compacted away: Kafka compacts only closed segments, and
#: by default a segment stays open for 7 days, so every closed run's keys and tombstones would stay that
#: long for a worker on a new disk to read. An hour's segments bound that to the runs in flight plus about
#: an hour (and tombstones for a day, ``delete.retention.ms``'s default).
CHANGELOG_SEGMENT_MS = 3_600_000


def internal_topic_specs(wiring: Wiring) -> list[TopicSpec]:
    """The agents' table changelogs as :class:`TopicSpec` s, created before the worker starts with every topic."""
    settings = wiring.settings
    rf = settings.replication_factor
    durable = durability_config(rf)
    # A closed run's marker is kept run_closed_retention_s (the changelog deletes older records, the local
    # database drops them by TTL); every other table deletes its keys with tombstones and is compacted.
    expiring = {"closed": {"cleanup.policy": "compact,delete",
                           "retention.ms": str(int(settings.run_closed_retention_s * 1000))}}
    specs = [
        TopicSpec(table.changelog, settings.partitions,
                  {"cleanup.policy": "compact", "segment.ms": str(CHANGELOG_SEGMENT_MS), **durable,
                   **expiring.get(name, {})}, rf)
        for name, table in wiring.tables.items()
    ]
    return specs


def run_worker(settings: Settings, *, web: bool = True, loglevel: str = "warning", wait_s: float = 300.0) -> None:
    """Run the worker in the foreground until SIGINT/SIGTERM (``agentlog worker``).

    Every topic it reads or writes is created first, waiting up to ``wait_s`` for an
    unreachable broker or for enough brokers to honour the replication factor. With
    ``settings.sink_process`` an ``all`` worker is this process (the ``sink`` role) and a supervised
    child (the ``process`` role): :mod:`agentlog.worker.halves`. It logs to stderr in
    ``settings.log_format`` (:mod:`agentlog.worker.logs`) from its first line on.
    """
    logs.setup_logging(settings.log_format, loglevel)
    # A process half started by a parent below stops when that parent ends; its web server is the parent's alone.
    is_half = halves.watch_parent()
    half = None
    if settings.sink_process and worker_role(settings) == "all":
        settings = settings.replace(worker_role="sink")
        half = halves.ProcessHalf(settings, web=web, loglevel=loglevel, wait_s=wait_s)
    if worker_role(settings) != "sink":
        lock_state_dir(settings.state_path)  # held until the process exits
    wiring = build_app(settings, web=web, web_loopback=is_half)
    loop = asyncio.new_event_loop()  # not Faust's: its loop is made (and owned) by the Worker below
    try:
        loop.run_until_complete(
            ensure_topics_patiently(settings, catalogue(settings) + internal_topic_specs(wiring), wait_s=wait_s))
    finally:
        loop.close()
    worker = Worker(wiring.app, loglevel=loglevel, quiet=True, redirect_stdouts=False,
                    logging_config=logs.logging_config(settings.log_format, loglevel))
    # Faust's start-up spinner writes cursor escapes to stdout even when stdout is a file, quiet or not:
    # the worker's output is its log alone.
    worker.spinner = None
    if half is not None:
        half.start()
    try:
        worker.execute_from_commandline()
    finally:
        if half is not None:
            half.stop()
