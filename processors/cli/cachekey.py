"""``agentlog cache-key``: the LLM cache key of a request, computed offline.

For a host author checking that their implementation agrees with the store
byte for byte: print the key, and with ``--canonical`` the exact JCS preimage
to diff against theirs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from agentlog.schemas.cachekey import canonical_request, recipe_id
from agentlog.schemas.canonical import loads_strict, sha256_hex
from agentlog.schemas.errors import CacheKeyError, ConfigError


def _request_of(obj: Any) -> Any:
    """Accept the request itself, an ``agent.invocation.started`` payload, or the whole RunEventDoc."""
    if isinstance(obj, dict) and isinstance(obj.get("payload"), dict) and "type" in obj:
        obj = obj["payload"]
    if isinstance(obj, dict) and "messages" not in obj and isinstance(obj.get("request"), dict):
        obj = obj["request"]
    if not isinstance(obj, dict):
        raise CacheKeyError(f"expected a JSON object (an LLM request), got {type(obj).__name__}")
    return obj


def cache_key_command(
    file: str = typer.Argument("-", help="JSON file with the LLM request (or '-' for stdin)"),
    recipe: str = typer.Option("v2", "--recipe", help="v2 (openwop-semantic-request-v2) or v1"),
    canonical: bool = typer.Option(False, "--canonical", help="also print the JCS preimage"),
    as_json: bool = typer.Option(False, "--json", help="print {recipe, key, canonical?} as JSON"),
) -> None:
    """Print the RFC 0041 LLM cache key of a request (also reads an agent.invocation.started doc)."""
    if file == "-":
        data = sys.stdin.buffer.read()
    else:
        path = Path(file)
        if not path.is_file():
            raise ConfigError(f"{file}: no such file; give a JSON file with the LLM request or '-' for stdin")
        data = path.read_bytes()
    full_recipe = recipe_id(recipe)
    preimage = canonical_request(_request_of(loads_strict(data)), full_recipe)
    key = sha256_hex(preimage)
    if as_json:
        out: dict[str, str] = {"recipe": full_recipe, "key": key}
        if canonical:
            out["canonical"] = preimage.decode("utf-8")
        typer.echo(json.dumps(out, ensure_ascii=False))
        return
    typer.echo(key)
    if canonical:
        typer.echo(preimage.decode("utf-8"))


def register(app: typer.Typer) -> None:
    app.command("cache-key")(cache_key_command)
