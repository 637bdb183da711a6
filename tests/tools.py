"""External programs some tests drive: Debian packages (skip where missing, fail where CI promised them),
our own CLI in a child process, and a free local port for the servers they start.

Tests never install anything. ``.ci/run`` installs the packages below when their binary is missing and
sets ``AGENTLOG_TEST_REQUIRE_TOOLS=1``, which turns a missing tool into a failure instead of a skip, so
CI cannot quietly skip these tests.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

REQUIRE_TOOLS_ENV = "AGENTLOG_TEST_REQUIRE_TOOLS"

#: binary -> Debian package (keep in step with .ci/run)
PACKAGES = {"kcat": "kcat", "chromium": "chromium"}


def require_tool(binary: str) -> str:
    """The path of ``binary``; skips the test when it is missing (fails under ``AGENTLOG_TEST_REQUIRE_TOOLS``)."""
    path = shutil.which(binary)
    if path:
        return path
    message = f"{binary} is not installed (Debian package {PACKAGES[binary]}; .ci/run installs it)"
    if os.environ.get(REQUIRE_TOOLS_ENV):
        pytest.fail(f"{message}, and {REQUIRE_TOOLS_ENV} is set", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (for a worker's web/OTLP server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1, drawn below the kernel's ephemeral range.

    A broker node binds its ports some seconds after they are found free; a port in the ephemeral
    range can be taken meanwhile by any outgoing connection (the node then dies at start-up), one
    below it only by another listener.
    """
    from agentlog.infra.kafka import local

    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(20_000, max(20_000, ephemeral - count - 1))
        if all(local.port_free(p) for p in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 below {ephemeral}")


def agentlog_cli(settings: Any, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``agentlog <args>`` in a child process configured like ``settings`` (as a user's shell would be)."""
    from agentlog.streams.settings import settings_env

    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "agentlog", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


async def describe_group(settings: Any, group: str) -> tuple[str, list[tuple[str, bool]]] | None:
    """A consumer group as the broker describes it: its state and its members as (member id, has an assignment).

    None when the broker knows no such group (yet).
    """
    from aiokafka.admin import AIOKafkaAdminClient

    from agentlog.streams.security import client_kwargs

    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    (described,) = response.groups  # (error_code, group, state, protocol_type, protocol, members)
    if described[0] != 0:
        return None
    # a member: (member_id, client_id, client_host, metadata, assignment)
    return described[2], [(member[0], bool(member[4])) for member in described[5]]


async def stored_docs(settings: Any, run_id: str) -> list[dict[str, Any]]:
    """``run_id``'s committed docs in their stored form (content sealed): what the hash chain and state hashes cover."""
    from agentlog.streams.reader import read_run

    return [c["doc"] for c in await read_run(settings, run_id, opened=False)]


async def all_committed(settings: Any, runs: dict[str, list[dict[str, Any]]]) -> bool | None:
    """True once every run of ``runs`` has all its docs on the committed log, else None (for ``wait_until``)."""
    from agentlog.streams.reader import read_run

    for run_id, docs in runs.items():
        if len(await read_run(settings, run_id, opened=False)) < len(docs):
            return None
    return True


def http_get(worker: Any, path: str) -> tuple[int, str]:
    """The status and body of ``GET path`` on ``worker``'s web server (an error status is an answer too)."""
    url = f"http://127.0.0.1:{worker.settings.web_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


#: A redaction policy that redacts nothing: for tests of another guarantee (sealing, erasure) whose content is made to
#: look like secrets or personal data (markers that look random, e-mail subject ids) and must read back as sent.
REDACTION_OFF = "[detectors]\n" + "".join(f'{name} = "off"\n' for name in (
    "private_key", "jwt", "api_key", "email", "iban", "card", "ip", "phone", "high_entropy"))


def redaction_off(settings: Any, folder: Any) -> Any:
    """``settings`` with :data:`REDACTION_OFF` as the worker's redaction policy (a file in ``folder``)."""
    path = folder / "redaction-off.toml"
    path.write_text(REDACTION_OFF)
    return settings.replace(redaction_policy=str(path))
