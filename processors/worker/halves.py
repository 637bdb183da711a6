"""``--role all`` as two processes (``AGENTLOG_SINK_PROCESS``): the sink here, the agents in a child.

Why: in one process the agents and the audit sink share one Python thread, and on the
project's 2-core machine that thread is the limit of ingest → queryable (README "Benchmarks":
about 11 s of CPU for 50k events in one thread, against 9.1 s and 2.1 s in two). Two processes use
two cores, as the split deployment (``--role process`` + ``--role sink``) does, behind one command.

Why this way round: the parent runs the ``sink`` role, so it owns the embedded store (its
``flock``, which the kernel releases however the process ends), serves the console, ``/query`` and
``/metrics`` on ``AGENTLOG_WEB_PORT`` and is what ``agentlog query`` finds in the store's owner
file, exactly as an ``all`` worker does. The child runs the ``process`` role, which holds nothing a
restarted parent would wait for: a parent that is SIGKILLed restarts at once, and its orphan child
notices the closed pipe and stops (Kafka moves its partitions as for any member that leaves).

The parent restarts a child that dies (SIGKILL included: its batches in flight are redone by the
group, as for any worker) and stops it when it stops. The child's web server listens on loopback at
``AGENTLOG_WEB_PORT + 1`` (its OTLP receivers on ``AGENTLOG_WEB_HOST``, as any ``process`` worker's); the
parent's ``/metrics`` includes the child's series (scraped every ``SCRAPE_S``), so one scrape still sees the
whole worker.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

from agentlog.metrics import METRICS, Sample, parse_exposition
from agentlog.streams.settings import Settings, settings_env

log = logging.getLogger("agentlog.worker")

#: The pipe the child watches: its end is this file descriptor, named in the child's environment.
PARENT_FD_ENV = "AGENTLOG_INTERNAL_PARENT_FD"
#: How often the parent reads the child's metrics.
SCRAPE_S = 2.0
#: How long a stopping child is given before it is killed.
STOP_GRACE_S = 30.0
_RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)

#: The child is on loopback: no HTTP(S)_PROXY from the environment applies to the scrape.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))
class ProcessHalf:
    """The child running ``agentlog worker --role process``, supervised by the ``sink`` parent."""

    def __init__(self, settings: Settings, *, web: bool = True, loglevel: str = "warning",
                 wait_s: float = 300.0) -> None:
        self.settings = settings
        self.web = web
        self.web_port = settings.web_port + 1
        self.loglevel = loglevel
        self.wait_s = wait_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._samples: list[Sample] = []
        self._stopping = threading.Event()
        self._pipe_w: int | None = None

    # -- the parent's side ---------------------------------------------------------------------

    def start(self) -> ProcessHalf:
        """Start the child, a thread that restarts it when it dies, and (with the web on) its metrics scrape."""
        self._spawn()
        threading.Thread(target=self._supervise, name="agentlog-process-half", daemon=True).start()
        if self.web:
            METRICS.add_collector(self.samples)
            threading.Thread(target=self._scrape, name="agentlog-process-half-metrics", daemon=True).start()
        return self

    def stop(self) -> None:
        """SIGTERM the child and wait for it (killed after :data:`STOP_GRACE_S`)."""
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_GRACE_S)
        if self._pipe_w is not None:
            os.close(self._pipe_w)
            self._pipe_w = None

    def samples(self) -> Iterator[Sample]:
        """The child's metric series (last scrape), and how often it was restarted."""
        yield from self._samples
        yield ("agentlog_worker_child_restarts_total", {}, float(self.restarts))

    def args(self) -> list[str]:
        web = ["--web", "--web-port", str(self.web_port)] if self.web else ["--no-web"]
        return [sys.executable, "-m", "agentlog", "worker", "--role", "process", *web,
                "--loglevel", self.loglevel, "--wait", str(self.wait_s)]

    def env(self, parent_fd: int) -> dict[str, str]:
        # web_host stays: the child's OTLP receivers listen there (its own web server is on loopback, because
        # it is a half: agentlog.worker.app.run_worker).
        child = self.settings.replace(worker_role="process", sink_process=False)
        return {**os.environ, **settings_env(child), PARENT_FD_ENV: str(parent_fd)}

    def _spawn(self) -> None:
        if self._pipe_w is not None:
            os.close(self._pipe_w)
        r, w = os.pipe()
        try:  # the child's output goes where ours goes
            self.proc = subprocess.Popen(self.args(), env=self.env(r), pass_fds=(r,), stdin=subprocess.DEVNULL)
        finally:
            os.close(r)
        self._pipe_w = w
        log.info("process half started (pid %d)", self.proc.pid)

    def _supervise(self) -> None:
        attempt = -1  # quick deaths in a row, less one: the first restart waits the shortest backoff
        while not self._stopping.is_set():
            proc = self.proc
            assert proc is not None
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            attempt = 0 if time.monotonic() - started > 60 else min(attempt + 1, len(_RESTART_BACKOFF_S) - 1)
            delay = _RESTART_BACKOFF_S[attempt]
            log.error("the worker's process half (pid %d) exited with %s; starting it again in %g s",
                      proc.pid, code, delay)
            if self._stopping.wait(delay):
                return
            self.restarts += 1
            self._spawn()

    def _scrape(self) -> None:
        url = f"http://127.0.0.1:{self.web_port}/metrics"
        headers = {"Authorization": f"Bearer {self.settings.web_token}"} if self.settings.web_token else {}
        while not self._stopping.wait(SCRAPE_S):
            try:
                with _LOCAL.open(urllib.request.Request(url, headers=headers), timeout=5) as answer:
                    self._samples = parse_exposition(answer.read().decode())
            except OSError:
                pass  # starting, restarting or stopping: keep the last series


# -- the child's side ---------------------------------------------------------------------------


def watch_parent() -> bool:
    """In the child: stop (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`) once the parent's pipe closes.

    The pipe's write end lives only in the parent, so the read returns end-of-file when the parent
    ends, however it ends (a SIGKILL included). Nothing happens when the child was not started by
    :class:`ProcessHalf`. Returns whether it was (this process is a half).
    """
    raw = os.environ.pop(PARENT_FD_ENV, None)
    if raw is None:
        return False
    fd = int(raw)

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        log.warning("the worker's sink process (the parent) ended; stopping")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)  # a graceful stop that hangs: as for any worker, a crash is safe

    threading.Thread(target=watch, name="agentlog-parent-watch", daemon=True).start()
    return True
