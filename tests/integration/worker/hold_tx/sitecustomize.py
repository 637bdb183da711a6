"""Fault injection for ``test_tx_zombie``: the sequencer's first transaction is held open after its records are sent.

Put on ``PYTHONPATH`` of a worker process (after the checkout). With ``AGENTLOG_TEST_HOLD_FIRST_TX=1`` the first
:meth:`agentlog.worker.txruntime.TxBatch.stage` of the process (every output of its batch already sent in the open
transaction) prints that it holds, then waits ``AGENTLOG_TEST_HOLD_FIRST_TX_S`` seconds (the test SIGSTOPs the
process meanwhile) before the batch goes on to commit. Later batches are not touched.
"""

from __future__ import annotations

import os

if os.environ.get("AGENTLOG_TEST_HOLD_FIRST_TX") == "1":
    import asyncio
    import sys

    from agentlog.worker.txruntime import TxBatch

    _stage = TxBatch.stage
    _held: list[bool] = []

    async def stage(self):  # type: ignore[no-untyped-def]
        if not _held:
            _held.append(True)
            print("hold_tx: holding the first transaction open", file=sys.stderr, flush=True)
            await asyncio.sleep(float(os.environ.get("AGENTLOG_TEST_HOLD_FIRST_TX_S", "3")))
            print("hold_tx: the first transaction goes on", file=sys.stderr, flush=True)
        return await _stage(self)

    TxBatch.stage = stage
