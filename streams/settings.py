"""Configuration in one place: a frozen settings object with environment overrides.

Every tunable reads ``AGENTLOG_<NAME>`` from the environment once, in
:func:`load_settings`. Code takes a ``Settings`` argument instead of reading the
environment itself, so tests can build one with ``Settings(...)`` or
``load_settings(overrides)`` and nothing leaks between them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError


def _default_home() -> Path:
    return Path(os.environ.get("AGENTLOG_HOME", Path.cwd() / ".agentlog")).resolve()


@dataclass(frozen=True)
class Settings:
    """All agentlog settings. Environment variable = ``AGENTLOG_`` + upper-case field name."""

    # Where local state lives: Kafka data/logs/pid files, the chdb directory, the worker's tables.
    home: Path = field(default_factory=_default_home)
    # Kafka
    kafka_bootstrap: str = "127.0.0.1:19092"
    kafka_version: str = "4.1.1"
    kafka_heap: str = "-Xms256m -Xmx1g"
    # Where the Kafka jars are cached (default: ~/.cache/agentlog/kafka-<version>), shared by checkouts
    kafka_cache: str = ""
    # A secured cluster: a librdkafka/kcat client properties file (SASL/SCRAM, TLS CA; streams/security.py)
    # used by every Kafka client we build. Its bootstrap.servers, when present, wins over kafka_bootstrap.
    # Only the path is held here, so printing Settings never prints the password.
    kafka_config: str = ""
    topic_prefix: str = "agentlog"
    partitions: int = 4
    replication_factor: int = 1
    # ClickHouse: chdb:///<dir> (embedded) or http(s)://user:pass@host:port/db (server)
    clickhouse_url: str = ""
    # Event contract
    max_event_bytes: int = 1_048_576
    # Processors
    snapshot_every: int = 100
    # Processor batches: a pile of busy ticks is handled at batch_max records, or batch_within_s after its
    # first tick (batch_tick_s below). Larger windows mean fewer acknowledgement round trips per event
    # (throughput) at the cost of latency.
    batch_max: int = 5000
    batch_within_s: float = 0.2
    handoff_mode: str = "auto"  # auto | check | derive
    worker_id: str = "agentlog-worker"
    web_port: int = 6066
    web_enabled: bool = False
    session_timeout_s: float = 10.0
    rebalance_timeout_s: float = 10.0
    # Rows of a sink batch. The sink's 200k bench, alternated on one broker: 115-133k rows/s at 30,000
    # against 90-115k at 20,000 (fewer statements, parts and ledger rows per row); a trickle still waits
    # sink_flush_s. Also the bound of a batch that carries several partitions of a topic (a trickle's
    # buffers ride along with the first one ready: processors.audit.sink.AuditSink._riders).
    sink_batch_rows: int = 30_000
    # 0.5 s: publish → queryable p99 at 1k ev/s 1.7 s against 2.2 s at 1 s (quiet machine); at most two
    # inserts per second per partition and table at a trickle.
    sink_flush_s: float = 0.5
    # Log batches of this many partitions are stored at once, each on its own ClickHouse connection and
    # staging tables (chdb releases the GIL: two statements use two cores). A partition still has one
    # batch in flight at a time. 1 = one batch at a time.
    sink_lanes: int = 2
    # Replay lanes, run trees and recorded results over HTTP
    # Host-replay verdicts compare index by index (RFC 0041 conformance) instead of per lane.
    replay_strict: bool = False
    # How long a host-replay verdict waits for the replay's child runs to end before it gives up
    # (and says so). The verdict is made after the run-state agent's batch is durable, so the wait
    # delays that agent's next batch by at most this long (per unfinished tree).
    replay_child_wait_s: float = 10.0
    # Finished source runs whose result caches the HTTP results endpoint keeps in memory.
    replay_results_cached_runs: int = 16
    # OpenTelemetry ingest: the worker's OTLP/HTTP receiver on 127.0.0.1:otlp_port
    # (0 = off) and how long the span mapper holds a trace before publishing its runs: settle_ms
    # after its last span once the root span has arrived, grace_ms after its first span at most,
    # or at once when max_held_spans are held. otel_tick_s: how often held traces are re-checked.
    otlp_port: int = 4318
    otlp_ack_timeout_s: float = 10.0
    otlp_max_body_bytes: int = 16 * 1024 * 1024
    otel_settle_ms: int = 1000
    otel_grace_ms: int = 30_000
    otel_max_held_spans: int = 10_000
    otel_tick_s: float = 0.5
    # Exactly-once audit store: drop events older than this many days by TTL (0 = keep forever)
    events_ttl_days: int = 0
    # How agents take batches (processors.worker.batch._adaptive, the one loop): the stream is taken in
    # ticks of batch_tick_s; a tick that had to be waited for and brought fewer than batch_idle_events
    # records means we keep up, so what was taken is handled at once (latency ~ one tick); busier ticks pile up
    # into one batch of up to batch_max records or batch_within_s (under load: fewer table records
    # per event, as per run per batch). Faust keeps collecting the next tick while a batch is handled.
    # batch_idle_events 0: no tick is handled at once, every batch piles up (with batch_quiet_ms 0 too,
    # it closes only at batch_max or batch_within_s).
    batch_tick_s: float = 0.005
    batch_idle_events: int = 16
    # Event ids the OTel run sequencer remembers per run (to never sequence a re-emitted event twice);
    # the oldest are forgotten beyond this many (README "Sending OpenTelemetry traces").
    otel_run_index_max: int = 100_000
    # How long the span mapper remembers a published trace's span ids (to drop re-sent spans); 0 = forever.
    otel_published_ttl_ms: int = 3_600_000
    # Signed checkpoints: the sequencer signs a checkpoint (runId, sequence, headHash, stateHash) every
    # checkpoint_every events of a run (0 = only at terminal events, which are always signed) with the
    # Ed25519 key in signing_key_file (PKCS#8 PEM; default $AGENTLOG_HOME/keys/ed25519.pem, made with
    # mode 0600 on the worker's first start, its public key written beside it as ed25519.pub.pem).
    checkpoint_every: int = 100
    signing_key_file: str = ""
    # The web console (and every HTTP endpoint of the worker) binds web_host. Beyond loopback it needs
    # web_token: every page and API then asks for ``Authorization: Bearer <token>`` (README "Console").
    # The token is never printed: it is left out of repr.
    web_host: str = "127.0.0.1"
    web_token: str = field(default="", repr=False)
    # What `agentlog worker` runs (README "Running the worker"). "process": the Faust agents
    # (sequencer, fold, handoff, OTel) and the log check, no audit store opened; "sink": only the audit
    # sink (and the HTTP endpoints that read the store), no Faust consumer group joined; "all": both.
    # With the embedded chdb store one process owns the directory, so at most one sink/all worker per home.
    worker_role: str = "all"
    # With worker_role "all", run the Faust agents in a child process (`--role process`, its web on
    # web_port + 1, loopback) supervised by this one, which runs the sink and the HTTP endpoints: two cores
    # instead of one thread (processors/worker/halves.py). Off: one process.
    sink_process: bool = False
    # Garbage-collector pauses (processors/worker/gcpause.py). The tables keep every run's state and
    # eventId index in the worker's heap, and Python's generation-2 collection walks all of it
    # (measured: 38 collections of up to 1.3 s, 18 s in all, over 200k events). Every gc_freeze_every_s
    # the worker moves what has survived so far out of the collector's sight (gc.freeze()), and Python's
    # own generation-2 trigger is off; every gc_full_every_s it runs one full collection (reclaims
    # reference cycles frozen meanwhile). 0 = off (Python's own schedule).
    gc_freeze_every_s: float = 1.0
    gc_full_every_s: float = 1800.0
    # Longest the worker's Faust consumer's fetch waits at the broker for data (Faust hard-codes
    # 1500 ms). aiokafka leaves partitions that still hold unconsumed records out of its one fetch in
    # flight, so a fetch naming only idle partitions (spans, otel, handoff-links, changelogs) holds
    # ingest back for the whole wait (measured: 1.5 s delivery stalls, tests/bench/JOURNAL.md;
    # streams.internals.set_fetch_max_wait). 0 keeps Faust's own.
    consumer_fetch_max_wait_ms: int = 100
    # When > 0, a 1 ms heartbeat on the worker's event loop and a watchdog thread that logs every
    # stall longer than this many ms with the stacks the loop was in (processors/worker/lagprobe.py).
    loop_lag_log_ms: float = 0.0
    # A pile of adaptive ticks is handled once no tick came for batch_quiet_ms (a burst ended), not only
    # when batch_within_s closes (0 = only then). A batch yields to the event loop after each
    # batch_slice_ms of handling, so Faust keeps taking records out of aiokafka's buffer (0 = never).
    batch_quiet_ms: float = 20.0
    batch_slice_ms: float = 20.0
    # Every stall_check_s the worker compares each partition an agent reads with the broker's high
    # watermark: one that holds records beyond the agent's position, and made no progress over a whole
    # interval, is read again from that position (Faust was seen to drop fetched records without
    # delivering them; processors.worker.batch.heal_stalled). 0 = off.
    stall_check_s: float = 5.0
    # At a rebalance each agent's batch in progress gets up to revoke_wait_s (at most half of
    # rebalance_timeout_s) to make its tables durable before the member rejoins; one still going after that,
    # or holding records of a partition that moved, writes no table (processors.worker.fence). 0 = never wait.
    revoke_wait_s: float = 5.0

    # The worker's tables (RocksDB, one database per table partition) and the changelog offsets they hold;
    # default $AGENTLOG_HOME/state. Each worker on a machine needs its own (a second one is refused at start).
    state_dir: str = ""
    # Memory the tables' RocksDB databases may use in all, in MiB: block cache and write buffers, shared.
    state_cache_mb: int = 64
    # Run lifetimes (README "Run lifetimes and the worker's state"): a run is closed run_grace_s after its
    # terminal event, or after run_idle_s without an event; its table entries are then deleted. A marker
    # that it was closed is kept run_closed_retention_s, during which a late event of it is refused
    # (run_closed / run_expired).
    run_grace_s: float = 300.0
    run_idle_s: float = 7 * 86400.0
    run_closed_retention_s: float = 7 * 86400.0

    @property
    def state_path(self) -> Path:
        """The worker's state directory: ``state_dir`` or ``$AGENTLOG_HOME/state``."""
        return Path(self.state_dir).expanduser() if self.state_dir else self.home / "state"

    @property
    def chdb_dir(self) -> Path:
        return self.home / "clickhouse"

    @property
    def store_url(self) -> str:
        return self.clickhouse_url or f"chdb://{self.chdb_dir}"

    @property
    def signing_key_path(self) -> Path:
        """The worker's checkpoint signing key: ``signing_key_file`` or the home's default."""
        return Path(self.signing_key_file).expanduser() if self.signing_key_file else (
            self.home / "keys" / "ed25519.pem")

    def replace(self, **changes: Any) -> Settings:
        # Any: each value's type is that of the field it names, which one annotation cannot say.
        return dataclasses.replace(self, **changes)


