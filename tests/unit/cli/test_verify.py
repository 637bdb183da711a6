"""``agentlog verify --export [--checkpoints]`` needs no broker: exit codes, the human line and ``--json`` on files."""

from __future__ import annotations

import json
import random

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.core.checkpoint import public_key_pem
from agentlog.replay.exported import read_jsonl
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import ReplayError
from tests.faults.gen import synthetic_run
from tests.unit.core.forgery import forge, signed_history

KEY = Ed25519PrivateKey.generate()


def _export(path, docs, checkpoints):
    """What ``agentlog export --out path --checkpoints …`` writes: the docs, and the checkpoints file beside them."""
    path.write_bytes(b"".join(jcs(d) + b"\n" for d in docs))
    cps = path.with_suffix(".checkpoints.jsonl")
    cps.write_bytes(b"".join(jcs(c) + b"\n" for c in checkpoints))
    return cps


def _verify(tmp_path, export, *extra, checkpoints=True):
    pub = tmp_path / "ed25519.pub.pem"
    pub.write_bytes(public_key_pem(KEY.public_key()))
    given = ["--checkpoints", str(export.with_suffix(".checkpoints.jsonl"))] if checkpoints else []
    return CliRunner().invoke(app, ["verify", "--run", "r-cli", "--export", str(export), *given, "--public-key",
                                    str(pub), *extra], env={"AGENTLOG_HOME": str(tmp_path / "home")})


def test_verify_an_export_then_a_forged_one(tmp_path):
    docs = synthetic_run("r-cli", 25, random.Random(3))
    records, cps = signed_history(docs, KEY, every=10)
    good = tmp_path / "good.jsonl"
    _export(good, docs, cps)
    assert read_jsonl(good) == docs  # `agentlog compare` reads the same file

    ok = _verify(tmp_path, good)
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("verified: run r-cli, 25 events, 3 checkpoints")
    body = json.loads(_verify(tmp_path, good, "--json").stdout)
    assert body["verified"] is True and body["lastSigned"] == 24 and body["failure"] is None

    forged = tmp_path / "forged.jsonl"
    _export(forged, [r["doc"] for r in forge(records, 12, lambda d: d.update(nodeId="evil"))], cps)
    bad = _verify(tmp_path, forged)
    assert bad.exit_code == 1
    assert "NOT verified: run r-cli: error[checkpoint_mismatch] first unverified index 10 (checkpoint at 19)" in bad.stdout
    failure = json.loads(_verify(tmp_path, forged, "--json").stdout)["failure"]
    assert (failure["code"], failure["atSequence"], failure["checkpointSequence"]) == ("checkpoint_mismatch", 10, 19)

    live = tmp_path / "live.jsonl"  # a run in progress: its last 5 events are not signed yet
    _export(live, docs[:15], [c for c in cps if c["sequence"] < 15])
    assert _verify(tmp_path, live).exit_code == 1
    allowed = _verify(tmp_path, live, "--allow-unsigned-tail", "--json")
    assert allowed.exit_code == 0 and json.loads(allowed.stdout)["unsignedTail"] == {"from": 10, "to": 14}


def test_verify_cannot_run_without_the_run_or_a_readable_key(tmp_path):
    export = tmp_path / "e.jsonl"
    _export(export, synthetic_run("other", 3, random.Random(1)), [])
    missing = _verify(tmp_path, export)
    assert missing.exit_code == 2 and "error[run_not_found]" in missing.output
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello")
    result = CliRunner().invoke(app, ["verify", "--run", "other", "--export", str(export), "--public-key",
                                      str(garbage), "--json"], env={"AGENTLOG_HOME": str(tmp_path / "home")})
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["code"] == "checkpoint_key_invalid"


