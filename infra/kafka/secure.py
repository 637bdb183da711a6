"""What ``agentlog infra up --secure`` adds to the local broker: TLS material, SCRAM users, ACLs, client files.

Layout under ``Settings.home / "secure"`` (files holding a secret are mode 0600)::

    ca.pem                  the CA clients trust (``ssl.ca.location``); its key is not kept
    broker.p12              the broker's key and certificate (127.0.0.1, localhost), signed by the CA
    credentials.json        every generated password (users, keystore, controller) - 0600
    host.properties         librdkafka/kcat/AGENTLOG_KAFKA_CONFIG files, one per principal - 0600
    worker.properties
    admin.properties
    admin.java.properties   the same as admin, in the Java client's names (for Kafka's own tools) - 0600

Who may do what (the single-writer rule of SPEC §4, enforced by Kafka instead of trusted):

* ``host``: WRITE and DESCRIBE on ``<prefix>.ingest`` and nothing else;
* ``worker``: everything on topics ``<prefix>.*`` and ``<prefix>-worker*`` (its tables' changelogs), on groups
  ``<prefix>-worker*`` (its agents') and ``<prefix>.audit-sink``, and on transactional ids ``<prefix>-worker*``
  (its agents' writers); the only principal besides ``admin`` that may write the log, snapshots, transitions,
  violations and verdicts;
* ``admin``: super user (also the inter-broker principal);
* the client listener takes SCRAM-SHA-512 (what the files name) and, inside TLS, PLAIN for the same
  users: librdkafka before 2.6.1 (Debian 12's kcat) cannot finish SCRAM with Kafka 4 (its client
  nonce bug, confluentinc/librdkafka#4895), so such a client adds ``-X sasl.mechanism=PLAIN``;
* ``controller``: super user on the loopback controller listener only (SASL PLAIN against a static
  JAAS user; KRaft controllers cannot check SCRAM, whose credentials live in the metadata they serve).

The certificates are made with ``cryptography`` (PKCS12 keystore, PEM trust store), the SCRAM users
are written into the metadata at format time (``kafka-storage format --add-scram``), and the ACLs
are created through Kafka's own Java Admin API (``SecureAcls.java``, run by the JDK's source
launcher), because aiokafka's admin client has no CreateAcls call.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agentlog.schemas.errors import InfraError
from agentlog.streams.settings import Settings
from agentlog.streams.topics import PLAINTEXT_TOPICS

__all__ = [
    "PRINCIPALS",
    "SecureMaterial",
    "acl_lines",
    "create_acls",
    "ensure_material",
    "scram_format_args",
    "secure_dir",
    "write_private",
    "server_properties",
]

HERE = Path(__file__).resolve().parent
ACL_PROGRAM = HERE / "SecureAcls.java"
PRINCIPALS = ("admin", "worker", "host")
MECHANISM = "SCRAM-SHA-512"
# The CA and broker certificate outlive any local stack; a year keeps a forgotten home usable.
_VALIDITY = dt.timedelta(days=365)


def secure_dir(settings: Settings) -> Path:
    return Path(settings.home).resolve() / "secure"


@dataclass(frozen=True)
class SecureMaterial:
    """Paths and passwords of a secure home; ``repr`` shows no password."""

    directory: Path
    passwords: dict[str, str]

    def __repr__(self) -> str:
        return f"SecureMaterial(directory={self.directory!s}, principals={sorted(self.passwords)})"

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.directory / "broker.p12"

    def properties(self, principal: str) -> Path:
        return self.directory / f"{principal}.properties"

    @property
    def admin_java_properties(self) -> Path:
        return self.directory / "admin.java.properties"


def write_private(path: Path, data: bytes | str) -> None:
    """Create ``path`` readable by its owner only, before any secret is written into it."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def _certificates(directory: Path, keystore_password: str) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # small clock skew between tools
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentlog local CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + _VALIDITY)
        # Clients check the name they dialled: the broker advertises 127.0.0.1.
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_private(directory / "broker.p12", pkcs12.serialize_key_and_certificates(
        b"broker", key, cert, [ca], serialization.BestAvailableEncryption(keystore_password.encode()),
    ))


def _client_properties(bootstrap: str, ca: Path, user: str, password: str) -> str:
    return (
        "# Written by `agentlog infra up --secure`: a librdkafka/kcat client config (kcat -F <file>),\n"
        "# and agentlog's AGENTLOG_KAFKA_CONFIG. Keep it private (mode 0600): it holds a password.\n"
        f"bootstrap.servers={bootstrap}\n"
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={MECHANISM}\n"
        f"sasl.username={user}\n"
        f"sasl.password={password}\n"
        f"ssl.ca.location={ca}\n"
    )