_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


def web_is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    return host in _LOOPBACK_HOSTS or host.startswith("127.")


def check_web_access(settings: Settings) -> None:
    """Refuse to serve HTTP beyond loopback without a token.

    Raises:
        ConfigError: ``web_token_required`` when ``web_host`` is not loopback and ``web_token`` is empty.
    """
    if not web_is_loopback(settings.web_host) and not settings.web_token:
        raise ConfigError(
            f"AGENTLOG_WEB_HOST={settings.web_host} serves the console and the query API beyond this machine; "
            "set AGENTLOG_WEB_TOKEN to a secret (every request must then send 'Authorization: Bearer <token>'), "
            "or bind to 127.0.0.1",
            code="web_token_required",
        )


def _coerce(name: str, raw: str, typ: object) -> object:
    try:
        if typ in (int, "int"):
            return int(raw)
        if typ in (float, "float"):
            return float(raw)
        if typ in (bool, "bool"):
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError(raw)
        if typ in (Path, "Path"):
            return Path(raw).expanduser().resolve()
    except ValueError as e:
        raise ConfigError(f"AGENTLOG_{name.upper()}={raw!r} is not a valid {typ}; fix or unset it") from e
    return raw


def load_settings(**overrides: object) -> Settings:
    """Settings from defaults, then ``AGENTLOG_*`` environment variables, then ``overrides``."""
    # Any: each value has the type of the field it names (_coerce picks it at run time).
    values: dict[str, Any] = {}
    for f in fields(Settings):
        raw = os.environ.get(f"AGENTLOG_{f.name.upper()}")
        if raw is not None:
            values[f.name] = _coerce(f.name, raw, f.type)
    values.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(values.get("home"), str):
        values["home"] = Path(values["home"]).expanduser().resolve()
    settings = Settings(**values)
    if settings.kafka_config:  # a secured cluster: its properties file names the brokers
        from streams.security import bootstrap

        settings = settings.replace(kafka_bootstrap=bootstrap(settings))
    return settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``AGENTLOG_*`` environment that reproduces ``settings`` in a child process."""
    env: dict[str, str] = {}
    for f in fields(Settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool):
            value = "true" if value else "false"
        env[f"AGENTLOG_{f.name.upper()}"] = str(value)
    return env
