"""Run ``agentlog worker`` as a real child process, so tests can SIGKILL it."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentlog.streams.settings import Settings, settings_env

#: Module constants a worker child runs with, as JSON ``{"package.module:NAME": value}``.
CONSTANTS_ENV = "AGENTLOG_TEST_CONSTANTS"
_REPO = Path(__file__).resolve().parents[3]
#: Holds the ``sitecustomize`` that applies them (the fault-injecting ones apply them too).
_CONSTANTS_SITE = Path(__file__).resolve().parent / "constants_site"


def apply_constants() -> None:
    """Set the module constants named in ``$AGENTLOG_TEST_CONSTANTS`` (in a worker child, before it starts).

    A tuning value is a module constant, not a setting; a test that needs another value (a snapshot every
    few events, a short stall check) gives it to its worker child this way. A name the module lacks fails.
    """
    raw = os.environ.get(CONSTANTS_ENV)
    if not raw:
        return
    for target, value in json.loads(raw).items():
        module_name, name = target.split(":")
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            raise AttributeError(f"{CONSTANTS_ENV}: {module_name} has no constant {name}")
        setattr(module, name, value)


class WorkerProcess:
    def __init__(self, settings: Settings, *, sink: bool = False, web: bool = False, log_name: str = "worker",
                 role: str | None = None, env: dict[str, str] | None = None,
                 constants: dict[str, object] | None = None) -> None:
        self.settings = settings
        #: extra environment for the child (e.g. a fault-injecting ``PYTHONPATH``)
        self.env = env or {}
        #: module constants the child runs with (:func:`apply_constants`)
        self.constants = constants or {}
        self.sink = sink
        #: ``agentlog worker --role``; None: ``all`` with ``sink``, else ``process``
        self.role = role or ("all" if sink else "process")
        self.web = web
        self.log_path = Path(settings.home) / f"{log_name}.log"
        self.state_dir = Path(settings.home) / f"state-{log_name}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> WorkerProcess:
        Path(self.settings.home).mkdir(parents=True, exist_ok=True)
        # Each worker its own state directory, kept across its restarts (as on its own machine).
        state = {"AGENTLOG_STATE_DIR": str(self.state_dir)} if not self.settings.state_dir else {}
        env = {**os.environ, **settings_env(self.settings), "PYTHONUNBUFFERED": "1", **state, **self.env}
        if self.constants:
            env[CONSTANTS_ENV] = json.dumps(self.constants)
            if "PYTHONPATH" not in self.env:  # a fault-injecting sitecustomize applies them itself
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(_REPO), str(_CONSTANTS_SITE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        args = [sys.executable, "-m", "agentlog", "worker", "--loglevel", "warning",
                "--role", self.role, "--web" if self.web else "--no-web"]
        self.starts += 1
        with open(self.log_path, "a") as log:  # the child keeps its own copy of the descriptor
            log.write(f"\n===== start #{self.starts} at {time.time():.3f}\n")
            log.flush()
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=Path(__file__).resolve().parents[3])
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


async def wait_until(predicate, *, timeout: float = 120.0, interval: float = 0.5, what: str = "condition", worker=None):
    """Poll an async predicate until it returns a truthy value; fail with the worker log on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        if worker is not None and not worker.alive():
            raise AssertionError(f"worker died while waiting for {what}:\n{worker.log_tail()}")
        await asyncio.sleep(interval)
    tail = worker.log_tail() if worker is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last={last!r})\n{tail}")
