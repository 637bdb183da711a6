"""The integration tests' worker: one real ``agentlog worker`` process per test, on the test's own topics."""

from __future__ import annotations

import asyncio

import pytest

from agentlog.streams.admin import ensure_topics
from tests.integration.worker.worker_proc import WorkerProcess


@pytest.fixture
def worker(settings):
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings).start()
    yield proc
    proc.stop()
