"""Key-encryption keys from settings: made on first use, a list for rotation, or the environment; a Keyring's rules."""

from __future__ import annotations

import base64
import os

import pytest

from agentlog.core.keyring import KeyringError, LocalKek
from agentlog.core.sealing import seal_event
from agentlog.streams.keyring import Keyring, load_wrappers
from agentlog.streams.settings import Settings


def test_the_first_use_makes_a_private_kek_and_later_uses_read_it(tmp_path):
    current, wrappers = load_wrappers(Settings(home=tmp_path))
    path = tmp_path / "keys" / "kek"
    assert path.stat().st_mode & 0o777 == 0o600 and (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    again, _ = load_wrappers(Settings(home=tmp_path))
    assert again.kek_id == current.kek_id and list(wrappers) == [current.kek_id]


def test_a_rotation_wraps_with_the_first_and_opens_with_all(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for p in (old, new):
        p.write_bytes(base64.b64encode(os.urandom(32)))
    current, wrappers = load_wrappers(Settings(home=tmp_path, kek_file=f"{new}, {old}"))
    assert current.kek_id == LocalKek(base64.b64decode(new.read_bytes())).kek_id and len(wrappers) == 2
    with pytest.raises(KeyringError, match="cannot read the key-encryption key"):  # an old KEK is never made up
        load_wrappers(Settings(home=tmp_path, kek_file=f"{new},{tmp_path / 'missing'}"))


def test_the_environment_kek_is_never_printed(tmp_path):
    secret = base64.b64encode(os.urandom(32)).decode()
    settings = Settings(home=tmp_path, kek=secret)
    assert secret not in repr(settings)
    current, _ = load_wrappers(settings)
    assert not (tmp_path / "keys" / "kek").exists() and current.kek_id.startswith("local-")


def test_an_erased_run_stays_erased_and_its_tokens_read_erased(tmp_path):
    kek = LocalKek(os.urandom(32))
    keyring = Keyring(kek, {kek.kek_id: kek})
    key, record = keyring.mint("r1", "alice", None)
    doc = {"eventId": "e", "runId": "r1", "type": "variable.changed", "payload": {"name": "n", "value": "secret"},
           "timestamp": "t", "sequence": 0}
    sealed = seal_event(doc, key)
    assert keyring.open(sealed) == doc
    keyring.apply(record.erase(1).to_value())
    keyring.apply(record.to_value())  # the key record again (a replayed topic): the marker wins
    assert keyring.erased("r1") and keyring.data_key("r1") is None
    assert keyring.open(sealed)["payload"]["value"] == "[erased]"
    with pytest.raises(KeyringError, match="never recorded"):
        Keyring(kek, {kek.kek_id: kek}).open(sealed)


def _keyring(tmp_path) -> Keyring:
    return Keyring.from_settings(Settings(home=tmp_path))


def test_a_forgotten_key_is_gone_and_the_owners_key_stays(tmp_path):
    ours, theirs = _keyring(tmp_path), _keyring(tmp_path)
    _, minted = ours.mint("run-1", None, None)
    ours.forget(minted)  # its batch was fenced: the record never committed
    assert ours.record("run-1") is None and ours.data_key("run-1") is None
    owners_key, owners = theirs.mint("run-1", None, None)
    ours.apply(owners.to_value())  # the owner's record, from the topic
    ours.forget(minted)  # a late forget leaves the owner's key alone
    assert ours.record("run-1") == owners and ours.data_key("run-1") == owners_key


def test_reached_waits_for_the_follower_to_read_past_every_end(tmp_path):
    import asyncio

    keyring = _keyring(tmp_path)

    async def scenario() -> list[str]:
        seen: list[str] = []

        async def wait() -> None:
            await keyring.reached({0: 5, 1: 3})
            seen.append("reached")

        waiter = asyncio.create_task(wait())
        keyring.advanced(0, 5)
        await asyncio.sleep(0)
        seen.append("after partition 0")
        keyring.advanced(1, 2)
        await asyncio.sleep(0)
        seen.append("after partition 1 short of its end")
        keyring.advanced(1, 4)
        await asyncio.wait_for(waiter, 1)
        return seen

    assert asyncio.run(scenario()) == ["after partition 0", "after partition 1 short of its end", "reached"]


def test_reached_is_refused_once_the_follower_stopped(tmp_path):
    import asyncio

    keyring = _keyring(tmp_path)

    async def scenario() -> None:
        waiter = asyncio.create_task(keyring.reached({0: 5}))
        await asyncio.sleep(0)
        keyring.unfollowed()  # the worker is stopping: a rebalance waiting here must not hold its stop forever
        with pytest.raises(KeyringError, match="follower stopped"):
            await asyncio.wait_for(waiter, 1)
        await keyring.reached({})  # nothing asked for: nothing to wait for

    asyncio.run(scenario())
