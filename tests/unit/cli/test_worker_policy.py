"""``agentlog worker`` stops at start on a redaction policy it cannot use whole, naming the file and the line.

The worker is started as a user starts it (a process, the policy from ``AGENTLOG_REDACTION_POLICY``); it must stop
before it reaches a broker (the bootstrap address here answers nothing) and before it runs anything.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentlog.core.redaction import PolicyError
from agentlog.streams.redaction import load_redactor, salt_path
from agentlog.streams.settings import Settings

BAD = [
    ('version = 1\n\n[detectors]\nemail = "mask"\nphone = "blur"\n', 5, "redaction_policy_invalid"),
    ('version = 1\n[fields."*"]\n"payload.value" = "drop"\n"value.password" = "drop"\n', 4,
     "redaction_policy_invalid"),
    ('metrics_only = true\n[topics."agentlog"\nmetrics_only = false\n', 2, "redaction_policy_syntax"),
]


def _worker(tmp_path, policy) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTLOG_HOME": str(tmp_path / "home"), "AGENTLOG_REDACTION_POLICY": str(policy),
           "AGENTLOG_KAFKA_BOOTSTRAP": "127.0.0.1:9", "AGENTLOG_OTLP_PORT": "0"}
    return subprocess.run([sys.executable, "-m", "agentlog", "worker", "--no-web", "--wait", "1"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("text", "line", "code"), BAD)
def test_a_bad_policy_stops_the_worker_naming_the_file_and_line(tmp_path, text, line, code):
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    done = _worker(tmp_path, policy)
    assert done.returncode == 2, done.stderr
    assert f"error[{code}]: {policy} line {line}: " in done.stderr
    assert not (tmp_path / "home" / "state").exists()  # stopped before it made anything


def test_a_missing_policy_file_stops_the_worker(tmp_path):
    done = _worker(tmp_path, tmp_path / "nowhere.toml")
    assert done.returncode == 2
    assert f"error[redaction_policy_unreadable]: {tmp_path / 'nowhere.toml'}: cannot read" in done.stderr


def test_the_topic_prefix_section_applies_and_a_hashing_policy_needs_the_salt(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[detectors]\nemail = "hash"\n[topics."agentlog-ci"]\nmetrics_only = true\n')
    settings = Settings(home=tmp_path, redaction_policy=str(policy))
    with pytest.raises(PolicyError, match="no salt"):
        load_redactor(settings)  # a reader never makes one
    made = load_redactor(settings, create_salt=True)  # the worker does, privately
    assert oct(salt_path(settings).stat().st_mode & 0o777) == "0o600"
    assert made.policy.action("email") == "hash" and not made.policy.metrics_only
    assert load_redactor(settings.replace(topic_prefix="agentlog-ci")).policy.metrics_only
    doc = {"eventId": "e", "runId": "r", "type": "variable.changed", "sequence": 0,
           "timestamp": "2026-11-28T10:00:00Z", "payload": {"name": "to", "value": "alice@example.com"}}
    # the same salt, the same digest: every process of the deployment hashes alike
    assert made.stored(doc) == load_redactor(settings).stored(doc)
    other = load_redactor(settings.replace(redaction_salt="another deployment"))
    assert other.stored(doc) != made.stored(doc)
