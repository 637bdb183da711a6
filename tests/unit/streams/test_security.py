"""The client properties file: parsing, refusals, client arguments, and the password never shown."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from agentlog.schemas.errors import ConfigError
from agentlog.streams.security import SUPPORTED_KEYS, client_kwargs, kcat_args, load_security, parse_properties
from agentlog.streams.settings import load_settings
from agentlog.worker.app import faust_broker_kwargs

PASSWORD = "s3cr3t-Pa55word-xyz"
REPO = Path(__file__).resolve().parents[3]


def _ca(tmp_path: Path) -> Path:
    """A real self-signed CA certificate, so the SSL context below really loads it."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "unit CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = tmp_path / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def _secure_file(tmp_path: Path) -> Path:
    ca = _ca(tmp_path)
    return _write(tmp_path, f"""# written by a test
bootstrap.servers=127.0.0.1:29093
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=host
sasl.password={PASSWORD}
ssl.ca.location={ca.name}
""")


def test_a_sasl_ssl_file_gives_aiokafka_every_connection_argument(tmp_path):
    settings = load_settings(home=tmp_path, kafka_config=str(_secure_file(tmp_path)))
    kwargs = client_kwargs(settings)
    assert set(kwargs) == {"bootstrap_servers", "security_protocol", "sasl_mechanism",
                           "sasl_plain_username", "sasl_plain_password", "ssl_context"}
    assert kwargs["bootstrap_servers"] == "127.0.0.1:29093"
    assert (kwargs["security_protocol"], kwargs["sasl_mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("host", PASSWORD)
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "unit CA"),),)]


def test_the_files_bootstrap_wins_over_the_setting(tmp_path):
    settings = load_settings(home=tmp_path, kafka_bootstrap="127.0.0.1:1", kafka_config=str(_secure_file(tmp_path)))
    assert settings.kafka_bootstrap == "127.0.0.1:29093"


def test_without_a_file_only_the_bootstrap_is_passed(tmp_path):
    settings = load_settings(home=tmp_path, kafka_bootstrap="127.0.0.1:19092", kafka_config="")
    assert client_kwargs(settings) == {"bootstrap_servers": "127.0.0.1:19092"}
    assert kcat_args(settings) == ["-b", "127.0.0.1:19092"]
    assert faust_broker_kwargs(settings) == {"broker": ["kafka://127.0.0.1:19092"]}


def test_sasl_plaintext_has_no_ssl_context_and_keeps_the_settings_bootstrap(tmp_path):
    path = _write(tmp_path, "security.protocol=sasl_plaintext\nsasl.mechanism=PLAIN\n"
                            f"sasl.username=u\nsasl.password={PASSWORD}\n")
    settings = load_settings(home=tmp_path, kafka_bootstrap="10.0.0.1:9092", kafka_config=str(path))
    kwargs = client_kwargs(settings)
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT" and "ssl_context" not in kwargs
    assert kwargs["bootstrap_servers"] == "10.0.0.1:9092"
    assert kcat_args(settings) == ["-F", str(path), "-b", "10.0.0.1:9092"]
    credentials = faust_broker_kwargs(settings)["broker_credentials"]
    assert (credentials.protocol.value, credentials.mechanism.value) == ("SASL_PLAINTEXT", "PLAIN")


def test_faust_gets_scram_credentials_with_the_ssl_context(tmp_path):
    settings = load_settings(home=tmp_path, kafka_config=str(_secure_file(tmp_path)))
    kwargs = faust_broker_kwargs(settings)
    assert kwargs["broker"] == ["kafka://127.0.0.1:29093"]
    credentials = kwargs["broker_credentials"]
    assert (credentials.protocol.value, credentials.mechanism.value) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (credentials.username, credentials.password) == ("host", PASSWORD)
    assert isinstance(credentials.ssl_context, ssl.SSLContext)
    assert kcat_args(settings) == ["-F", str(tmp_path / "client.properties")]


def test_an_unknown_key_is_refused_with_the_supported_ones_listed(tmp_path):
    path = _write(tmp_path, f"sasl.user=host\nsasl.password={PASSWORD}\n")
    with pytest.raises(ConfigError) as e:
        load_security(load_settings(home=tmp_path, kafka_config=str(path)))
    assert e.value.code == "kafka_config_invalid"
    assert "'sasl.user'" in str(e.value) and all(k in str(e.value) for k in SUPPORTED_KEYS)
    assert PASSWORD not in str(e.value)


@pytest.mark.parametrize(("text", "needle"), [
    (f"{PASSWORD}\n", "not a `key=value` line"),
    ("security.protocol=SASL_SSL\nsasl.username=host\n", "needs both sasl.username and sasl.password"),
    (f"security.protocol=SASL_SSL\nsasl.mechanism=MD5\nsasl.username=h\nsasl.password={PASSWORD}\n", "MD5"),
    ("security.protocol=TLS\n", "security.protocol=TLS"),
    ("ssl.ca.location=/nonexistent/ca.pem\n", "does not exist"),
])
def test_a_bad_file_is_a_clear_error_that_never_quotes_the_password(tmp_path, text, needle):
    with pytest.raises(ConfigError) as e:
        parse_properties(text, tmp_path / "bad.properties")
    assert needle in str(e.value) and PASSWORD not in str(e.value)


def test_a_missing_file_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="AGENTLOG_KAFKA_CONFIG=.*cannot be read"):
        load_security(load_settings(home=tmp_path, kafka_config=str(tmp_path / "absent.properties")))


def test_the_password_is_in_no_repr(tmp_path):
    settings = load_settings(home=tmp_path, kafka_config=str(_secure_file(tmp_path)))
    security = load_security(settings)
    assert security is not None and security.sasl_password is not None
    assert security.sasl_password.get_secret_value() == PASSWORD
    shown = " ".join([repr(settings), str(settings), repr(security), str(security),
                      repr(faust_broker_kwargs(settings)["broker_credentials"])])
    assert PASSWORD not in shown and "host" in shown


def test_the_cli_never_prints_the_password_even_when_kafka_is_unreachable(tmp_path):
    """`agentlog publish` against a port nobody listens on: the error names the broker, not the secret."""
    path = _write(tmp_path, f"bootstrap.servers=127.0.0.1:1\nsecurity.protocol=SASL_PLAINTEXT\n"
                            f"sasl.mechanism=SCRAM-SHA-512\nsasl.username=host\nsasl.password={PASSWORD}\n")
    events = tmp_path / "run.jsonl"
    events.write_text("")
    env = {"AGENTLOG_KAFKA_CONFIG": str(path), "AGENTLOG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "agentlog", "publish", str(events)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "127.0.0.1:1" in proc.stdout + proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
