"""Upstream data files (OpenWOP schema and vectors, AOS fixture), with their sources and hashes in SOURCES.md."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["UPSTREAM_DIR", "recorded_sha256", "upstream_file"]

UPSTREAM_DIR = Path(__file__).resolve().parent


def upstream_file(relpath: str) -> Path:
    """The path of an upstream file, e.g. ``"openwop/conformance/vectors/semantic-request-digest-v2.json"``."""
    path = UPSTREAM_DIR / relpath
    if not path.is_file():
        raise FileNotFoundError(f"no upstream file {relpath} in {UPSTREAM_DIR} (see SOURCES.md there)")
    return path


def recorded_sha256() -> dict[str, str]:
    """``relpath -> sha256`` as recorded in SOURCES.md."""
    text = (UPSTREAM_DIR / "SOURCES.md").read_text("utf-8")
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \|[^|]*\| `([0-9a-f]{64})` \|$", text, re.M)}


def sha256_of(relpath: str) -> str:
    return hashlib.sha256(upstream_file(relpath).read_bytes()).hexdigest()
