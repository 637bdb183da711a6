"""A Keyring's stores: the same rules over dicts and over RocksDB, and the worker's store bounded in memory."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc

import pytest

from agentlog.core.keyring import KeyringError, LocalKek
from agentlog.core.sealing import seal_event
from agentlog.streams.keyring import Keyring, KeyStore, MemoryKeyStore, RocksKeyStore

KEK = LocalKek(os.urandom(32))


def _store(kind: str, tmp_path, cached: int = 65536) -> KeyStore:
    return MemoryKeyStore() if kind == "memory" else RocksKeyStore(tmp_path, cached=cached)


def _doc(run_id: str) -> dict:
    return {"eventId": "e", "runId": run_id, "type": "variable.changed", "payload": {"name": "n", "value": "v"},
            "timestamp": "t", "sequence": 0}


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_both_stores_keep_the_same_rules(kind, tmp_path):
    keyring = Keyring(KEK, {KEK.kek_id: KEK}, store=_store(kind, tmp_path, cached=2), cached_keys=2)
    keys = {r: keyring.mint(r, f"subject-{r}", "r0" if r != "r0" else None) for r in ("r0", "r1", "r2", "r3")}
    sealed = {r: seal_event(_doc(r), key) for r, (key, _) in keys.items()}
    assert len(keyring) == 4 and sorted(r.run_id for r in keyring.records()) == ["r0", "r1", "r2", "r3"]
    # Past both caches (two entries each): every run's record and key still come back, from the store.
    assert all(keyring.open(sealed[r]) == _doc(r) for r in keys)
    assert keyring.record("r1") == keys["r1"][1] and keyring.record("nope") is None

    _, r1 = keys["r1"]
    keyring.apply(r1.erase(5).to_value())  # an erasure, then the key record again (a replayed topic)
    keyring.apply(r1.to_value())
    assert keyring.erased("r1") and keyring.data_key("r1") is None
    assert keyring.open(sealed["r1"])["payload"]["value"] == "[erased]"

    _, r2 = keys["r2"]
    keyring.forget(r2)  # minted in a batch that was fenced
    assert keyring.record("r2") is None and len(keyring) == 3
    with pytest.raises(KeyringError, match="never recorded"):
        keyring.open(sealed["r2"])

    again, r3 = keyring.mint("r3", None, None)  # a run re-keyed: its latest record names the new key
    assert keyring.data_key("r3") == again and keyring.record("r3") == r3 and len(keyring) == 3
    assert keyring.open(seal_event(_doc("r3"), again)) == _doc("r3") and keyring.run_class("r0") is None


def test_the_rocks_store_holds_every_run_in_bounded_python_memory(tmp_path):
    """Minting past the caches grows the Python heap by next to nothing on RocksDB, and per run in dicts."""

    def growth(store: KeyStore, prefix: str) -> int:
        keyring = Keyring(KEK, {KEK.kek_id: KEK}, store=store, cached_keys=500)
        tracemalloc.start()
        try:
            for i in range(1_000):  # fill the caches first
                keyring.mint(f"{prefix}-warm-{i}", None, None)
            gc.collect()
            warm = tracemalloc.get_traced_memory()[0]
            for i in range(3_000):
                keyring.mint(f"{prefix}-{i}", None, None)
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - warm
        finally:
            tracemalloc.stop()

    in_dicts = growth(MemoryKeyStore(), "m")
    in_rocks = growth(RocksKeyStore(tmp_path, cached=500), "r")
    assert in_dicts > 3_000 * 300  # several hundred bytes a run, for as long as the worker runs
    assert in_rocks < in_dicts / 10


def test_a_store_removes_its_copy_at_close_and_the_copies_of_processes_gone(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    orphan = tmp_path / f"keyring-{dead}-abc"
    live = tmp_path / f"keyring-{os.getppid()}-abc"
    for path in (orphan, live):
        path.mkdir()
    store = RocksKeyStore(tmp_path)
    assert not orphan.exists() and live.exists() and store.path.exists()
    store.close()
    store.close()  # again, at exit
    assert not store.path.exists()
