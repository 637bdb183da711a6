"""The deployment's redactor: the policy file and the hash salt a :class:`~agentlog.core.redaction.Redactor` is built
from (``AGENTLOG_REDACTION_POLICY``, ``AGENTLOG_REDACTION_SALT`` / ``AGENTLOG_REDACTION_SALT_FILE``).

The sequencer applies it to every event it commits (:mod:`agentlog.worker.sequencer`); replay applies the same one
to a replay's events before comparing them with a redacted recording (:mod:`agentlog.replay.regression`). Without a
policy file the default policy applies: every built-in detector masks every content member.

The salt keys the ``hash`` action: one per deployment, kept like the key-encryption key (a private file under
``$AGENTLOG_HOME/keys/``, made on first use by the worker), since a digest under a known salt can be reversed by
hashing guesses. It is read only when the policy hashes.
"""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

from agentlog.core.redaction import DEFAULT_POLICY, Policy, PolicyError, Redactor, parse_policy
from agentlog.streams.settings import Settings, create_private_file

__all__ = ["load_policy", "load_redactor", "salt_path"]

log = logging.getLogger("agentlog.redaction")


def load_policy(settings: Settings) -> Policy:
    """The policy for ``settings.topic_prefix``: the file's section for it, else its top level; the default policy
    without a file.

    Raises:
        PolicyError: the file cannot be read, or is not a valid policy (the message names the file and the line).
    """
    if not settings.redaction_policy:
        return DEFAULT_POLICY
    path = Path(settings.redaction_policy).expanduser()
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"cannot read the redaction policy (AGENTLOG_REDACTION_POLICY): {e}", source=str(path),
                          code="redaction_policy_unreadable") from e
    return parse_policy(text, source=str(path)).for_topic_prefix(settings.topic_prefix)


def salt_path(settings: Settings) -> Path:
    """The salt file: ``redaction_salt_file`` or ``$AGENTLOG_HOME/keys/redaction-salt``."""
    return Path(settings.redaction_salt_file).expanduser() if settings.redaction_salt_file else (
        settings.home / "keys" / "redaction-salt")


def _salt(settings: Settings, *, create: bool) -> bytes:
    if settings.redaction_salt:
        return settings.redaction_salt.encode("utf-8")
    path = salt_path(settings)
    try:
        if create and not path.exists() and create_private_file(path, base64.b64encode(os.urandom(32)) + b"\n"):
            log.warning("created the redaction salt %s: hashed values stay joinable only under it; back it up", path)
        salt = path.read_bytes().strip()
    except FileNotFoundError as e:
        raise PolicyError(f"the policy hashes values and there is no salt at {path}: start the worker once (it makes "
                          "one), or set AGENTLOG_REDACTION_SALT_FILE / AGENTLOG_REDACTION_SALT to the deployment's",
                          source=settings.redaction_policy or "policy", code="redaction_salt_missing") from e
    except OSError as e:
        raise PolicyError(f"cannot read the redaction salt {path}: {e}", source=settings.redaction_policy or "policy",
                          code="redaction_salt_missing") from e
    if not salt:
        raise PolicyError(f"the redaction salt {path} is empty", source=settings.redaction_policy or "policy",
                          code="redaction_salt_missing")
    return salt


def load_redactor(settings: Settings, *, create_salt: bool = False) -> Redactor:
    """The deployment's redactor; ``create_salt``: make the salt file if the policy hashes and there is none (the
    worker does; a reader must use the deployment's, never a new one).

    Raises:
        PolicyError: a bad policy file, or a policy that hashes without a salt.
    """
    policy = load_policy(settings)
    return Redactor(policy, salt=_salt(settings, create=create_salt) if policy.hashes else b"")
