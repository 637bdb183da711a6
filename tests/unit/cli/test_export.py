"""``agentlog export`` needs no broker here: the topics are an in-memory twin behind ``read_topic``.

Each stdout line is one RunEventDoc that validates against the upstream run-event schema, and
nothing else; ``--checkpoints PATH`` puts the run's signed checkpoints in a file of their own,
and ``agentlog verify`` reads the two files together.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

import agentlog.streams.reader
from agentlog.cli import app
from agentlog.core.checkpoint import public_key_pem
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import LogFormatError
from agentlog.schemas.upstream import upstream_file
from tests.faults.gen import synthetic_run
from tests.unit.core.forgery import signed_history

SCHEMA = json.loads(upstream_file("openwop/schemas/run-event.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
KEY = Ed25519PrivateKey.generate()
RUN = "r-export"


@pytest.fixture
def topics(monkeypatch) -> dict[str, list[dict[str, Any]]]:
    """The run's committed log and checkpoints (a redelivered checkpoint and another run's records among them)."""
    records, checkpoints = signed_history(synthetic_run(RUN, 25, random.Random(7)), KEY, every=10)
    other, other_cps = signed_history(synthetic_run("r-other", 4, random.Random(8)), KEY, every=10)
    topics = {"log": [*records[:3], *other, *records[3:]],
              "checkpoints": [*checkpoints, checkpoints[0], *other_cps]}

    async def read_topic(settings, short_name: str, *, key: str | None = None,
                         **_: Any) -> AsyncIterator[tuple[int, int, bytes | None, dict[str, Any]]]:
        for offset, value in enumerate(topics[short_name]):
            yield 0, offset, key.encode() if key else None, value

    monkeypatch.setattr(agentlog.streams.reader, "read_topic", read_topic)
    return topics


def _cli(tmp_path: Path, *args: str):
    return CliRunner().invoke(app, list(args), env={"AGENTLOG_HOME": str(tmp_path / "home")})


def test_stdout_is_run_event_docs_only_each_valid_upstream(tmp_path, topics):
    result = _cli(tmp_path, "export", "--run", RUN)
    assert result.exit_code == 0, result.output
    lines = result.stdout_bytes.splitlines()
    docs = [r["doc"] for r in topics["log"] if r["doc"]["runId"] == RUN]
    assert lines == [jcs(d) for d in docs]
    for line in lines:
        doc = json.loads(line)
        assert [e.message for e in VALIDATOR.iter_errors(doc)] == []
        assert "checkpoint" not in doc
    assert result.stderr == ""


def test_checkpoints_go_to_their_own_file_and_verify_reads_both(tmp_path, topics):
    export, checkpoints = tmp_path / "run.jsonl", tmp_path / "run.checkpoints.jsonl"
    result = _cli(tmp_path, "export", "--run", RUN, "--out", str(export), "--checkpoints", str(checkpoints),
                  "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stderr.strip().splitlines()[-1])
    assert (summary["events"], summary["checkpoints"], summary["checkpointsOut"]) == (25, 3, str(checkpoints))
    assert [json.loads(line) for line in export.read_text().splitlines()] == [
        r["doc"] for r in topics["log"] if r["doc"]["runId"] == RUN]
    signed = topics["checkpoints"][:3]  # the run's own, the redelivered copy dropped, in sequence order
    assert checkpoints.read_bytes() == b"".join(jcs(c) + b"\n" for c in signed)

    pub = tmp_path / "ed25519.pub.pem"
    pub.write_bytes(public_key_pem(KEY.public_key()))
    verified = _cli(tmp_path, "verify", "--run", RUN, "--export", str(export), "--checkpoints", str(checkpoints),
                    "--public-key", str(pub), "--json")
    assert verified.exit_code == 0, verified.output
    body = json.loads(verified.stdout)
    assert (body["verified"], body["checkpointsVerified"], body["lastSigned"]) == (True, 3, 24)


def test_checkpoints_are_only_of_the_committed_log(tmp_path, topics):
    result = _cli(tmp_path, "export", "--run", RUN, "--source", "ingest", "--checkpoints",
                  str(tmp_path / "cps.jsonl"))
    assert result.exit_code != 0 and "--checkpoints needs --source log" in str(result.exception)
    assert not (tmp_path / "cps.jsonl").exists()


def test_a_run_not_signed_yet_gets_an_empty_checkpoints_file_and_a_warning(tmp_path, topics):
    topics["checkpoints"].clear()
    checkpoints = tmp_path / "cps.jsonl"
    result = _cli(tmp_path, "export", "--run", RUN, "--checkpoints", str(checkpoints), "--json")
    assert result.exit_code == 0, result.output
    assert checkpoints.read_bytes() == b""
    warning, summary = result.stderr.strip().splitlines()
    assert warning == f"warning: run {RUN} has no signed checkpoints yet" and json.loads(summary)["checkpoints"] == 0
    assert len(result.stdout_bytes.splitlines()) == 25


def test_a_format_1_log_is_not_exported(tmp_path, topics):
    """A log record without stateHash (an agentlog before 0.2): ``log_format_unsupported``, nothing written."""
    for record in topics["log"][5:]:
        del record["stateHash"]
    out = tmp_path / "run.jsonl"
    result = _cli(tmp_path, "export", "--run", RUN, "--out", str(out))
    assert result.exit_code != 0 and isinstance(result.exception, LogFormatError)
    assert result.exception.code == "log_format_unsupported"
    assert str(result.exception).endswith("re-ingest its runs with `agentlog publish` from an export made with that "
                                          "version")
    assert not out.exists() and not (tmp_path / "run.jsonl.partial").exists()


def test_each_event_is_written_as_it_is_read(tmp_path, topics, monkeypatch):
    """The export holds one event at a time: when the reader hands over the run's last record, every earlier
    one has been written; a redelivery is dropped silently, a conflicting duplicate dropped and counted."""
    import agentlog.cli.publish

    out = tmp_path / "run.jsonl"
    own = [r for r in topics["log"] if r["doc"]["runId"] == RUN]
    conflicting = {**own[2], "doc": {**own[2]["doc"], "nodeId": "someone-else"}}
    topics["log"] = [*topics["log"], own[1], conflicting]
    written: list[bytes] = []
    written_before_last: list[int] = []
    twin, encode = agentlog.streams.reader.read_topic, agentlog.cli.publish.jcs

    async def watched(settings, short_name: str, **kwargs: Any):
        async for record in twin(settings, short_name, **kwargs):
            if short_name == "log" and record[3] is own[-1]:
                written_before_last.append(len(written))
            yield record

    def counted(value: Any) -> bytes:
        written.append(encoded := encode(value))
        return encoded

    monkeypatch.setattr(agentlog.streams.reader, "read_topic", watched)
    monkeypatch.setattr(agentlog.cli.publish, "jcs", counted)
    result = _cli(tmp_path, "export", "--run", RUN, "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    assert written_before_last == [len(own) - 1]
    assert [json.loads(line) for line in out.read_text().splitlines()] == [r["doc"] for r in own]
    summary = json.loads(next(line for line in result.stderr.splitlines() if line.startswith("{")))
    assert (summary["events"], summary["conflicts"]) == (len(own), 1)
    assert "1 conflicting duplicate(s) dropped" in result.stderr
