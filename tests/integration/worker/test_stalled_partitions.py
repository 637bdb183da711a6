"""Records Faust's consumer fetched and never delivered are read again (``batch.heal_stalled``).

The worker runs with ``drop_fetched/sitecustomize.py`` on its path, which swallows the first
delivery of every ingest record below an offset inside Faust's ``getmany``: the failure seen in CI,
where a fresh partition's records were all fetched and none reached the agent. Nothing later is
published, so only the stall check can bring them back (the hole heal of ``in_order`` needs a later
record). With the check off the same run stays uncommitted.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from agentlog.streams.publisher import publish_docs
from tests.integration.replay.helpers import committed
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

_REPO = Path(__file__).resolve().parents[3]
_INJECT = Path(__file__).resolve().parent / "drop_fetched"


def _dropping_worker(settings, *, stall_check_s: float) -> WorkerProcess:
    path = os.pathsep.join([str(_REPO), str(_INJECT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return WorkerProcess(settings, env={"PYTHONPATH": path, "AGENTLOG_TEST_DROP_INGEST_BELOW": "1000"},
                         constants={"agentlog.worker.batch:STALL_CHECK_S": stall_check_s})


@pytest.mark.parametrize("stall_check_s", [1.0, 0.0], ids=["check_on", "check_off"])
def test_records_fetched_and_never_delivered_are_read_again(settings, stall_check_s):
    settings = settings.replace(agent_runtime="faust")  # Faust's consumer is what drops them
    run_id = f"stall-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)

    async def scenario():
        summary = await publish_docs(settings, docs, wire="avro")
        assert summary.accepted == len(docs)
        worker = _dropping_worker(settings, stall_check_s=stall_check_s).start()
        try:
            if stall_check_s:
                log = await wait_until(lambda: committed(settings, run_id, len(docs)), what="committed log",
                                       worker=worker, timeout=90)
                assert [r["doc"]["sequence"] for r in log] == list(range(len(docs)))
                assert "were not delivered" in worker.log_path.read_text()
            else:  # the control: the injection does lose the records, and nothing else brings them back
                await asyncio.sleep(20)
                assert worker.alive()
                assert await committed(settings, run_id, 1) is None
        finally:
            worker.stop()

    asyncio.run(scenario())
