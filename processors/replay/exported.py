"""Runs exported as JSON lines (``agentlog export``), read back for an offline comparison.

``agentlog compare`` judges a replay from two such files with the same engine the worker runs,
so an operator can re-check a verdict — or a test can pin one — without a broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schemas.canonical import loads_strict
from schemas.errors import AgentlogError, ReplayError

__all__ = ["json_lines", "read_jsonl"]


def json_lines(path: Path, *, code: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of a JSONL file, parsed strictly.

    Raises:
        ReplayError (with ``code``, else ReplayError's own): the file cannot be read or a line is no JSON.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReplayError(f"cannot read {path}: {e}", code=code) from e
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, loads_strict(line)
        except AgentlogError as e:
            raise ReplayError(f"{path}:{number}: {e}", code=code) from e


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """RunEventDocs from a JSONL file: one per line, bare or wrapped as a CommittedEvent (``doc``).

    Checkpoint lines (``{"checkpoint": …}``, which ``agentlog export`` writes after a run's docs for
    ``agentlog verify``) are skipped: they are no events.

    Raises:
        ReplayError: the file cannot be read, or a line is not a JSON object.
    """
    docs: list[dict[str, Any]] = []
    for number, value in json_lines(path):
        if isinstance(value, dict) and isinstance(value.get("checkpoint"), dict) and len(value) == 1:
            continue
        if isinstance(value, dict) and isinstance(value.get("doc"), dict) and "hash" in value:
            value = value["doc"]
        if not isinstance(value, dict):
            raise ReplayError(f"{path}:{number}: expected a JSON object (a RunEventDoc)")
        docs.append(value)
    return docs
