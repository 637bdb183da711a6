"""Worker roles: what ``agentlog worker --role process|sink|all`` builds (no broker: nothing connects)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentlog.schemas.errors import ConfigError
from agentlog.streams.settings import load_settings
from agentlog.worker.app import build_app, worker_role

REPO = Path(__file__).resolve().parents[3]


def _settings(tmp_path, role: str):
    # Port 9 (discard): nothing listens there, and nothing here connects anyway.
    return load_settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="unit", home=tmp_path, worker_role=role,
                         clickhouse_url=f"chdb://{tmp_path / 'ch'}", replication_factor=1, partitions=2)


def _agents(wiring) -> set[str]:
    """The agents the worker runs: its Faust app's and those on Kafka transactions."""
    return {agent.name.rsplit(".", 1)[-1] for agent in wiring.app.agents.values()} | set(wiring.tx_agents)


def test_process_runs_the_agents_and_opens_no_store(tmp_path):
    wiring = build_app(_settings(tmp_path, "process"), replay=False)
    assert wiring.store is None
    assert wiring.tables and _agents(wiring) >= {"sequencer", "handoff", "otel-spans", "otel-sequencer"}
    assert not (tmp_path / "ch").exists()


def test_sink_runs_only_the_sink_and_joins_no_group(tmp_path):
    wiring = build_app(_settings(tmp_path, "sink"), replay=False)
    try:
        assert wiring.app.producer_only  # Faust starts no consumer: the processing group never sees it
        assert _agents(wiring) == set() and wiring.tables == {}
        assert wiring.store is not None and wiring.store.path == str(tmp_path / "ch")
    finally:
        wiring.store.close()


def test_all_runs_both(tmp_path):
    wiring = build_app(_settings(tmp_path, "all"), replay=False)
    try:
        assert wiring.store is not None and _agents(wiring) >= {"sequencer", "handoff", "otel-spans", "otel-sequencer"}
    finally:
        wiring.store.close()


def test_the_role_is_the_setting_and_nonsense_is_refused(tmp_path):
    assert [worker_role(_settings(tmp_path, role)) for role in ("all", "process", "sink")] == ["all", "process", "sink"]
    with pytest.raises(ConfigError) as e:
        worker_role(_settings(tmp_path, "nonsense"))
    assert e.value.code == "bad_worker_role"


def test_the_cli_says_so_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "agentlog", "worker", "--role", "nonsense", "--no-web"],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "AGENTLOG_HOME": str(tmp_path),
                              "AGENTLOG_KAFKA_BOOTSTRAP": "127.0.0.1:9"})
    assert out.returncode == 2 and out.stderr.startswith("error[bad_worker_role]:"), out.stderr


def test_every_table_changelog_rolls_a_segment_an_hour_so_compaction_follows_the_runs_in_flight(tmp_path):
    from agentlog.worker.app import CHANGELOG_SEGMENT_MS, internal_topic_specs

    wiring = build_app(load_settings(home=tmp_path, worker_role="process", otlp_port=0))
    changelogs = [spec for spec in internal_topic_specs(wiring) if spec.name.endswith("-changelog")]
    assert changelogs and all(spec.config["segment.ms"] == str(CHANGELOG_SEGMENT_MS) for spec in changelogs)
