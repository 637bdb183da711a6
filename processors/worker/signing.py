"""The worker's checkpoint signing key on disk: read it, or make it on first start.

The key signs checkpoints (:mod:`agentlog.core.checkpoint`); whoever holds it can vouch for a
forged history, so it is created with mode 0600 (in a 0700 directory) and never logged. The
public half is written beside it as ``ed25519.pub.pem`` for ``agentlog verify --public-key``.
Rotation: point ``AGENTLOG_SIGNING_KEY_FILE`` at a new key (or move the old one away and
restart); checkpoints name their key id, so verifiers keep every public key ever used.
"""

from __future__ import annotations

import logging
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentlog.core.checkpoint import (
    CheckpointKeyError,
    generate_private_key,
    key_id,
    load_private_key,
    private_key_pem,
    public_key_path,
    public_key_pem,
)
from agentlog.streams.settings import Settings, create_private_file

__all__ = ["SigningKey", "load_or_create_signing_key", "public_key_path"]

log = logging.getLogger("agentlog.signing")


@dataclass(frozen=True)
class SigningKey:
    """The private key and its id (computed once: the sequencer signs with it per checkpoint)."""

    key: Ed25519PrivateKey
    key_id: str
    path: Path


def load_or_create_signing_key(settings: Settings) -> SigningKey:
    """The signing key at ``settings.signing_key_path``, generated there first if missing.

    Creation is exclusive (``O_EXCL``), so two workers starting on one home at once end up with
    the same key. The public key file is (re)written whenever it is missing.

    Raises:
        CheckpointKeyError: the file exists but is not an Ed25519 PKCS#8 PEM key, or cannot be
            read or written (the message names the path).
    """
    path = settings.signing_key_path
    try:
        if not path.exists():
            key = generate_private_key()
            if create_private_file(path, private_key_pem(key)):  # else another worker made it a moment ago
                log.warning("created the checkpoint signing key %s (key id %s)", path, key_id(key))
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("signing key %s is readable by others (mode %o); chmod 600 it", path, mode)
        key = load_private_key(path.read_bytes(), where=str(path))
        public = public_key_path(path)
        if not public.exists():
            public.write_bytes(public_key_pem(key.public_key()))
    except OSError as e:
        raise CheckpointKeyError(f"cannot read or create the signing key {path}: {e}; "
                                 "set AGENTLOG_SIGNING_KEY_FILE to a writable path") from e
    return SigningKey(key=key, key_id=key_id(key), path=path)
