"""Applying a policy to one doc: replacement forms, actions, field rules, metrics-only mode, what stays untouched."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from agentlog.core.redaction import DEFAULT_POLICY, Policy, PolicyError, Redactor, looks_random, parse_policy
from agentlog.core.sealing import DataKey, seal_event
from agentlog.schemas.canonical import jcs

EMAIL = "alice.marker+x@example.org"
CARD = "4111 1111 1111 1111"
SALT = b"deployment-salt-1"


def _doc(type_: str, payload, event_id: str = "e-1") -> dict:
    return {"eventId": event_id, "runId": "run-1", "type": type_, "payload": payload,
            "timestamp": "2026-11-28T10:00:00Z", "sequence": 3, "nodeId": "planner"}


def _variable(value) -> dict:
    return _doc("variable.changed", {"name": "profile", "value": value})


def _hmac(value: str, salt: bytes = SALT) -> str:
    return hmac.new(salt, value.encode(), hashlib.sha256).hexdigest()[:16]


REQUEST = _doc("agent.invocation.started", {
    "request": {"provider": "openai", "model": "gpt-5", "temperature": 0,
                "messages": [{"role": "system", "content": "You are a planner."},
                             {"role": "user", "content": f"Refund order 42 for {EMAIL}, card {CARD}, twice: {EMAIL}"}]},
    "cacheKey": "sha256:" + "ab" * 32, "recipe": "openwop-semantic-request-v2"})


def test_the_default_policy_masks_and_summarises_without_the_text():
    out = Redactor().redact(REQUEST)
    messages = out.doc["payload"]["request"]["messages"]
    assert messages[1]["content"] == ("Refund order 42 for [REDACTED:email], card [REDACTED:card], "
                                      "twice: [REDACTED:email]")
    assert messages[0] == REQUEST["payload"]["request"]["messages"][0]
    assert out.summary == (
        {"path": "payload.request.messages", "rule": "email", "action": "mask", "count": 2},
        {"path": "payload.request.messages", "rule": "card", "action": "mask", "count": 1},
    )


def test_metadata_stays_even_when_it_looks_like_personal_data():
    doc = _doc("run.started", {"bindings": {"owner": EMAIL}, "subject": EMAIL, "goal": f"write to {EMAIL}"})
    out = Redactor().redact(doc)
    assert out.doc["payload"]["bindings"] == {"owner": EMAIL}
    assert out.doc["payload"]["subject"] == EMAIL
    assert out.doc["payload"]["goal"] == "write to [REDACTED:email]"
    usage = _doc("provider.usage", {"provider": "openai", "model": "gpt-5", "inputTokens": 4111111111111111,
                                    "outputTokens": 12, "costCents": 3})
    assert Redactor().redact(usage).doc is usage
    out = Redactor().redact(REQUEST)
    assert {k: v for k, v in out.doc["payload"].items() if k != "request"} == \
        {k: v for k, v in REQUEST["payload"].items() if k != "request"}
    assert {k: v for k, v in out.doc.items() if k != "payload"} == {k: v for k, v in REQUEST.items() if k != "payload"}


def test_object_keys_are_left_alone_and_values_at_any_depth_are_scanned():
    doc = _variable({EMAIL: [{"deep": [[{"x": f"mail {EMAIL}"}]]}], "n": 4111111111111111, "small": 42})
    out = Redactor().redact(doc)
    assert out.doc["payload"]["value"] == {EMAIL: [{"deep": [[{"x": "mail [REDACTED:email]"}]]}],
                                           "n": "[REDACTED:card]", "small": 42}


def test_an_event_without_a_match_is_returned_as_it_is():
    doc = _variable({"note": "nothing to see", "n": [1, 2, 3]})
    out = Redactor().redact(doc)
    assert out.doc is doc and out.summary == ()


def test_hash_is_a_keyed_digest_stable_under_one_salt_and_different_under_another():
    policy = parse_policy('[detectors]\nemail = "hash"\n').default
    a = Redactor(policy, salt=SALT).redact(REQUEST)
    b = Redactor(policy, salt=SALT).redact(REQUEST)
    c = Redactor(policy, salt=b"another-deployment").redact(REQUEST)
    content = a.doc["payload"]["request"]["messages"][1]["content"]
    assert f"[HASH:email:{_hmac(EMAIL)}]" in content
    assert content.count(f"[HASH:email:{_hmac(EMAIL)}]") == 2  # equal values stay joinable
    assert "[REDACTED:card]" in content
    assert jcs(a.doc) == jcs(b.doc)
    assert c.doc["payload"]["request"]["messages"][1]["content"] != content
    assert f"[HASH:email:{_hmac(EMAIL, b'another-deployment')}]" in c.doc["payload"]["request"]["messages"][1]["content"]
    assert {"path": "payload.request.messages", "rule": "email", "action": "hash", "count": 2} in a.summary


def test_a_policy_that_hashes_needs_a_salt_and_the_salt_is_never_shown():
    with pytest.raises(PolicyError) as e:
        Redactor(parse_policy('[fields."*"]\n"payload.value" = "hash"\n').default)
    assert e.value.code == "redaction_salt_missing"
    assert "s3cr3t" not in repr(Redactor(salt=b"s3cr3t"))


def test_a_detector_that_drops_removes_the_member_holding_the_match():
    policy = parse_policy('[detectors]\ncard = "drop"\n').default
    doc = _variable({"keep": "fine", "card": f"pay with {CARD}", "list": ["a", CARD, "b"]})
    out = Redactor(policy).redact(doc)
    assert out.doc["payload"]["value"] == {"keep": "fine", "list": ["a", "b"]}
    assert out.summary == ({"path": "payload.value", "rule": "card", "action": "drop", "count": 2},)


def test_field_rules_act_on_the_whole_value_first_match_wins_type_before_star():
    policy = parse_policy('''
[fields."variable.changed"]
"payload.value.password" = "drop"
"payload.value.user.*" = "hash"
"payload.value.raw" = "keep"
[fields."*"]
"payload.**.token" = "mask"
"payload.value.password" = "keep"
''').default
    doc = _variable({"password": "hunter2", "user": {"id": 7, "mail": EMAIL}, "raw": f"{EMAIL} stays",
                     "token": "t", "nested": [{"token": {"a": 1}}], "note": f"to {EMAIL}"})
    out = Redactor(policy, salt=SALT).redact(doc)
    value = out.doc["payload"]["value"]
    assert "password" not in value
    assert value["user"] == {"id": f"[HASH:field:{hmac.new(SALT, jcs(7), hashlib.sha256).hexdigest()[:16]}]",
                             "mail": f"[HASH:field:{_hmac(EMAIL)}]"}
    assert value["raw"] == f"{EMAIL} stays"
    assert value["token"] == "[REDACTED:field]" and value["nested"] == [{"token": "[REDACTED:field]"}]
    assert value["note"] == "to [REDACTED:email]"
    assert list(out.summary) == [
        {"path": "payload.value", "rule": "field:payload.value.password", "action": "drop", "count": 1},
        {"path": "payload.value", "rule": "field:payload.value.user.*", "action": "hash", "count": 2},
        {"path": "payload.value", "rule": "field:payload.**.token", "action": "mask", "count": 2},
        {"path": "payload.value", "rule": "email", "action": "mask", "count": 1},
    ]


def test_a_field_rule_never_reaches_metadata():
    policy = parse_policy('[fields."*"]\n"payload.**" = "drop"\n').default
    out = Redactor(policy).redact(REQUEST)
    assert out.doc["payload"] == {"request": {"provider": "openai", "model": "gpt-5", "temperature": 0},
                                  "cacheKey": REQUEST["payload"]["cacheKey"],
                                  "recipe": "openwop-semantic-request-v2"}


def test_metrics_only_drops_every_content_member_and_keeps_the_metadata():
    policy = parse_policy("metrics_only = true\n").default
    out = Redactor(policy).redact(REQUEST)
    assert out.doc["payload"] == {"request": {"provider": "openai", "model": "gpt-5", "temperature": 0},
                                  "cacheKey": REQUEST["payload"]["cacheKey"], "recipe": "openwop-semantic-request-v2"}
    assert out.summary == ({"path": "payload.request.messages", "rule": "metrics-only", "action": "drop", "count": 1},)
    opaque = _doc("upstream.opaque", ["a list payload", EMAIL])
    assert Redactor(policy).redact(opaque).doc["payload"] is None
    assert Redactor().redact(opaque).doc["payload"] == ["a list payload", "[REDACTED:email]"]


def test_per_topic_prefix_policies():
    policies = parse_policy('[detectors]\nip = "off"\n[topics."agentlog-ci"]\nmetrics_only = true\n')
    doc = _variable(f"from 203.0.113.9 by {EMAIL}")
    prod = Redactor(policies.for_topic_prefix("agentlog")).redact(doc)
    ci = Redactor(policies.for_topic_prefix("agentlog-ci")).redact(doc)
    assert prod.doc["payload"]["value"] == "from 203.0.113.9 by [REDACTED:email]"
    assert ci.doc["payload"] == {"name": "profile"}
    assert policies.for_topic_prefix("agentlog-ci").detectors == {"ip": "off"}  # merged over the top level


def test_sealed_members_are_left_as_they_are():
    sealed = seal_event(REQUEST, DataKey("k1", bytes(range(32))))
    assert Redactor().redact(sealed).doc is sealed
    assert Redactor(parse_policy("metrics_only = true").default).redact(sealed).doc is sealed


def test_a_policy_pattern_comes_before_the_built_in_detectors():
    policy = parse_policy("[patterns.customer]\nregex = 'CUST-[0-9]+ <[^>]+>'\n").default
    out = Redactor(policy).redact(_variable(f"CUST-991 <{EMAIL}> and {EMAIL}"))
    assert out.doc["payload"]["value"] == "[REDACTED:customer] and [REDACTED:email]"


def test_the_default_policy_is_every_builtin_detector_masking():
    assert DEFAULT_POLICY == Policy() == parse_policy("").default
    assert DEFAULT_POLICY.action("email") == "mask" and not DEFAULT_POLICY.metrics_only


def test_redelivery_gives_identical_bytes():
    policy = parse_policy('[detectors]\nphone = "hash"\n[fields."*"]\n"payload.request.messages.0" = "drop"\n').default
    first = Redactor(policy, salt=SALT).redact(REQUEST)
    second = Redactor(policy, salt=SALT).redact(json.loads(json.dumps(REQUEST)))
    assert jcs(first.doc) == jcs(second.doc) and jcs(list(first.summary)) == jcs(list(second.summary))
    phones = _variable("call +49 30 901820 or 030 12345678, again: 030 12345678")
    redactor = Redactor()  # a second pass answers from its memo of phone verdicts: the same bytes
    assert jcs(redactor.redact(phones).doc) == jcs(redactor.redact(phones).doc) == jcs(Redactor().redact(phones).doc)
    assert redactor.redact(phones).doc["payload"]["value"] == "call [REDACTED:phone] or [REDACTED:phone], again: " \
                                                              "[REDACTED:phone]"


@pytest.mark.parametrize("text, expected", [
    # detectors at their edges
    ("IBANはDE89370400440532013000です", "IBANは[REDACTED:iban]です"),
    ("電話03-1234-5678まで", "電話[REDACTED:phone]まで"),
    ("served from 2001:db8::8a2e:370:7334.", "served from [REDACTED:ip]."),
    ("localhost is 127.0.0.1 and ::1", "localhost is 127.0.0.1 and ::1"),
    ("paid 4111 1111 1111 1111 2026", "paid [REDACTED:card] 2026"),
    ("order 4111 1111 1111 1112", "order 4111 1111 1111 1112"),  # Luhn fails
    ("iban DE89 3704 0044 0532 0130 01", "iban DE89 3704 0044 0532 0130 01"),  # mod 97 fails
    ("icon@2x.png and me@example.com", "icon@2x.png and [REDACTED:email]"),
    ("key=AKIAIOSFODNN7EXAMPLE", "key=[REDACTED:api_key]"),
    ("use sk-learn-compatible-estimators-for-this", "use sk-learn-compatible-estimators-for-this"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\nbye",
     "[REDACTED:private_key]\nbye"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcDEF123_-x",
     "Authorization: Bearer [REDACTED:jwt]"),
    ("session 9fK2xQ7LmN4pR8sT1vW3yZ6bC0dE5gH", "session [REDACTED:high_entropy]"),
    ("class HTTP2ConnectionPoolManager", "class HTTP2ConnectionPoolManager"),
])
def test_detectors(text, expected):
    assert Redactor().redact(_variable(text)).doc["payload"]["value"] == expected


@pytest.mark.parametrize("token, random", [
    ("9fK2xQ7LmN4pR8sT1vW3yZ6bC0dE5gH", True),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", True),
    ("getUserAccountBalance2", False),
    ("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", False),  # hex
    ("01JDQ8Z3K9Q4ZB7M2T8V5N6P1R", False),  # ULID: one case
    ("AgentInvocationStarted2Event", False),
])
def test_looks_random(token, random):
    assert looks_random(token) is random
