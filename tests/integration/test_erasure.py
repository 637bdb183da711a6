"""``agentlog erase`` on a real broker and worker: two subjects, content carrying marker strings.

After the erase of one subject: its runs (and their children) read ``[erased]`` wherever content was, the
keyring holds none of their keys, ingest is truncated to what the worker committed, every run still verifies,
the other subject is intact, a late event of an erased run is refused, a replay of it is refused, and a second
erase changes nothing and says so.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from agentlog.core.sealing import ERASED
from agentlog.replay.regression import load_recorded
from agentlog.schemas.errors import ReplayError
from agentlog.streams.erasure import keys_left, read_receipts
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import first_offset, read_run, read_topic
from agentlog.streams.topics import topic_name
from tests.integration.worker.worker_proc import wait_until
from tests.tools import agentlog_cli, all_committed, http_get, redaction_off
from tests.unit.core.runs import child_run_id, child_runs, realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _subject_runs(run_id: str, subject: str, marker: str) -> dict[str, list[dict]]:
    """A parent run of ``subject`` with its children, content carrying ``marker``."""
    runs = {run_id: realistic_run(run_id), **child_runs(run_id)}
    runs[run_id][0]["payload"]["subjectId"] = subject
    for child in runs:
        if child != run_id:
            runs[child][0]["payload"]["parentRunId"] = run_id
    for docs in runs.values():
        for doc in docs:
            if doc["type"] == "variable.changed":
                doc["payload"]["value"] = f"{marker} {doc['payload']['name']}"
            elif doc["type"] == "channel.written":
                doc["payload"]["value"] = f"{marker} on {doc['payload']['channel']}"
    return runs


def _contains(docs: list[dict], text: str) -> bool:
    return text in json.dumps(docs)






@pytest.fixture
def settings(settings, tmp_path):
    """Redaction off: the runs' content (markers that look random, e-mail subjects) must read back as sent until
    erased; what redaction does is tested in ``tests/integration/test_redaction.py``."""
    return redaction_off(settings, tmp_path)


def test_erase_a_subject_then_everything_else_holds(settings, web_worker):
    worker = web_worker
    settings = worker.settings
    alice_run, bob_run = f"alice-{uuid.uuid4().hex[:8]}", f"bob-{uuid.uuid4().hex[:8]}"
    alice_mark, bob_mark = f"MARK-{uuid.uuid4().hex}", f"MARK-{uuid.uuid4().hex}"
    alice = _subject_runs(alice_run, "alice@example.com", alice_mark)
    bob = _subject_runs(bob_run, "bob@example.com", bob_mark)
    every = {**alice, **bob}

    async def published() -> None:
        docs = [d for run in every.values() for d in run]
        assert (await publish_docs(settings, docs)).accepted == len(docs)

        await wait_until(lambda: all_committed(settings, every), timeout=180, what="every run committed",
                         worker=worker)
        for run_id, docs in every.items():
            assert [c["doc"] for c in await read_run(settings, run_id)] == docs  # opened: as published

        async def console_shows_it():
            return http_get(worker, f"/runs/{alice_run}") if alice_mark in http_get(worker, f"/runs/{alice_run}")[1] else None

        await wait_until(console_shows_it, timeout=120, what="the console showing alice's run", worker=worker)

    asyncio.run(published())
    status, served = http_get(worker, f"/replay/{alice_run}/results")
    assert status != 410, served

    done = agentlog_cli(settings, "erase", "--subject", "alice@example.com", "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["erased"] is True and not result["alreadyErased"]
    assert {r for r in result["runs"] if not r.startswith("rejections/")} == set(alice)  # with its children
    assert result["events"] == {run_id: len(docs) for run_id, docs in alice.items()}
    assert result["receipt"]["subject"] and "alice@" not in json.dumps(result["receipt"])  # a tag, not the id

    async def after() -> None:
        for run_id, docs in alice.items():
            opened = [c["doc"] for c in await read_run(settings, run_id)]
            assert len(opened) == len(docs) and not _contains(opened, alice_mark)
            assert _contains(opened, ERASED) or not any(d["type"] in ("variable.changed", "channel.written")
                                                        for d in docs)
            # metadata stays: types, ids, names, usage
            assert [(d["type"], d["eventId"], d["sequence"]) for d in opened] == \
                   [(d["type"], d["eventId"], d["sequence"]) for d in docs]
        for run_id, docs in bob.items():
            assert [c["doc"] for c in await read_run(settings, run_id)] == docs
        assert await keys_left(settings, set(alice)) == {}
        # ingest, the plaintext buffer, holds nothing the worker has committed
        assert not [v async for _, _, _, v in read_topic(settings, "ingest", skip_undecodable=True)
                    if alice_mark in json.dumps(v)]
        assert any([await first_offset(settings, topic_name(settings, "ingest"), p) > 0
                    for p in range(settings.partitions)])
        assert [r["receiptId"] for r in await read_receipts(settings)] == [result["receiptId"]]

    asyncio.run(after())

    status, page = http_get(worker, f"/runs/{alice_run}")
    assert status == 200 and alice_mark not in page and ERASED in page
    assert bob_mark in http_get(worker, f"/runs/{bob_run}")[1]
    status, served = http_get(worker, f"/replay/{alice_run}/results")
    assert status == 410 and json.loads(served)["error"]["code"] == "run_erased"

    pub = settings.home / "keys" / "ed25519.pub.pem"
    for run_id in every:
        check = agentlog_cli(settings, "verify", "--run", run_id, "--public-key", str(pub), "--json")
        assert check.returncode == 0 and json.loads(check.stdout)["verified"], (run_id, check.stdout, check.stderr)
        receipt_notes = [n for n in json.loads(check.stdout)["notes"] if result["receiptId"] in n]
        assert len(receipt_notes) == (1 if run_id in alice else 0)

    export = agentlog_cli(settings, "export", "--run", alice_run)
    assert export.returncode == 0 and alice_mark not in export.stdout and ERASED in export.stdout
    assert len(export.stdout.splitlines()) == len(alice[alice_run])

    again = agentlog_cli(settings, "erase", "--subject", "alice@example.com", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["alreadyErased"] is True
    unknown = agentlog_cli(settings, "erase", "--subject", "nobody@example.com", "--json")
    assert unknown.returncode == 2 and json.loads(unknown.stdout)["error"]["code"] == "unknown_subject"

    with pytest.raises(ReplayError) as refused_replay:  # what replay-test, mock mode and the replay client read
        load_recorded(alice_run, settings=settings)
    assert refused_replay.value.code == "run_erased"
    assert load_recorded(bob_run, settings=settings)[1] == bob[bob_run]

    # A late event of an erased run is refused with its own reason.
    late = {**alice[child_run_id(alice_run, "a")][-1], "eventId": f"late-{uuid.uuid4().hex[:6]}",
            "sequence": len(alice[child_run_id(alice_run, "a")])}

    async def refused() -> None:
        await publish_docs(settings, [late])

        async def rejection():
            async for _, _, _, value in read_topic(settings, "rejections"):
                if value.get("eventId") == late["eventId"]:
                    return value
            return None

        found = await wait_until(rejection, timeout=120, what="the late event's rejection", worker=worker)
        assert found["reason"] == "run_erased" and found["raw"] == ERASED

    asyncio.run(refused())
