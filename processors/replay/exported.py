"""Runs exported as JSON lines (``agentlog export``), read back for an offline comparison or verification.

``agentlog compare`` judges a replay from two such files with the same engine the worker runs,
so an operator can re-check a verdict — or a test can pin one — without a broker; ``agentlog
verify`` checks one against the run's signed checkpoints, which travel in a file of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentlog.schemas.canonical import loads_strict
from agentlog.schemas.errors import AgentlogError, ReplayError
from agentlog.schemas.records import Checkpoint

__all__ = ["export_lines", "json_lines", "read_jsonl"]

_CHECKPOINT_FIELDS = frozenset(Checkpoint.__annotations__)


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


def _is_checkpoint(value: dict[str, Any]) -> bool:
    """A signed checkpoint, bare or as ``{"checkpoint": {…}}``: never a RunEventDoc or a CommittedEvent."""
    if len(value) == 1 and isinstance(value.get("checkpoint"), dict):
        return True
    return value.keys() == _CHECKPOINT_FIELDS


def export_lines(path: Path, *, code: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of every line of an export: a RunEventDoc, or a CommittedEvent (``doc``).

    A signed checkpoint is refused rather than skipped: an export holds run events only, and a
    checkpoint read as an event, or dropped unseen, would make a verification say the wrong thing.

    Raises:
        ReplayError (with ``code``): the file cannot be read, a line is not a JSON object, or a
            line is a signed checkpoint.
    """
    for number, value in json_lines(path, code=code):
        yield number, export_object(path, number, value, code=code)


def export_object(path: Path, number: int, value: Any, *, code: str | None = None) -> dict[str, Any]:
    """Line ``number`` of an export, parsed: a RunEventDoc or a CommittedEvent (:func:`export_lines`' check).

    Raises:
        ReplayError (with ``code``): the line is not a JSON object, or it is a signed checkpoint.
    """
    if not isinstance(value, dict):
        raise ReplayError(f"{path}:{number}: expected a JSON object (a RunEventDoc)", code=code)
    if _is_checkpoint(value):
        raise ReplayError(
            f"{path}:{number}: a signed checkpoint, not a RunEventDoc; an export holds run events only. "
            "Put the checkpoints in a file of their own, one per line (`agentlog export --checkpoints PATH` "
            "writes one), and give it to `agentlog verify --checkpoints PATH`", code=code)
    return value


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """RunEventDocs from an export: one per line, bare or wrapped as a CommittedEvent (``doc``).

    Raises:
        ReplayError: the file cannot be read, a line is not a JSON object, or a line is a signed checkpoint.
    """
    docs: list[dict[str, Any]] = []
    for _, value in export_lines(path):
        if isinstance(value.get("doc"), dict) and "hash" in value:
            value = value["doc"]
        docs.append(value)
    return docs
