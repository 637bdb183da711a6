"""Fault injection for ``test_rebalance_fence``: the first batch commit is held until a rebalance starts.

Put on ``PYTHONPATH`` of a worker process (after the checkout). With ``AGENTLOG_TEST_HOLD_FIRST_COMMIT=1``
the first :meth:`Batch.commit` of the process waits, before any table write, until the Faust app
is rebalancing and one second more (at most 120 s): a batch still being handled when another worker
joins the group, which is what Faust does not wait for. Later commits are not touched.

With ``AGENTLOG_TEST_IGNORE_DROPPED=1`` the fence is not told when the group drops the member (the
control of ``test_a_member_the_group_dropped_fences_at_once``): its revocation waits as a kept member's does.
"""

from __future__ import annotations

import os

from tests.integration.worker.worker_proc import apply_constants

apply_constants()  # WorkerProcess(constants=...) of the same test

if os.environ.get("AGENTLOG_TEST_HOLD_FIRST_COMMIT") == "1":
    import asyncio
    import sys
    import time

    from agentlog.worker.batch import Batch

    _commit = Batch.commit
    _held: list[bool] = []

    async def commit(self):  # type: ignore[no-untyped-def]
        if not _held:
            _held.append(True)
            app = self.wiring.app
            deadline = time.monotonic() + 120
            print("slow_commit: holding the first commit until a rebalance", file=sys.stderr, flush=True)
            while not app.rebalancing and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            print("slow_commit: the first commit goes on", file=sys.stderr, flush=True)
        await _commit(self)

    Batch.commit = commit

if os.environ.get("AGENTLOG_TEST_IGNORE_DROPPED") == "1":
    from agentlog.worker import fence as _fence

    _install = _fence.install

    def install(app, fence):  # type: ignore[no-untyped-def]
        _install(app, fence)
        fence.dropped = lambda: False

    _fence.install = install
