"""``agentlog verify --export`` needs no broker: exit codes, the human line and ``--json`` on a file."""

from __future__ import annotations

import json
import random

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from processors.cli import app
from processors.core.checkpoint import public_key_pem
from processors.replay.exported import read_jsonl
from schemas.canonical import jcs
from tests.faults.gen import synthetic_run
from tests.unit.core.forgery import forge, signed_history

KEY = Ed25519PrivateKey.generate()


def _export(path, docs, checkpoints):
    """What ``agentlog export`` writes: the docs, then one checkpoint line each."""
    path.write_bytes(b"".join(jcs(d) + b"\n" for d in docs) + b"".join(jcs({"checkpoint": c}) + b"\n"
                                                                      for c in checkpoints))


def _verify(tmp_path, export, *extra):
    pub = tmp_path / "ed25519.pub.pem"
    pub.write_bytes(public_key_pem(KEY.public_key()))
    return CliRunner().invoke(app, ["verify", "--run", "r-cli", "--export", str(export), "--public-key", str(pub),
                                    *extra], env={"AGENTLOG_HOME": str(tmp_path / "home")})


def test_verify_an_export_then_a_forged_one(tmp_path):
    docs = synthetic_run("r-cli", 25, random.Random(3))
    records, cps = signed_history(docs, KEY, every=10)
    good = tmp_path / "good.jsonl"
    _export(good, docs, cps)
    assert read_jsonl(good) == docs  # `agentlog compare` reads the same file, checkpoint lines skipped

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
