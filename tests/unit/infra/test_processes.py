"""How the local stack decides a broker process is alive: no JVM, no broker, real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from agentlog.infra.kafka import local


def test_a_running_child_of_ours_is_alive_whatever_its_cmdline_says(tmp_path: Path) -> None:
    # A launched JVM's /proc cmdline can read empty while the launcher exec's; this child's
    # cmdline never names the properties file, which is the same situation for the check.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    local._children[child.pid] = child
    try:
        assert local._pid_alive(child.pid, tmp_path / "node-0.properties")
    finally:
        child.kill()
        child.wait()
    assert not local._pid_alive(child.pid, tmp_path / "node-0.properties")
    assert local._exit_status.get(child.pid) == child.returncode


def test_a_stranger_process_is_not_taken_for_a_broker(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:  # not in _children: the cmdline must name the properties file (pid-reuse guard)
        # A process still exec-ing shows an empty cmdline, which counts as alive on purpose (see
        # _pid_alive); wait until this one shows its arguments, as a settled stranger would.
        cmdline = Path(f"/proc/{stranger.pid}/cmdline")
        deadline = time.monotonic() + 30
        while cmdline.exists() and b"sleep" not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not local._pid_alive(stranger.pid, tmp_path / "node-0.properties")
    finally:
        stranger.kill()
        stranger.wait()
