"""The worker's Faust application: topics, tables and agents wired together.

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

The sequencer and the two OTel agents run each on its own loop of Kafka transactions
(:mod:`agentlog.worker.txruntime`; ``AGENTLOG_AGENT_RUNTIME=faust`` runs them as Faust agents); the handoff agent
runs the batch loop of :mod:`agentlog.worker.batch` (outputs acknowledged before table writes, positions committed
only once both are durable).

This is the one module that imports Faust. The runtime and the agents see Faust only through the
ports of :mod:`agentlog.worker.ports`, which the adapters here implement on the app
(:class:`FaustRunner`, :class:`FaustProducer`, :class:`FaustSource`, :class:`FaustMembership`; the
private attributes under them are in :mod:`agentlog.streams.internals`); :mod:`agentlog.worker.memory`
implements the same ports for the unit tests.

Roles (``agentlog worker --role``): ``process`` runs every row above but the audit
sink and opens no store; ``sink`` runs only the audit sink (and the HTTP endpoints, which read
the store); ``all`` runs both. A ``sink`` worker is a Faust app in producer-only mode: Faust
still serves the web endpoints and runs the sink's task, but it subscribes to nothing and so
never joins the ``<prefix>-worker`` group, whose members would otherwise rebalance every time a
sink starts or dies. With the embedded chdb store one process owns the directory
(:func:`agentlog.audit.store.open_store` takes an exclusive lock), so a second ``sink``/``all``
worker on one home stops at start with ``store_locked``; with a ClickHouse server any number of
sinks share the ``<prefix>.audit-sink`` group's partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection
from typing import Any

import faust
from faust.worker import Worker

from agentlog.audit import sink as audit_sink
from agentlog.core.redaction import Redactor
from agentlog.metrics import METRICS
from agentlog.schemas.errors import ConfigError
from agentlog.streams import internals
from agentlog.streams.admin import ensure_topics_patiently
from agentlog.streams.erasure import shred_keys
from agentlog.streams.keyring import Keyring, follow_keyring
from agentlog.streams.redaction import load_policy, load_redactor
from agentlog.streams.security import bootstrap, load_security
from agentlog.streams.settings import REBALANCE_TIMEOUT_S, Settings, check_web_access
from agentlog.streams.topics import TopicSpec, catalogue, durability_config, topic_name
from agentlog.worker import batch, fence, gcpause, halves, handoff, logs, positions, runstate, sequencer, txruntime
from agentlog.worker import spans as otel_spans
from agentlog.worker import web as web_endpoints
from agentlog.worker.ports import AgentFn, BatchProducer, Partition, TaskFn, Topic
from agentlog.worker.tables import LocalTable, RocksBudget, Table, lock_state_dir, open_table, sequencer_tables
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.worker")

#: Longest the Faust consumer's fetch waits at the broker for data (Faust hard-codes 1,500 ms). aiokafka
#: leaves partitions that still hold unconsumed records out of its one fetch in flight, so a fetch naming
#: only idle partitions (spans, otel, handoff-links, changelogs) holds ingest back for the whole wait
#: (measured: 1.5 s delivery stalls, tests/bench/JOURNAL.md). At 100 ms such a fetch costs ingest at most that.
FETCH_MAX_WAIT_MS = 100

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


#: ``AGENTLOG_AGENT_RUNTIME`` values (:func:`agent_runtime`).
AGENT_RUNTIMES = ("transactions", "faust")


def agent_runtime(settings: Settings) -> str:
    """How the worker runs its agents of ingest, spans and otel-events: ``settings.agent_runtime``.

    Raises:
        ConfigError: ``bad_agent_runtime`` for a value not in :data:`AGENT_RUNTIMES`.
    """
    runtime = settings.agent_runtime
    if runtime not in AGENT_RUNTIMES:
        raise ConfigError(f"AGENTLOG_AGENT_RUNTIME {runtime!r} is not one of {', '.join(AGENT_RUNTIMES)}",
                          code="bad_agent_runtime")
    return runtime


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
    """The ``Runner`` port on a Faust app: its topics (raw bytes), agents, tasks and timers."""

    def __init__(self, app: faust.App, partitions: int) -> None:
        self.app = app
        self._partitions = partitions

    def topic(self, name: str) -> Topic:
        topic: Topic = self.app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                                      value_serializer="raw", partitions=self._partitions)
        return topic

    def agent(self, topic: Topic, name: str, fn: AgentFn) -> None:
        faust_topic: Any = topic  # a faust Topic: made by :meth:`topic`
        self.app.agent(faust_topic, name=name, concurrency=1)(fn)  # type: ignore[arg-type]  # a Stream port

    def task(self, fn: TaskFn) -> None:
        self.app.task(fn)

    def timer(self, interval: float, fn: TaskFn) -> None:
        self.app.timer(interval)(fn)


class FaustProducer:
    """The ``Producer`` port on the Faust app's producer (and the aiokafka producer under it, for batches)."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None) -> Awaitable[Any]:
        sent: Awaitable[Any] = await self._app.producer.send(topic, key, value, partition, None, None)
        return sent

    def batches(self) -> BatchProducer:
        producer: BatchProducer = internals.kafka_producer(self._app.producer)
        return producer


