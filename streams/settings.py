"""Configuration in one place: a frozen settings object with environment overrides.

Every setting reads ``AGENTLOG_<NAME>`` from the environment once, in :func:`load_settings`.
Settings are what an operator chooses for a deployment; tuning values are named constants beside
the code that uses them, each saying why it has that value. Code takes a ``Settings`` argument
instead of reading the environment itself, so tests can build one with ``Settings(...)`` or
``load_settings(overrides)`` and nothing leaks between them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agentlog.schemas.errors import ConfigError


def _default_home() -> Path:
    return Path(os.environ.get("AGENTLOG_HOME", Path.cwd() / ".agentlog")).resolve()


@dataclass(frozen=True)
class Settings:
    """All agentlog settings. Environment variable = ``AGENTLOG_`` + upper-case field name."""

    # Where local state lives: Kafka data/logs/pid files, the chdb directory, the worker's tables.
    home: Path = field(default_factory=_default_home)
    # Kafka
    kafka_bootstrap: str = "127.0.0.1:19092"
    # A secured cluster: a librdkafka/kcat client properties file (SASL/SCRAM, TLS CA; streams/security.py)
    # used by every Kafka client we build. Its bootstrap.servers, when present, wins over kafka_bootstrap.
    # Only the path is held here, so printing Settings never prints the password.
    kafka_config: str = ""
    topic_prefix: str = "agentlog"
    partitions: int = 4
    replication_factor: int = 1
    # How long a silent worker keeps its partitions: a dead one's move after this long, and a process
    # paused longer than this (a stop-the-world pause, an overloaded host) is dropped from its group.
    session_timeout_s: float = 10.0
    # ClickHouse: chdb:///<dir> (embedded) or http(s)://user:pass@host:port/db (server)
    clickhouse_url: str = ""
    # How long runs stay in the audit store, per run class (agentlog.audit.retention): "ci=2h,dev=7d,*=90d";
    # empty keeps every run forever.
    retention: str = ""
    # Event contract: a larger event is refused as oversize (and sizes the producers' requests).
    max_event_bytes: int = 1_048_576
    handoff_mode: str = "auto"  # auto | check | derive
    # What `agentlog worker` runs (README "Running the worker"). "process": the agents (sequencer, fold,
    # handoff, OTel) and the log check, no audit store opened; "sink": only the audit sink (and the HTTP
    # endpoints that read the store), no consumer group of the agents joined; "all": both.
    # With the embedded chdb store one process owns the directory, so at most one sink/all worker per home.
    worker_role: str = "all"
    # With worker_role "all", run the agents in a child process (`--role process`, its web on
    # web_port + 1, loopback) supervised by this one, which runs the sink and the HTTP endpoints: two cores
    # instead of one thread (processors/worker/halves.py). Off: one process.
    sink_process: bool = False
    # The worker's log on stderr: "text" (coloured only on a terminal) or "json" (one object per line).
    log_format: str = "text"
    # The worker's name in metrics, /health and the audit rows it writes.
    worker_id: str = "agentlog-worker"
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
    # Signed checkpoints: the sequencer signs a checkpoint (runId, sequence, headHash, stateHash) every
    # checkpoint_every events of a run (0 = only at terminal events, which are always signed) with the
    # Ed25519 key in signing_key_file (PKCS#8 PEM; default $AGENTLOG_HOME/keys/ed25519.pem, made with
    # mode 0600 on the worker's first start, its public key written beside it as ed25519.pub.pem).
    checkpoint_every: int = 100
    signing_key_file: str = ""
    # Content is sealed under per-run data keys wrapped by a key-encryption key (README "Personal data"): base64 of
    # 32 random bytes in kek (never printed), or in the files of kek_file (comma-separated, the current one first;
    # default $AGENTLOG_HOME/keys/kek, made with mode 0600 on first use).
    kek: str = field(default="", repr=False)
    kek_file: str = ""
    # Redaction (README "Personal data"): the sequencer redacts content before hashing and sealing. Without a policy
    # file every built-in detector masks every content member; redaction_policy names a TOML policy that relaxes or
    # extends that (its [topics."<topic_prefix>"] section applied). A policy that hashes needs a salt: redaction_salt
    # (never printed) or the file redaction_salt_file (default $AGENTLOG_HOME/keys/redaction-salt, made with mode 0600
    # on first use).
    redaction_policy: str = ""
    redaction_salt: str = field(default="", repr=False)
    redaction_salt_file: str = ""
    # The web console (and every HTTP endpoint of the worker) listens on web_host:web_port, the OTLP receivers
    # on web_host too. Beyond loopback they need web_token: every page, API and OTLP export then asks for
    # ``Authorization: Bearer <token>`` (README "Security"). The token is never printed: it is left out of repr.
    web_port: int = 6066
    web_host: str = "127.0.0.1"
    web_token: str = field(default="", repr=False)
    # OpenTelemetry ingest: the worker's OTLP/HTTP receiver on web_host:otlp_port, OTLP/gRPC on otlp_port - 1
    # (4318 and 4317, the OTLP defaults; 0 = both off).
    otlp_port: int = 4318

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


#: How long the audit sink's group coordinator waits for its members to rejoin at a rebalance. 10 s: a member
#: rejoins within a second unless it is stuck.
REBALANCE_TIMEOUT_S = 10.0

_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


def web_is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    return host in _LOOPBACK_HOSTS or host.startswith("127.")


def check_web_access(settings: Settings) -> None:
    """Refuse to serve HTTP or OTLP beyond loopback without a token.

    Raises:
        ConfigError: ``web_token_required`` when ``web_host`` is not loopback and ``web_token`` is empty.
    """
    if not web_is_loopback(settings.web_host) and not settings.web_token:
        raise ConfigError(
            f"AGENTLOG_WEB_HOST={settings.web_host} serves the console, the query API and the OTLP receivers "
            "beyond this machine; "
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


def create_private_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to a new file only its owner reads (0600, in a 0700 directory); False if it already exists.

    Creation is exclusive (``O_EXCL``), so two processes starting on one home at once keep one file: the one that
    lost the race reads the winner's. For keys (the checkpoint signing key, the key-encryption key).
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


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
        from agentlog.streams.security import bootstrap

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