def test_an_export_alone_is_read_and_nothing_in_it_is_signed(tmp_path):
    docs = synthetic_run("r-cli", 25, random.Random(3))
    alone = tmp_path / "alone.jsonl"
    _export(alone, docs, [])
    result = _verify(tmp_path, alone, checkpoints=False)
    assert result.exit_code == 1, result.output
    assert "error[terminal_checkpoint_missing]" in result.stdout and "no checkpoints file given" in result.stdout

    live = tmp_path / "live.jsonl"  # no terminal event: every event is the unsigned tail
    _export(live, docs[:15], [])
    body = json.loads(_verify(tmp_path, live, "--allow-unsigned-tail", "--json", checkpoints=False).stdout)
    assert (body["verified"], body["checkpointsVerified"], body["unsignedTail"]) == (True, 0, {"from": 0, "to": 14})
    assert any("no checkpoints file given" in note for note in body["notes"])


def test_checkpoint_lines_inside_an_export_are_refused_with_the_way_out(tmp_path):
    docs = synthetic_run("r-cli", 25, random.Random(3))
    _, cps = signed_history(docs, KEY, every=10)
    mixed = tmp_path / "mixed.jsonl"  # docs, then {"checkpoint": {…}} lines
    mixed.write_bytes(b"".join(jcs(d) + b"\n" for d in docs) + b"".join(jcs({"checkpoint": c}) + b"\n" for c in cps))
    result = _verify(tmp_path, mixed, "--json", checkpoints=False)
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "export_unreadable"
    assert f"{mixed}:26: a signed checkpoint, not a RunEventDoc" in error["message"]
    assert "--checkpoints PATH" in error["message"]
    with pytest.raises(ReplayError, match="a signed checkpoint, not a RunEventDoc"):
        read_jsonl(mixed)  # `agentlog compare` refuses it too

    bare = tmp_path / "bare.jsonl"  # the checkpoints file given as the export
    bare.write_bytes(b"".join(jcs(c) + b"\n" for c in cps))
    with pytest.raises(ReplayError, match=f"{bare}:1: a signed checkpoint"):
        read_jsonl(bare)


def test_the_checkpoints_file_holds_checkpoints_and_goes_with_an_export(tmp_path):
    docs = synthetic_run("r-cli", 25, random.Random(3))
    export = tmp_path / "run.jsonl"
    cps = _export(export, docs, [])
    cps.write_bytes(b"".join(jcs(d) + b"\n" for d in docs))  # the export given as the checkpoints file
    swapped = _verify(tmp_path, export)
    assert swapped.exit_code == 2
    assert f"error[checkpoints_unreadable]: {cps}:1: a run event, not a signed checkpoint" in swapped.output
    cps.write_text('{"sequence": 3}\n')
    assert "error[checkpoints_unreadable]" in _verify(tmp_path, export).output
    cps.unlink()
    assert "error[checkpoints_unreadable]: cannot read" in _verify(tmp_path, export).output

    pub = tmp_path / "ed25519.pub.pem"
    alone = CliRunner().invoke(app, ["verify", "--run", "r-cli", "--checkpoints", str(cps), "--public-key", str(pub)],
                               env={"AGENTLOG_HOME": str(tmp_path / "home")})
    assert alone.exit_code == 2 and "--checkpoints goes with --export" in alone.output


def test_a_format_1_log_in_an_export_cannot_be_verified(tmp_path):
    """Log records without stateHash (an agentlog before 0.2): exit 2, ``log_format_unsupported``, the way out."""
    docs = synthetic_run("r-cli", 25, random.Random(3))
    records, cps = signed_history(docs, KEY, every=10)
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(jcs({k: v for k, v in r.items() if k != "stateHash"}) + b"\n" for r in records))
    old.with_suffix(".checkpoints.jsonl").write_bytes(b"".join(jcs(c) + b"\n" for c in cps))
    human = _verify(tmp_path, old)
    assert human.exit_code == 2
    assert human.stderr.startswith("error[log_format_unsupported]: log record run r-cli, sequence 0: this log was "
                                   "written by an agentlog before 0.2")
    body = json.loads(_verify(tmp_path, old, "--json").stdout)
    assert body["verified"] is False and body["error"]["code"] == "log_format_unsupported"
