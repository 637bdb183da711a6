"""Data keys per run, wrapped by a KEK; the runs an erasure reaches."""

from __future__ import annotations

import os

import pytest

from agentlog.core.keyring import KeyRecord, KeyringError, LocalKek, mint, runs_to_erase, unwrap
from agentlog.core.sealing import open_event, seal_event


def _record(run: str, subject: str | None = None, parent: str | None = None) -> KeyRecord:
    return KeyRecord(run_id=run, key_id="k", subject=subject or run, parent_run_id=parent, kek_id="x", wrapped=b"")


def test_a_minted_key_unwraps_from_its_record_and_opens_what_it_sealed():
    kek = LocalKek(os.urandom(32))
    key, record = mint("run-1", "alice", None, kek)
    again = unwrap(KeyRecord.from_value(record.to_value()), {kek.kek_id: kek})
    assert again == key
    doc = {"eventId": "e", "runId": "run-1", "type": "variable.changed", "payload": {"name": "n", "value": "v"},
           "timestamp": "t", "sequence": 1}
    assert open_event(seal_event(doc, key), {again.key_id: again}.get) == doc


def test_the_record_holds_neither_the_key_nor_the_subject_in_the_clear():
    kek = LocalKek(os.urandom(32))
    key, record = mint("run-1", "alice@example.com", "parent-0", kek)
    assert key.secret not in record.to_value()
    assert b"alice" not in record.to_value() and b"parent-0" in record.to_value()
    assert record.subject == kek.tag("alice@example.com") != LocalKek(os.urandom(32)).tag("alice@example.com")


def test_without_a_subject_the_run_is_its_own():
    kek = LocalKek(os.urandom(32))
    _, record = mint("run-9", None, None, kek)
    assert record.subject == kek.tag("run-9")


def test_an_erased_marker_keeps_everything_but_the_key():
    kek = LocalKek(os.urandom(32))
    _, record = mint("run-1", "alice", "parent-0", kek, run_class="ci")
    assert KeyRecord.from_value(record.to_value()) == record
    marker = KeyRecord.from_value(record.erase(1234).to_value())
    assert marker.erased and marker.erased_at_ms == 1234 and marker.wrapped == b""
    assert (marker.run_id, marker.key_id, marker.subject, marker.parent_run_id, marker.run_class) == (
        record.run_id, record.key_id, record.subject, record.parent_run_id, "ci")
    assert record.wrapped not in record.erase(1).to_value()
    with pytest.raises(KeyringError, match="erased"):
        unwrap(marker, {kek.kek_id: kek})


def test_a_record_under_an_unconfigured_kek_is_a_clear_error():
    old, new = LocalKek(os.urandom(32)), LocalKek(os.urandom(32))
    _, record = mint("run-1", "alice", None, old)
    with pytest.raises(KeyringError, match=f"wrapped by {old.kek_id}, which is not configured"):
        unwrap(record, {new.kek_id: new})
    assert unwrap(record, {new.kek_id: new, old.kek_id: old})  # a rotation keeps the old KEK readable


def test_a_wrapped_key_moved_to_another_run_does_not_unwrap():
    kek = LocalKek(os.urandom(32))
    _, record = mint("run-1", "alice", None, kek)
    moved = KeyRecord(run_id="run-2", key_id=record.key_id, subject="alice", parent_run_id=None,
                      kek_id=record.kek_id, wrapped=record.wrapped)
    with pytest.raises(KeyringError, match="altered"):
        unwrap(moved, {kek.kek_id: kek})


def test_a_kek_is_32_bytes():
    with pytest.raises(KeyringError):
        LocalKek(b"short")


def test_an_unparsable_record_is_a_clear_error():
    with pytest.raises(KeyringError, match="does not parse"):
        KeyRecord.from_value(b'{"runId": "r"}')


def test_erasing_a_subject_reaches_its_runs_and_their_descendants_in_any_order():
    records = [
        _record("grandchild", parent="child"),          # arrives before its parent's record
        _record("r1", "alice"),
        _record("child", parent="r1"),                   # inherits alice through the link
        _record("r2", "alice"),
        _record("b1", "bob"),
        _record("b1-child", parent="b1"),
    ]
    assert runs_to_erase(records, subject={"alice"}) == ["child", "grandchild", "r1", "r2"]
    assert runs_to_erase(records, subject={"bob", "old-kek-tag"}) == ["b1", "b1-child"]
    assert runs_to_erase(records, run="child") == ["child", "grandchild"]
    assert runs_to_erase(records, run=["child", "b1"]) == ["b1", "b1-child", "child", "grandchild"]
    assert runs_to_erase(records, subject={"nobody"}) == []


def test_an_erasure_names_a_subject_or_a_run():
    with pytest.raises(ValueError):
        runs_to_erase([], subject="a", run="b")
    with pytest.raises(ValueError):
        runs_to_erase([])
