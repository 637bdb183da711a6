"""The vendored upstream files are the ones SOURCES.md names, byte for byte."""

from __future__ import annotations

from agentlog.schemas.upstream import UPSTREAM_DIR, recorded_sha256, sha256_of


def test_every_vendored_file_is_recorded_with_its_hash():
    recorded = recorded_sha256()
    on_disk = {str(p.relative_to(UPSTREAM_DIR)) for p in UPSTREAM_DIR.rglob("*.json")}
    assert on_disk == set(recorded), "every JSON file under schemas/upstream has a row in SOURCES.md and vice versa"
    for relpath, digest in recorded.items():
        assert sha256_of(relpath) == digest, f"{relpath} differs from its recorded sha256"
