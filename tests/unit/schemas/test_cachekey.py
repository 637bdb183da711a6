"""LLM cache key: the 13 normative v2 vectors, v1 behaviour, and what must never change a key."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.schemas.cachekey import RECIPE_IDS, TRANSPORT_FIELDS, cache_key, canonical_request, project_request
from agentlog.schemas.errors import CacheKeyError, ContractError
from agentlog.schemas.upstream import upstream_file
from tests.unit.schemas.strategies import contract_settings

VECTORS_FILE = upstream_file("openwop/conformance/vectors/semantic-request-digest-v2.json")
VECTORS = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
BY_ID = {v["id"]: v for v in VECTORS["vectors"]}

BASE = {"provider": "anthropic", "model": "claude-x", "messages": [{"role": "user", "content": "hello"}]}


def test_vector_file_is_the_v2_recipe():
    assert VECTORS["recipe"] == RECIPE_IDS["v2"]
    assert len(VECTORS["vectors"]) == 13


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["id"])
def test_v2_vector(vector):
    inp = copy.deepcopy(vector["input"])
    assert canonical_request(inp, "v2") == vector["canonical"].encode("utf-8")
    assert cache_key(inp) == vector["digest"]
    assert hashlib.sha256(vector["canonical"].encode("utf-8")).hexdigest() == vector["digest"]
    assert inp == vector["input"], "projection must not mutate the request"


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("tools-sorted-by-name", "tools-reversed-same-digest", True),
        ("tools-code-unit-order", "tools-code-unit-order-reversed", True),
        ("message-order-is-semantic", "message-order-reversed", False),
        ("non-ascii-not-normalized", "non-ascii-composed", False),
        ("minimal", "stop-changes-digest", False),
        ("minimal", "seed-changes-digest", False),
        ("minimal", "max-output-changes-digest", False),
        ("minimal", "provider-options-carried", False),
    ],
)
def test_vector_pairs(a, b, equal):
    assert (cache_key(BY_ID[a]["input"]) == cache_key(BY_ID[b]["input"])) is equal


NON_KEY = {
    "requestId": "req-123",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "traceId": "abc",
    "spanId": "def",
    "tenantId": "acme",
    "tenant": "acme",
    "runId": "run-9",
    "nodeId": "n1",
    "timeout": 30,
    "timeoutMs": 30000,
    "retries": 2,
    "retryCount": 1,
    "maxRetries": 5,
    "attempt": 3,
    "idempotencyKey": "k",
    "correlationId": "c",
    "stream": True,
    "metadata": {"a": 1},
    "user": "u",
}


@pytest.mark.parametrize("recipe", ["v1", "v2"])
@pytest.mark.parametrize("field", sorted(NON_KEY))
def test_transport_fields_never_change_the_key(recipe, field):
    assert field in TRANSPORT_FIELDS
    req = dict(BY_ID["tools-sorted-by-name"]["input"], temperature=0.2)
    assert cache_key({**req, field: NON_KEY[field]}, recipe) == cache_key(req, recipe)


@contract_settings
@given(st.sets(st.sampled_from(sorted(NON_KEY))))
def test_any_combination_of_transport_fields_keeps_the_key(fields):
    req = dict(BASE, **{f: NON_KEY[f] for f in fields})
    assert cache_key(req) == BY_ID["minimal"]["digest"]


@pytest.mark.parametrize("field", ["max_tokens", "reasoningEffort", "frequency_penalty"])
def test_unnamed_top_level_fields_are_dropped_like_upstream(field):
    # Upstream projectSemanticRequestV2 copies only named fields and an explicit providerOptions
    # object; a TypeScript host computes the "minimal" key for this request, so must we.
    assert cache_key(dict(BASE, **{field: 512})) == BY_ID["minimal"]["digest"]


def test_explicit_provider_options_are_carried_verbatim_beside_dropped_fields():
    req = dict(BASE, max_tokens=5, providerOptions={"vendor.anthropic.reasoningEffort": "high"})
    assert canonical_request(req).decode() == BY_ID["provider-options-carried"]["canonical"]
    # An empty object is still an explicit object: upstream carries it.
    assert canonical_request(dict(BASE, providerOptions={})) == (
        b'{"model":"claude-x","provider":"anthropic","providerOptions":{},'
        b'"recipe":"openwop-semantic-request-v2","request":{"messages":[{"content":"hello","role":"user"}]}}'
    )


def test_null_is_absent_and_empty_tools_are_absent():
    assert cache_key(dict(BASE, temperature=None, tools=[], seed=None)) == BY_ID["minimal"]["digest"]


@pytest.mark.parametrize(
    "field", ["temperature", "topP", "topK", "maxOutputTokens", "seed", "responseFormat", "safetySettings", "stop"]
)
def test_every_semantic_v2_field_changes_the_key(field):
    value = {"responseFormat": {"type": "json"}, "safetySettings": {"hate": "block"}, "stop": ["x"]}.get(field, 1)
    changed = dict(BASE, **{field: value})
    assert cache_key(changed) != cache_key(BASE)
    assert field in json.loads(canonical_request(changed))["request"]


def test_v1_projection():
    req = dict(BY_ID["tools-code-unit-order"]["input"], temperature=0, responseFormat={"type": "json"},
               stop=["END"], seed=7, maxOutputTokens=9, requestId="r")
    projected = project_request(req, "v1")
    assert projected == {
        "provider": "anthropic",
        "model": "claude-x",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"name": "getWeather", "parameters": {}}, {"name": "get_weather", "parameters": {}}],
        "temperature": 0,
        "responseFormat": {"type": "json"},
    }
    expected = (b'{"messages":[{"content":"hello","role":"user"}],"model":"claude-x","provider":"anthropic",'
                b'"responseFormat":{"type":"json"},"temperature":0,'
                b'"tools":[{"name":"getWeather","parameters":{}},{"name":"get_weather","parameters":{}}]}')
    assert canonical_request(req, "v1") == expected
    assert cache_key(req, "v1") == hashlib.sha256(expected).hexdigest()
    assert cache_key(req, RECIPE_IDS["v1"]) == cache_key(req, "v1")


def test_v1_ignores_what_v2_keys_on_and_omits_absent_fields():
    assert canonical_request(BASE, "v1") == (
        b'{"messages":[{"content":"hello","role":"user"}],"model":"claude-x","provider":"anthropic"}'
    )
    assert cache_key(dict(BASE, stop=["x"], seed=1), "v1") == cache_key(BASE, "v1")
    assert cache_key(BASE, "v1") != cache_key(BASE, "v2")


def test_v1_reads_seed_name_response_schema():
    assert cache_key(dict(BASE, responseSchema={"type": "object"}), "v1") == cache_key(
        dict(BASE, responseFormat={"type": "object"}), "v1"
    )


def test_tool_sort_is_utf16_code_units_not_code_points():
    # U+FF5E (BMP, one code unit 0xFF5E) sorts AFTER U+1F600 (surrogates 0xD83D...) in UTF-16.
    tools = [{"name": "\U0001F600", "parameters": {}}, {"name": "\uff5e", "parameters": {}}]
    projected = project_request(dict(BASE, tools=list(reversed(tools))))
    assert [t["name"] for t in projected["request"]["tools"]] == ["\U0001F600", "\uff5e"]


@pytest.mark.parametrize(
    "request_",
    [
        {"model": "m", "messages": []},
        {"provider": "p", "messages": []},
        {"provider": "p", "model": "m"},
        {"provider": "p", "model": "m", "messages": [], "temperature": "0.2"},
        {"provider": "p", "model": "m", "messages": [], "temperature": True},
        {"provider": "p", "model": "m", "messages": [], "tools": [{"parameters": {}}]},
        {"provider": "p", "model": "m", "messages": [], "responseFormat": "json"},
        {"provider": "p", "model": "m", "messages": [], "providerOptions": ["not", "an", "object"]},
        {"provider": "p", "model": "m", "messages": [], "stop": "END"},
        ["not", "an", "object"],
    ],
)
def test_bad_requests_raise_cache_key_error(request_):
    with pytest.raises(CacheKeyError) as info:
        cache_key(request_)
    assert info.value.code == "invalid_cache_request"


def test_unknown_recipe():
    with pytest.raises(CacheKeyError):
        cache_key(BASE, "v3")


def test_unsafe_numbers_are_refused():
    with pytest.raises(ContractError) as info:
        cache_key(dict(BASE, seed=2**60))
    assert info.value.code == "unsafe_integer"
