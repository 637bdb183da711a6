"""``agentlog capabilities`` (:mod:`agentlog.capabilities`): the block matches the upstream excerpt's schema,
and each claim follows its check."""

from __future__ import annotations

import json

import jsonschema
import pytest
from typer.testing import CliRunner

import agentlog.capabilities as caps
from agentlog.capabilities import Check, capability_document, run_checks
from agentlog.cli import app
from agentlog.schemas.upstream import upstream_file

REFERENCE = upstream_file("openwop/schemas/run-event.schema.json").parents[1]
EXCERPT = REFERENCE / "schemas" / "capabilities.multiAgent.EXCERPT.json"
VECTORS = REFERENCE / "conformance" / "vectors" / "semantic-request-digest-v2.json"

needs_reference = pytest.mark.skipif(not EXCERPT.is_file() or not VECTORS.is_file(),
                                     reason="OpenWOP reference files not present")


def _schema() -> dict:
    excerpt = json.loads(EXCERPT.read_text())
    return {"type": "object", "required": ["multiAgent"], "properties": {"multiAgent": excerpt["multiAgent"]}}


def _checks(**ok: bool) -> list[Check]:
    return [Check(name, ok.get(name, True), "") for name in ("handoff", "replay", "cacheKey", "refusal")]


@needs_reference
def test_every_check_passes_on_this_build_and_the_block_is_the_full_claim():
    checks = run_checks(VECTORS)
    assert [c.name for c in checks if not c.ok] == [], [c.detail for c in checks]
    document = capability_document(checks)
    jsonschema.validate(document, _schema())
    assert document == {"multiAgent": {"executionModel": {"supported": True, "version": 4, "replayDeterminism": {
        "supported": True, "llmCacheKeyRecipe": "spec-rfc-0041", "refusalDivergenceEmission": True}}}}
    assert "13/13 vectors" in next(c.detail for c in checks if c.name == "cacheKey")


@needs_reference
def test_cli_json_prints_the_block(tmp_path):
    result = CliRunner().invoke(app, ["capabilities", "--json", "--vectors", str(VECTORS)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    jsonschema.validate(document, _schema())
    assert document["multiAgent"]["executionModel"]["replayDeterminism"]["llmCacheKeyRecipe"] == "spec-rfc-0041"


@needs_reference
def test_a_vector_that_does_not_reproduce_withdraws_the_recipe(tmp_path):
    data = json.loads(VECTORS.read_text())
    data["vectors"][3]["digest"] = "0" * 64
    broken = tmp_path / "vectors.json"
    broken.write_text(json.dumps(data))
    checks = {c.name: c for c in run_checks(broken)}
    assert not checks["cacheKey"].ok and data["vectors"][3]["id"] in checks["cacheKey"].detail
    document = capability_document(list(checks.values()))
    jsonschema.validate(document, _schema())
    assert "llmCacheKeyRecipe" not in document["multiAgent"]["executionModel"]["replayDeterminism"]


def test_missing_vectors_withdraw_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(caps, "_VECTOR_CANDIDATES", (tmp_path / "nope.json",))
    check = next(c for c in caps.run_checks() if c.name == "cacheKey")
    assert not check.ok and "not found" in check.detail


@needs_reference
def test_the_vector_file_is_not_read_from_the_environment(tmp_path, monkeypatch):
    # Settings are read only through agentlog.streams.settings.Settings; the vectors come from --vectors or the bundle.
    monkeypatch.setenv("AGENTLOG_CACHE_KEY_VECTORS", str(VECTORS))
    monkeypatch.setattr(caps, "_VECTOR_CANDIDATES", (tmp_path / "nope.json",))
    assert caps.find_vectors() is None
    assert caps.find_vectors(VECTORS) == VECTORS


@needs_reference
@pytest.mark.parametrize("failed, expected", [
    ("refusal", {"supported": True, "version": 4, "replayDeterminism": {
        "supported": True, "llmCacheKeyRecipe": "spec-rfc-0041", "refusalDivergenceEmission": False}}),
    ("replay", {"supported": True, "version": 1, "replayDeterminism": {
        "supported": False, "refusalDivergenceEmission": False}}),
    ("handoff", {"supported": False, "version": 1}),
])
def test_each_failed_check_withdraws_its_claim(failed, expected):
    document = capability_document(_checks(**{failed: False}))
    jsonschema.validate(document, _schema())
    assert document["multiAgent"]["executionModel"] == expected
