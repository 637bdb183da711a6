"""``agentlog cache-key`` through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.schemas.errors import CacheKeyError
from agentlog.schemas.upstream import upstream_file

VECTORS = json.loads(upstream_file("openwop/conformance/vectors/semantic-request-digest-v2.json").read_text())
MINIMAL = next(v for v in VECTORS["vectors"] if v["id"] == "minimal")
runner = CliRunner()


def test_key_from_stdin():
    result = runner.invoke(app, ["cache-key"], input=json.dumps(MINIMAL["input"]))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == MINIMAL["digest"]


def test_canonical_and_json_from_file(tmp_path):
    path = tmp_path / "req.json"
    path.write_text(json.dumps(dict(MINIMAL["input"], requestId="r-1")), encoding="utf-8")
    result = runner.invoke(app, ["cache-key", "--canonical", "--json", str(path)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out == {"recipe": "openwop-semantic-request-v2", "key": MINIMAL["digest"], "canonical": MINIMAL["canonical"]}
    plain = runner.invoke(app, ["cache-key", "--canonical", str(path)])
    assert plain.output.splitlines() == [MINIMAL["digest"], MINIMAL["canonical"]]


def test_reads_an_invocation_started_doc_and_v1():
    doc = {"eventId": "e", "runId": "r", "type": "agent.invocation.started", "timestamp": "2025-01-01T00:00:00Z",
           "sequence": 0, "payload": {"request": MINIMAL["input"], "cacheKey": "x", "recipe": "v1"}}
    result = runner.invoke(app, ["cache-key", "--recipe", "v1", "--canonical"], input=json.dumps(doc))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == '{"messages":[{"content":"hello","role":"user"}],"model":"claude-x","provider":"anthropic"}'


def test_bad_request_is_a_typed_error():
    result = runner.invoke(app, ["cache-key"], input='{"model": "m"}')
    assert isinstance(result.exception, CacheKeyError)
    assert result.exception.code == "invalid_cache_request"
