"""Fault injection for ``test_stalled_partitions``: Faust's consumer loses fetched records once.

Put on ``PYTHONPATH`` of a worker process (after the checkout, so ``processors`` is the tested
one). With ``AGENTLOG_TEST_DROP_INGEST_BELOW=N`` the first delivery of each ingest record below
offset N is swallowed inside Faust's ``Consumer.getmany``, after aiokafka handed it over and before
Faust's delivery loop sees it: what a worker showed in CI (aiokafka's position at the high
watermark, Faust's read offset unset, nothing delivered, no error). A record delivered again after
a seek is let through.
"""

from __future__ import annotations

import os

from tests.integration.worker.worker_proc import apply_constants

apply_constants()  # WorkerProcess(constants=...) of the same test

_BELOW = int(os.environ.get("AGENTLOG_TEST_DROP_INGEST_BELOW", "0") or 0)

if _BELOW > 0:
    from faust.transport.consumer import Consumer

    _getmany = Consumer.getmany
    _swallowed: set[tuple[str, int, int]] = set()

    async def getmany(self, timeout):  # type: ignore[no-untyped-def]
        async for tp, message in _getmany(self, timeout):
            key = (tp.topic, tp.partition, message.offset)
            if tp.topic.endswith(".ingest") and message.offset < _BELOW and key not in _swallowed:
                _swallowed.add(key)
                continue
            yield tp, message

    Consumer.getmany = getmany
