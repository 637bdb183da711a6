"""The parent's view of its process half (:mod:`agentlog.worker.halves`), without a broker.

Its metrics are read back with :func:`agentlog.metrics.parse_exposition`, the inverse of ``render``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from agentlog.metrics import Metrics, parse_exposition
from agentlog.streams.settings import load_settings
from agentlog.worker.halves import PARENT_FD_ENV, ProcessHalf


def test_what_the_child_exposes_is_read_back_as_the_same_series():
    metrics = Metrics()
    metrics.inc("agentlog_events_accepted_total", 41)
    metrics.inc("agentlog_events_rejected_total", 2, reason='bad "quote" \\ and\nnewline')
    metrics.set("agentlog_durable_position", 1234, topic="p.ingest", partition="3", table="heads")
    samples = {(name, tuple(sorted(labels.items()))): value
               for name, labels, value in parse_exposition(metrics.render())}
    assert samples == {
        ("agentlog_events_accepted_total", ()): 41.0,
        ("agentlog_events_rejected_total", (("reason", 'bad "quote" \\ and\nnewline'),)): 2.0,
        ("agentlog_durable_position", (("partition", "3"), ("table", "heads"), ("topic", "p.ingest"))): 1234.0,
    }


def test_the_child_runs_the_process_role_on_loopback_beside_the_public_port(tmp_path):
    settings = load_settings(worker_role="sink", sink_process=True, web_port=7000, web_host="0.0.0.0",
                             web_token="t0ken")
    half = ProcessHalf(settings, web=True)
    args = half.args()
    assert args[args.index("--role") + 1] == "process"
    assert args[args.index("--web-port") + 1] == "7001"
    env = half.env(9)
    assert env["AGENTLOG_WORKER_ROLE"] == "process"
    assert env["AGENTLOG_SINK_PROCESS"] == "false"  # the child does not start a child of its own
    # The child's OTLP receivers listen where the worker's endpoints do; its web server, a half's, on loopback.
    assert (env["AGENTLOG_WEB_HOST"], env["AGENTLOG_WEB_TOKEN"]) == ("0.0.0.0", "t0ken")
    assert env[PARENT_FD_ENV] == "9"
    from agentlog.worker.app import build_app

    child = load_settings(home=tmp_path, worker_role="process", web_host="0.0.0.0", web_token="t0ken")
    wiring = build_app(child, web=True, web_loopback=True)
    assert wiring.web_address == ("127.0.0.1", child.web_port)


def test_a_child_stops_when_its_parents_pipe_closes():
    """The watch in the child: end-of-file on the inherited pipe (the parent gone) stops the process."""
    r, w = os.pipe()
    code = (
        "import signal, sys, time\n"
        "from agentlog.worker import halves\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
        "halves.watch_parent()\n"
        "print('watching', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, PARENT_FD_ENV: str(r)},
                             pass_fds=(r,), stdout=subprocess.PIPE, text=True)
    os.close(r)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "watching"
        assert child.poll() is None
        os.close(w)  # what the kernel does when the parent dies
        assert child.wait(timeout=10) == 42
    finally:
        if child.poll() is None:
            child.kill()
