"""The secure stack's material without a broker: files, modes, ACL lines, no password in a repr."""

from __future__ import annotations

import json
import stat

import pytest

from agentlog.infra.kafka import local, secure
from agentlog.schemas.errors import InfraError
from agentlog.streams.security import client_kwargs, load_security
from agentlog.streams.settings import load_settings


def test_material_is_private_reused_and_names_each_principal(tmp_path):
    settings = load_settings(home=tmp_path, kafka_config="")
    first = secure.ensure_material(settings, "127.0.0.1:29092")
    assert stat.S_IMODE(first.directory.stat().st_mode) == 0o700
    for path in [first.keystore, first.admin_java_properties, *(first.properties(p) for p in secure.PRINCIPALS),
                 first.directory / "credentials.json"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for principal in secure.PRINCIPALS:
        kwargs = client_kwargs(settings.replace(kafka_config=str(first.properties(principal))))
        assert (kwargs["bootstrap_servers"], kwargs["sasl_plain_username"]) == ("127.0.0.1:29092", principal)
        assert kwargs["sasl_plain_password"] == first.passwords[principal]
        assert kwargs["ssl_context"].get_ca_certs()[0]["subject"] == ((("commonName", "agentlog local CA"),),)
    assert len(set(first.passwords.values())) == len(first.passwords)
    assert not [p for p in first.passwords.values() if p in repr(first)]

    again = secure.ensure_material(settings, "127.0.0.1:29094")  # a restart: same users, new port
    assert again.passwords == first.passwords
    security = load_security(settings.replace(kafka_config=str(again.properties("host"))))
    assert security is not None and security.bootstrap_servers == "127.0.0.1:29094"


def test_scram_users_and_server_settings_carry_every_principal(tmp_path):
    material = secure.ensure_material(load_settings(home=tmp_path, kafka_config=""), "127.0.0.1:29092")
    args = secure.scram_format_args(material)
    assert args[::2] == ["--add-scram"] * 3
    assert [a.split("[name=")[1].split(",")[0] for a in args[1::2]] == list(secure.PRINCIPALS)
    values = secure.server_properties(material)
    assert f'user_host="{material.passwords["host"]}"' in values["plain_users_jaas"]
    assert 'username="admin"' in values["inter_broker_jaas"]


def test_acls_let_host_write_only_ingest_and_worker_own_the_prefix_but_not_erase():
    lines = secure.acl_lines("p1")
    assert [line for line in lines if "User:host" in line] == [
        "TOPIC LITERAL p1.ingest User:host WRITE", "TOPIC LITERAL p1.ingest User:host DESCRIBE"]
    assert [line for line in lines if "User:worker" in line] == [
        "TOPIC PREFIXED p1. User:worker ALL", "TOPIC PREFIXED p1-worker User:worker ALL",
        "TOPIC LITERAL p1.erasures User:worker WRITE DENY", "TOPIC LITERAL p1.ingest User:worker DELETE DENY",
        "TOPIC LITERAL p1.spans User:worker DELETE DENY", "TOPIC LITERAL p1.otel-events User:worker DELETE DENY",
        "GROUP PREFIXED p1-worker User:worker ALL", "TRANSACTIONAL_ID PREFIXED p1-worker User:worker ALL",
        "GROUP LITERAL p1.audit-sink User:worker ALL"]
    assert all(len(line.split()) == 5 or line.endswith(" DENY") and len(line.split()) == 6 for line in lines)


def test_a_plain_home_is_not_silently_turned_secure_nor_a_secure_one_plain(tmp_path):
    """Both refusals happen before any JVM is launched (no broker in a unit test)."""
    settings = load_settings(home=tmp_path, kafka_bootstrap="127.0.0.1:29092", kafka_config="")
    topology = {"nodes": 1, "base_port": 29092, "cluster_id": "c", "kafka_version": local.KAFKA_VERSION}
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "cluster.json").write_text(json.dumps(topology))  # written before --secure existed
    with pytest.raises(InfraError) as plain_to_secure:
        local.start(settings, secure=True)
    assert plain_to_secure.value.code == "topology_mismatch" and "(secure)" in str(plain_to_secure.value)

    (tmp_path / "kafka" / "cluster.json").write_text(json.dumps({**topology, "secure": True}))
    with pytest.raises(InfraError) as secure_to_plain:
        local.start(settings, secure=False)
    assert secure_to_plain.value.code == "topology_mismatch" and "secure stack" in str(secure_to_plain.value)
    assert local.secure_properties(settings) == {p: tmp_path / "secure" / f"{p}.properties" for p in secure.PRINCIPALS}


def test_the_secure_stack_is_one_node(tmp_path):
    settings = load_settings(home=tmp_path, kafka_bootstrap="127.0.0.1:29092", kafka_config="")
    with pytest.raises(InfraError, match="one node") as e:
        local.start(settings, nodes=3, secure=True)
    assert e.value.code == "config_error"
