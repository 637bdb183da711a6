"""The unit tier never needs a broker; these guards make a regression loud instead of slow.

- A unit test that requests the ``kafka_bootstrap`` fixture (directly or through ``settings``)
  fails in setup, before the session broker would be started.
- A unit test marked ``kafka`` or ``cluster`` fails the same way: it belongs in ``tests/integration``.
- While a unit test runs (setup, call, teardown), a socket connect to a Kafka port (the test
  stack's, the local stack's default, or any port in ``AGENTLOG_KAFKA_BOOTSTRAP``) is refused with
  :class:`BrokerContact`, and the test fails even if a client swallowed that error and retried.
  Child processes a test starts are not covered.

These hooks run only for items under ``tests/unit`` (pytest resolves ``pytest_runtest_*`` hooks by
the item's path), so an integration test in the same session is untouched.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import TEST_STACK_PORT

_LOCAL_STACK_PORT = 19092  # agentlog.streams.settings' default bootstrap (`agentlog infra up`)


class BrokerContact(RuntimeError):
    """A unit test tried to reach a Kafka broker. Not an OSError, so clients do not treat it as a retryable
    network error."""


def _kafka_ports() -> frozenset[int]:
    ports = {TEST_STACK_PORT, _LOCAL_STACK_PORT}
    for server in os.environ.get("AGENTLOG_KAFKA_BOOTSTRAP", "").split(","):
        _, _, port = server.strip().rpartition(":")
        if port.isdigit():
            ports.add(int(port))
    return frozenset(ports)


@contextmanager
def _no_broker_sockets(item: pytest.Item) -> Iterator[None]:
    ports = _kafka_ports()
    contacts: list[object] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: object) -> None:
        if isinstance(address, tuple) and len(address) >= 2 and address[1] in ports:
            contacts.append(address)
            raise BrokerContact(f"{item.nodeid} connected to {address!r}, a Kafka port: unit tests are broker-free")

    def connect(self: socket.socket, address: object) -> None:
        check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        check(address)
        return real_connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex
    if contacts:
        pytest.fail(f"{item.nodeid} tried to reach a Kafka broker at {contacts[0]!r} "
                    f"({len(contacts)} attempt(s)); unit tests must not need one - move it to tests/integration "
                    "and mark it kafka", pytrace=False)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    # The innermost wrapper (other plugins' wrappers, e.g. logging, are already set up), and before
    # pytest's own setup creates any fixture: the session broker is never started for a unit test.
    if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
        pytest.fail(f"{item.nodeid} requests the kafka_bootstrap fixture (directly or via `settings`): "
                    "unit tests are broker-free - build settings with agentlog.streams.settings.load_settings, "
                    "or move the test to tests/integration and mark it kafka", pytrace=False)
    for name in ("kafka", "cluster"):
        if item.get_closest_marker(name):
            pytest.fail(f"{item.nodeid} is marked {name} but lives in tests/unit: move it to tests/integration",
                        pytrace=False)
    with _no_broker_sockets(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _no_broker_sockets(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _no_broker_sockets(item):
        return (yield)
