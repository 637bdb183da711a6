"""Kafka client security from one properties file (``AGENTLOG_KAFKA_CONFIG``): SASL/SCRAM over TLS.

Why a librdkafka/kcat properties file and not a handful of ``AGENTLOG_*`` variables: the same file
then configures every client of the broker — ours (aiokafka, Faust), ``kcat -F <file>`` and any
librdkafka host — and ``agentlog infra up --secure`` can hand each principal exactly one file.

Every place that builds a Kafka client asks this module for its connection arguments
(:func:`client_kwargs`; Faust's through :mod:`agentlog.worker.security`), so no client can be
built that silently ignores the file. The password is held as a pydantic ``SecretStr``: it never
appears in a repr, an error message or a log line (``tests/unit/streams/test_security.py``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import SecretStr

from agentlog.schemas.errors import ConfigError

__all__ = [
    "SUPPORTED_KEYS",
    "KafkaSecurity",
    "KafkaSettings",
    "acl_hint",
    "bootstrap",
    "client_kwargs",
    "kcat_args",
    "load_security",
    "parse_properties",
]

#: The keys a properties file may hold: librdkafka's names, so kcat reads the same file.
SUPPORTED_KEYS = (
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
)


class KafkaSettings(Protocol):
    """What this module reads of :class:`agentlog.streams.settings.Settings`.

    A protocol, not an import: ``load_settings`` applies the file's ``bootstrap.servers`` through
    this module, and an import back would be a cycle.
    """

    @property
    def kafka_bootstrap(self) -> str: ...

    @property
    def kafka_config(self) -> str: ...


_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaSecurity:
    """A parsed properties file. ``sasl_password`` is a ``SecretStr``: call ``get_secret_value()``."""

    source: Path
    bootstrap_servers: str | None = None
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context trusting ``ssl.ca.location`` (the system CAs when it is unset).

        Hostname checking stays on: the local broker's certificate names 127.0.0.1 and localhost.
        """
        cafile = str(self.ssl_ca_location) if self.ssl_ca_location else None
        try:
            return ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"ssl.ca.location={self.ssl_ca_location} in {self.source} is not a readable PEM CA file ({e})",
                code="kafka_config_invalid",
            ) from e


def parse_properties(text: str, source: Path) -> KafkaSecurity:
    """Parse ``key=value`` lines (``#``/``!`` comments, blank lines ignored) into a checked config.

    An unknown key is an error listing the supported ones: a typo such as ``sasl.user`` must not
    silently produce an unauthenticated client. Values are never quoted in messages (a malformed
    line may be the password's).
    """
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"{source}:{number} is not a `key=value` line; supported keys: {', '.join(SUPPORTED_KEYS)}",
                code="kafka_config_invalid",
            )
        if key not in SUPPORTED_KEYS:
            raise ConfigError(
                f"{source}:{number}: unsupported key {key!r}; supported keys: {', '.join(SUPPORTED_KEYS)}",
                code="kafka_config_invalid",
            )
        values[key] = value.strip()

    protocol = values.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise ConfigError(
            f"{source}: security.protocol={protocol} is not one of {', '.join(_PROTOCOLS)}",
            code="kafka_config_invalid",
        )
    mechanism = values.get("sasl.mechanism", "").upper() or None
    username = values.get("sasl.username") or None
    password = values.get("sasl.password")
    if protocol.startswith("SASL_"):
        mechanism = mechanism or "PLAIN"  # librdkafka's default
        if mechanism not in _MECHANISMS:
            raise ConfigError(
                f"{source}: sasl.mechanism={mechanism} is not one of {', '.join(_MECHANISMS)}",
                code="kafka_config_invalid",
            )
        if not username or not password:
            raise ConfigError(
                f"{source}: security.protocol={protocol} needs both sasl.username and sasl.password",
                code="kafka_config_invalid",
            )
    ca = values.get("ssl.ca.location")
    ca_path = (source.parent / ca).resolve() if ca else None
    if ca_path is not None and not ca_path.is_file():
        raise ConfigError(f"{source}: ssl.ca.location {ca_path} does not exist", code="kafka_config_invalid")
    return KafkaSecurity(
        source=source,
        bootstrap_servers=values.get("bootstrap.servers") or None,
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=SecretStr(password) if password else None,
        ssl_ca_location=ca_path,
    )


def load_security(settings: KafkaSettings) -> KafkaSecurity | None:
    """The parsed ``settings.kafka_config`` file, or None when no file is configured."""
    if not settings.kafka_config:
        return None
    path = Path(settings.kafka_config).expanduser().resolve()
    try:
        text = path.read_text("utf-8")
    except OSError as e:
        raise ConfigError(
            f"AGENTLOG_KAFKA_CONFIG={path} cannot be read ({e.strerror}); point it at a client properties file",
            code="kafka_config_invalid",
        ) from e
    return parse_properties(text, path)


def bootstrap(settings: KafkaSettings) -> str:
    """The bootstrap servers to use: the properties file's ``bootstrap.servers`` wins over the setting."""
    security = load_security(settings)
    if security is not None and security.bootstrap_servers:
        return security.bootstrap_servers
    return settings.kafka_bootstrap


def client_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """Connection arguments for any aiokafka client (producer, consumer, admin).

    ``bootstrap_servers`` always; with a properties file also ``security_protocol`` and, as it
    requires, ``sasl_mechanism``/``sasl_plain_username``/``sasl_plain_password`` and ``ssl_context``.
    Any: the values are those aiokafka's keyword arguments take (str, SSLContext).
    """
    security = load_security(settings)
    kwargs: dict[str, Any] = {"bootstrap_servers": bootstrap(settings)}
    if security is None:
        return kwargs
    kwargs["security_protocol"] = security.security_protocol
    if security.uses_sasl:
        assert security.sasl_password is not None  # parse_properties guarantees it
        kwargs["sasl_mechanism"] = security.sasl_mechanism
        kwargs["sasl_plain_username"] = security.sasl_username
        kwargs["sasl_plain_password"] = security.sasl_password.get_secret_value()
    if security.uses_tls:
        kwargs["ssl_context"] = security.ssl_context()
    return kwargs


def acl_hint(settings: KafkaSettings) -> str:
    """A clause for "not found" errors: on a secured cluster a topic the principal may not describe looks absent."""
    security = load_security(settings)
    if security is None or not security.sasl_username:
        return ""
    return (f", or Kafka's ACLs do not let {security.sasl_username!r} (AGENTLOG_KAFKA_CONFIG={security.source}) "
            "use it; use the properties file of a principal that may")


def kcat_args(settings: KafkaSettings) -> list[str]:
    """Arguments that point ``kcat`` at the configured broker: ``-F <file>`` when one is configured."""
    if settings.kafka_config:
        args = ["-F", str(Path(settings.kafka_config).expanduser().resolve())]
        security = load_security(settings)
        if security is not None and not security.bootstrap_servers:
            args += ["-b", settings.kafka_bootstrap]
        return args
    return ["-b", settings.kafka_bootstrap]
