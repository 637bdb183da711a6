"""The integration tests' workers: one real ``agentlog worker`` process per test, on the test's own topics."""

from __future__ import annotations

import asyncio

import pytest

from agentlog.streams.admin import ensure_topics
from tests.integration.worker.worker_proc import WorkerProcess
from tests.tools import free_port


@pytest.fixture
def worker(settings):
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings).start()
    yield proc
    proc.stop()


@pytest.fixture
def web_worker(settings):
    """A worker with the audit sink and the web server (console, queries, served results)."""
    settings = settings.replace(web_port=free_port())
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings, sink=True, web=True).start()
    yield proc
    proc.stop()