class FaustSource:
    """The ``Source`` port on the Faust app's consumer (its private offsets: :mod:`agentlog.streams.internals`)."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    def assignment(self) -> Collection[Partition]:
        assigned: Collection[Partition] = self._app.consumer.assignment()
        return assigned

    def highwater(self, tp: Partition) -> int | None:
        consumer: Any = self._app.consumer  # tp: a faust TP (what its assignment holds)
        high: int | None = consumer.highwater(tp)
        return high

    def committed(self, tp: Partition) -> int | None:
        return internals.committed_offset(self._app.consumer, tp)

    def read_offset(self, tp: Partition) -> int | None:
        return internals.read_offset(self._app.consumer, tp)

    def fetch_position(self, tp: Partition) -> int | None:
        return internals.fetch_position(self._app.consumer, tp)

    def forget_acks(self, tp: Partition) -> None:
        internals.forget_acks(self._app.consumer, tp)

    async def seek(self, tp: Partition, offset: int) -> None:
        consumer: Any = self._app.consumer
        await consumer.seek(tp, offset)


class FaustMembership:
    """The ``Membership`` port on the Faust app: its rebalancing and recovery flags, its consumer's generation."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    def settling(self) -> bool:
        """Whether the group is rebalancing or the app's tables are recovering (Faust's own flags).

        Then no batch starts, no stall is healed and no offset is committed: positions and records from
        before the rebalance may be of partitions this worker no longer holds.
        """
        app = self._app
        return bool(app.rebalancing or getattr(app, "in_recovery", False))

    @property
    def generation(self) -> int:
        generation: int = self._app.consumer_generation_id
        return generation


