"""The worker's signing key on disk: made on first start with mode 0600, reused after."""

from __future__ import annotations

import stat

import pytest

from agentlog.core.checkpoint import CheckpointKeyError, key_id, load_public_key, public_key_path
from agentlog.streams.settings import Settings
from agentlog.worker.signing import load_or_create_signing_key


def test_first_start_creates_a_private_key_0600_and_its_public_key_beside_it(tmp_path):
    settings = Settings(home=tmp_path)
    first = load_or_create_signing_key(settings)
    assert first.path == tmp_path / "keys" / "ed25519.pem"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.path.parent.stat().st_mode) == 0o700
    public = public_key_path(first.path)
    assert public.name == "ed25519.pub.pem"
    assert key_id(load_public_key(public.read_bytes())) == first.key_id == key_id(first.key)
    again = load_or_create_signing_key(settings)
    assert again.key_id == first.key_id  # reused, not replaced


def test_a_configured_key_file_is_used_and_a_bad_one_refused(tmp_path):
    path = tmp_path / "elsewhere" / "worker.pem"
    made = load_or_create_signing_key(Settings(home=tmp_path, signing_key_file=str(path)))
    assert made.path == path and (tmp_path / "elsewhere" / "worker.pub.pem").exists()
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    with pytest.raises(CheckpointKeyError) as e:
        load_or_create_signing_key(Settings(home=tmp_path, signing_key_file=str(bad)))
    assert e.value.code == "checkpoint_key_invalid" and str(bad) in str(e.value)