def _java_client_properties(bootstrap: str, ca: Path, user: str, password: str) -> str:
    return (
        "# The admin principal in the Java client's names (kafka-acls.sh --command-config <file>, ...).\n"
        f"bootstrap.servers={bootstrap}\n"
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={MECHANISM}\n"
        f"sasl.jaas.config={_scram_jaas(user, password)}\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={ca}\n"
    )


def _scram_jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def ensure_material(settings: Settings, bootstrap: str) -> SecureMaterial:
    """Generate the CA, keystore and passwords once; (re)write the client files for ``bootstrap``.

    Passwords are kept across restarts (the SCRAM credentials in the broker's metadata were made
    from them); ``agentlog infra down --purge`` discards both together.
    """
    directory = secure_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    stored = directory / "credentials.json"
    if stored.is_file() and (directory / "broker.p12").is_file():
        passwords = json.loads(stored.read_text())
    else:
        # token_urlsafe: letters, digits, '-' and '_' only, safe inside the --add-scram and JAAS syntaxes.
        passwords = {name: secrets.token_urlsafe(24) for name in (*PRINCIPALS, "controller", "keystore")}
        _certificates(directory, passwords["keystore"])
        write_private(stored, json.dumps(passwords, indent=2) + "\n")
    material = SecureMaterial(directory=directory, passwords=passwords)
    for user in PRINCIPALS:
        write_private(material.properties(user),
                       _client_properties(bootstrap, material.ca, user, passwords[user]))
    write_private(material.admin_java_properties,
                   _java_client_properties(bootstrap, material.ca, "admin", passwords["admin"]))
    return material


def server_properties(material: SecureMaterial) -> dict[str, str]:
    """Template values for ``node.secure.properties``."""
    p = material.passwords
    return {
        "inter_broker_jaas": _scram_jaas("admin", p["admin"]),
        "plain_users_jaas": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                            + " ".join(f'user_{user}="{p[user]}"' for user in PRINCIPALS) + ";",
        "controller_jaas": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="controller" password="{p["controller"]}" user_controller="{p["controller"]}";'
        ),
        "keystore": str(material.keystore),
        "keystore_password": p["keystore"],
        "truststore": str(material.ca),
    }


def scram_format_args(material: SecureMaterial) -> list[str]:
    """``kafka-storage format`` arguments that create the SCRAM users in the new cluster's metadata."""
    args: list[str] = []
    for user in PRINCIPALS:
        args += ["--add-scram", f"{MECHANISM}=[name={user},password={material.passwords[user]}]"]
    return args


def acl_lines(prefix: str) -> list[str]:
    """``resourceType patternType name principal operation [DENY]`` per ACL (read by ``SecureAcls.java``).

    ``host`` writes ingest and nothing else: it reads no topic, the keyring included. ``worker`` uses every topic
    of the prefix (it mints, reads and wraps the data keys), but erasing is ``admin``'s alone: a DENY (which wins
    over any ALLOW) keeps the worker from writing erasure receipts and from deleting records of the plaintext topics.
    """
    worker_prefixes = (f"{prefix}.", f"{prefix}-worker")
    lines = [f"TOPIC LITERAL {prefix}.ingest User:host {op}" for op in ("WRITE", "DESCRIBE")]
    for name in worker_prefixes:
        lines.append(f"TOPIC PREFIXED {name} User:worker ALL")
    lines.append(f"TOPIC LITERAL {prefix}.erasures User:worker WRITE DENY")
    lines += [f"TOPIC LITERAL {prefix}.{short} User:worker DELETE DENY" for short in PLAINTEXT_TOPICS]
    lines.append(f"GROUP PREFIXED {prefix}-worker User:worker ALL")
    lines.append(f"TRANSACTIONAL_ID PREFIXED {prefix}-worker User:worker ALL")  # the agents' writers
    lines.append(f"GROUP LITERAL {prefix}.audit-sink User:worker ALL")  # the audit sink's own group
    return lines


def create_acls(settings: Settings, material: SecureMaterial, java: str, libs: Path) -> None:
    """Create the ACLs for ``settings.topic_prefix`` through Kafka's Java Admin API (idempotent)."""
    cmd = [java, "-Xmx256m", "-cp", f"{libs}/*", str(ACL_PROGRAM), str(material.admin_java_properties)]
    proc = subprocess.run(cmd, input="\n".join(acl_lines(settings.topic_prefix)) + "\n",
                          capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0:
        last = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise InfraError(
            f"creating the Kafka ACLs failed: {last[-1][:300] if last else 'no output'}",
            code="broker_start_failed",
        )
