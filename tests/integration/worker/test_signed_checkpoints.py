"""Signed checkpoints end to end: a run through the real worker, exported, verified offline
and from Kafka; a forged export (one doc rewritten, every hash and state hash recomputed) passes the
chain check and fails ``agentlog verify`` at the span the first broken checkpoint vouches for.

(The forgery on the Kafka log itself, replayed by ``agentlog replay``, is in tests/faults/test_tamper.py.)
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from pathlib import Path

import pytest

from agentlog.core.fold import states_by_index
from agentlog.core.runstate import chain_problem
from agentlog.schemas.canonical import jcs
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from tests.faults.gen import synthetic_run
from tests.integration.replay.helpers import records_of
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, free_port, stored_docs
from tests.unit.core.forgery import forge

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _verify(settings, run_id: str, pub: Path, *extra: str) -> tuple[int, dict]:
    done = agentlog_cli(settings, "verify", "--run", run_id, "--public-key", str(pub), "--json", *extra)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_worker_run_verifies_and_a_forged_export_does_not(settings, tmp_path):
    settings = settings.replace(checkpoint_every=5, web_port=free_port())
    asyncio.run(ensure_topics(settings))
    run_id = f"signed-{uuid.uuid4().hex[:8]}"
    docs = synthetic_run(run_id, 23, random.Random(5))  # checkpoints at 4, 9, 14, 19 and the terminal 22
    worker = WorkerProcess(settings, sink=True, web=True, log_name="signed-worker",
                           constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": 10}).start()
    pub = settings.home / "keys" / "ed25519.pub.pem"
    try:
        async def scenario() -> list[dict]:
            assert (await publish_docs(settings, docs, wire="avro")).accepted == len(docs)

            async def signed():
                found = {c["sequence"] for c in await records_of(settings, "checkpoints", run_id)}
                return found if len(docs) - 1 in found else None

            return sorted(await wait_until(signed, timeout=180, what="the terminal checkpoint", worker=worker))

        assert asyncio.run(scenario()) == [4, 9, 14, 19, 22]
        assert pub.exists() and (settings.home / "keys" / "ed25519.pem").stat().st_mode & 0o777 == 0o600

        export, signed = tmp_path / "run.jsonl", tmp_path / "run.checkpoints.jsonl"
        done = agentlog_cli(settings, "export", "--run", run_id, "--out", str(export), "--checkpoints", str(signed),
                            "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stderr.strip().splitlines()[-1])["checkpoints"] == 5
        # with its checkpoints, the export is the stored form (content sealed), which is what they sign
        assert [json.loads(line) for line in export.read_text().splitlines()] == asyncio.run(
            stored_docs(settings, run_id))
        plain = tmp_path / "plain.jsonl"
        assert agentlog_cli(settings, "export", "--run", run_id, "--out", str(plain)).returncode == 0
        assert [json.loads(line) for line in plain.read_text().splitlines()] == docs  # the events, nothing else
        assert [json.loads(line)["sequence"] for line in signed.read_text().splitlines()] == [4, 9, 14, 19, 22]

        code, offline = _verify(settings, run_id, pub, "--export", str(export), "--checkpoints", str(signed))
        assert (code, offline["verified"], offline["checkpointsVerified"], offline["lastSigned"]) == (0, True, 5, 22)
        code, live = _verify(settings, run_id, pub)
        assert (code, live["verified"], live["headHash"]) == (0, True, offline["headHash"])
        human = agentlog_cli(settings, "verify", "--run", run_id, "--public-key", str(pub), "--export", str(export),
                             "--checkpoints", str(signed))
        assert human.returncode == 0 and "verified" in human.stdout

        async def audited():
            done = agentlog_cli(settings, "sql", f"SELECT sequence FROM checkpoints WHERE run_id = '{run_id}' "
                                         "ORDER BY sequence LIMIT 1 BY sequence", "--json")
            rows = json.loads(done.stdout)["rows"] if done.returncode == 0 else []
            return rows if len(rows) == 5 else None

        rows = asyncio.run(wait_until(audited, timeout=120, interval=2, what="checkpoints in ClickHouse",
                                      worker=worker))
        assert [r[0] for r in rows] == [4, 9, 14, 19, 22]
    finally:
        worker.stop()

    # The forger rewrites event 7 of the export as full log records and recomputes every hash after it.
    from agentlog.streams.reader import read_run

    records = list(asyncio.run(read_run(settings, run_id, opened=False)))
    forged = forge(records, 7, lambda d: d["payload"].update(forged=True) if isinstance(d["payload"], dict) else None)
    assert forged[7]["doc"] != records[7]["doc"]
    assert all(chain_problem(r) is None for r in forged)  # today's chain check passes ...
    assert [r["stateHash"] for r in forged] == [h for _, h in states_by_index([r["doc"] for r in forged])]
    forged_export = tmp_path / "forged.jsonl"
    forged_export.write_text("".join(jcs(r).decode() + "\n" for r in forged))
    code, result = _verify(settings, run_id, pub, "--export", str(forged_export), "--checkpoints", str(signed))
    assert (code, result["verified"]) == (1, False)  # ... and verify does not
    failure = result["failure"]
    assert (failure["code"], failure["atSequence"], failure["checkpointSequence"]) == ("checkpoint_mismatch", 5, 9)
    assert result["lastSigned"] == 4

    # Another key than the worker's: nothing verifies.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentlog.core.checkpoint import public_key_pem

    stranger = tmp_path / "stranger.pub.pem"
    stranger.write_bytes(public_key_pem(Ed25519PrivateKey.generate().public_key()))
    code, result = _verify(settings, run_id, stranger, "--export", str(export), "--checkpoints", str(signed))
    assert (code, result["failure"]["code"], result["failure"]["atSequence"]) == (1, "unknown_key", 0)
    bad = agentlog_cli(settings, "verify", "--run", run_id, "--public-key", str(export), "--export", str(export),
                       "--checkpoints", str(signed))
    assert bad.returncode == 2 and bad.stderr.startswith("error[checkpoint_key_invalid]")
