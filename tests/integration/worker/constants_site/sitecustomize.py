"""Put on ``PYTHONPATH`` of a worker process (after the checkout) by :class:`WorkerProcess` with ``constants``:
sets the module constants named in ``$AGENTLOG_TEST_CONSTANTS`` before the worker starts."""

from tests.integration.worker.worker_proc import apply_constants

apply_constants()