def build_app(settings: Settings, *, replay: bool = True, web: bool = False, web_loopback: bool = False) -> Wiring:
    """Create the worker's Faust app for ``settings.worker_role`` (the ``process`` role leaves ClickHouse out).

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
        store="rocksdb://",
        processing_guarantee="at_least_once",
        autodiscover=False,
        # One directory per app: a table database holds the changelog offset it reflects, so it must never
        # be read by the app of another topic prefix.
        datadir=str(settings.state_path / f"{settings.topic_prefix}-worker"),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=0,
        broker_session_timeout=settings.session_timeout_s,
        broker_rebalance_timeout=REBALANCE_TIMEOUT_S,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # Faust's default 16 KiB producer batch makes a 300-event batch of outputs a dozen
        # sequential produce requests per partition; 1 MiB batches with a 5 ms linger send it in one.
        producer_max_batch_size=1 << 20,
        producer_linger=0.005,
        web_enabled=False,  # the worker's own server serves HTTP (agentlog.worker.web)
        stream_wait_empty=False,
        # Every topic, Faust's own included (internal_topic_specs), is created by run_worker before
        # Faust starts. Declaring them again makes Faust force an all-topics metadata refresh per
        # topic, at start and at every rebalance (14 per start; each a response listing every topic
        # on the broker).
        topic_allow_declare=False,
        # Table keys/values as JSON: str keys come back as str after changelog recovery
        # (the topics below set raw bytes explicitly).
        key_serializer="json",
        value_serializer="json",
    )
    transactions = role != "sink" and agent_runtime(settings) == "transactions"
    if role == "sink" or transactions:
        # Faust's own switch for "no consumer, no agents, no tables": its tasks, timers and producer only. A sink
        # reads with its own consumer; on transactions every agent does.
        app.producer_only = True
    runner = FaustRunner(app, settings.partitions)
    topics = {
        short: runner.topic(topic_name(settings, short))
        for short in (
            "ingest", "log", "transitions", "violations", "rejections",
            "snapshots", "verdicts", "handoff-links", "checkpoints", "keyring",
        )
    }

    budget = RocksBudget(settings.state_cache_mb)
    METRICS.add_collector(budget.series)

    def table(name: str) -> LocalTable:
        return open_table(app, name, settings.partitions, budget)

    # On transactions every agent's tables are its runtime's own (below); as Faust agents, the app's.
    tables: dict[str, Table] = {}
    if role != "sink" and not transactions:
        tables = dict(sequencer_tables(app, settings.partitions, budget, settings.run_closed_retention_s))
    durable = positions.DurablePositions()
    source, membership = FaustSource(app), FaustMembership(app)
    positions.install(app, durable, source, membership)
    internals.set_fetch_max_wait(app, FETCH_MAX_WAIT_MS)  # no 1.5 s long-poll holding ingest back
    internals.deliver_in_line(app)  # no four tasks per record between the consumer and the streams
    METRICS.add_collector(durable.series)
    backfill = positions.BrokerBackfill(settings)
    wiring = Wiring(settings=settings, runner=runner, producer=FaustProducer(app), source=source,
                    membership=membership, backfill=backfill, topics=dict(topics), tables=dict(tables),
                    positions=durable, fence=fence.Fence(fence.wait_bound(fence.REVOKE_WAIT_S, REBALANCE_TIMEOUT_S)),
                    app=app)
    fence.install(app, wiring.fence)
    wiring.make_table = table
    wiring.keyring = Keyring.from_settings(settings)
    wiring.redactor = redactor
    _install_keyring(wiring)

    # One pass over ingest: sequencing and the fold in one agent; the log is only re-read
    # by the plain-consumer chain check, never by a Faust stream.
    if role != "sink":
        _install_partition_starts(wiring, backfill)
        if transactions:
            _install_sequencer(wiring, budget, replay=replay)
        else:
            sequencer.install(wiring, replay=replay)
        batch.install_stall_heal(wiring)
        runstate.install_log_check(wiring)
    if role != "process":
        keyring, ready = wiring.keyring, wiring.keyring_ready
        wiring.store = audit_sink.install(settings, runner.task,
                                          shred=lambda runs: shred_keys(settings, keyring, ready, runs))
    if role != "sink":
        # OpenTelemetry ingest: OTLP/HTTP receiver + span mapper (spans → ingest).
        agents = txruntime.TxAgents(wiring, budget.open) if transactions else batch.FaustAgents(wiring)
        handoff.install(wiring, agents)
        otel_spans.install(wiring, agents)

    @app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
    async def quiet_client_loggers() -> None:
        # A profile of the worker showed ~10 DEBUG log records built per event by the Kafka client
        # stack (about 10% of CPU) although nothing prints them; cap those loggers at INFO.
        level = max(logging.getLogger().getEffectiveLevel(), logging.INFO)
        for name in ("aiokafka", "faust", "mode"):
            logging.getLogger(name).setLevel(level)

    gcpause.install(runner)  # no generation-2 pauses over the tables' heap
    if web:  # on AGENTLOG_WEB_HOST: loopback unless a token is set (check_web_access)
        web_endpoints.install(wiring, "127.0.0.1" if web_loopback else settings.web_host)
    return wiring


def _install_sequencer(wiring: Wiring, budget: RocksBudget, *, replay: bool) -> None:
    """The sequencer on its own loop of Kafka transactions (:mod:`agentlog.worker.txruntime`), beside the app.

    Its tables join ``wiring.tables`` (the lifetimes sweep reads ``runs``; their changelogs are created with the
    app's).
    """
    owned = fence.Fence()  # the ingest partitions the runtime holds (the lifetimes sweep asks closes for those)
    agent = sequencer.build(wiring, replay=replay, fence=owned)
    tables = txruntime.sequencer_tables(wiring.settings, budget.open)
    wiring.tables.update(tables)
    txruntime.install(wiring, agent, tables, owned, short="ingest", name="sequencer")


def _install_keyring(wiring: Wiring) -> None:
    """Follow the keyring topic: the sequencer waits for what it held at start, then sees every key and erasure."""
    keyring = wiring.keyring
    assert keyring is not None

    async def keyring_follower() -> None:
        await follow_keyring(keyring, wiring.settings, wiring.keyring_ready)

    wiring.runner.task(keyring_follower)


def _install_partition_starts(wiring: Wiring, backfill: positions.BrokerBackfill) -> None:
    """One long-lived look-up consumer for where partitions start, started with the app.

    Started before the first batch needs it, so its bootstrap (an all-topics metadata request, as
    every aiokafka client's is) is paid at start-up, not inside a partition's first batch.
    """
    starts = backfill.starts = positions.PartitionStarts(wiring.settings)

    async def partition_starts() -> None:
        try:
            try:
                await starts.start([wiring.topics["ingest"].get_topic_name()])
            except Exception as e:  # not fatal: the first look-up starts it again (and raises if it must)
                log.warning("the partition-start look-up consumer did not start (%s); starting it on first use", e)
            await asyncio.Event().wait()  # until the app stops (its tasks are cancelled)
        finally:
            await starts.stop()

    wiring.runner.task(partition_starts)


#: How soon a table changelog's records can be compacted away: Kafka compacts only closed segments, and
#: by default a segment stays open for 7 days, so every closed run's keys and tombstones would stay that
#: long for a worker on a new disk to read. An hour's segments bound that to the runs in flight plus about
#: an hour (and tombstones for a day, ``delete.retention.ms``'s default).
CHANGELOG_SEGMENT_MS = 3_600_000


def internal_topic_specs(wiring: Wiring) -> list[TopicSpec]:
    """Faust's own topics (table changelogs, the assignor's leader topic) as :class:`TopicSpec` s.

    Created by us before Faust starts, so a missing one is waited for like ours instead of
    crashing Faust's start-up (it declares them itself, and finds them there).
    """
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
    specs.append(TopicSpec(f"{wiring.app.conf.id}-__assignor-__leader", 1, dict(durable), rf))
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
