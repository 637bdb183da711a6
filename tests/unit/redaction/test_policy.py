"""The policy file: the documented format is read whole, and a bad entry is refused with its line."""

from __future__ import annotations

import re

import pytest

from agentlog.core import redaction
from agentlog.core.redaction import BUILTIN_DETECTORS, PolicyError, parse_policy
from agentlog.schemas.errors import AgentlogError

FULL = """\
version = 1
metrics_only = false

[detectors]
phone = "hash"
high_entropy = "off"

[phone]
regions = ["DE", "FR", "US"]

[patterns.employee_id]
regex = 'EMP-\\d{6}'
action = "hash"

[fields."agent.invocation.started"]
"payload.request.messages.*.name" = "keep"
[fields."*"]
"payload.value.password" = "drop"
"payload.**.apiKey" = "mask"

[classes."ci"]
metrics_only = true

[topics."agentlog-ci"]
metrics_only = true
[topics.prod.classes.ci]
metrics_only = false
[topics.prod.classes.load-test]
metrics_only = true
[topics.prod.detectors]
ip = "off"
employee_id = "mask"
"""


def test_the_documented_example_parses():
    policies = parse_policy(FULL)
    top = policies.default
    assert top.detectors == {"employee_id": "hash", "phone": "hash", "high_entropy": "off"}
    assert top.patterns["employee_id"].pattern == r"EMP-\d{6}"
    assert top.phone_regions == ("DE", "FR", "US")
    assert top.fields == {"agent.invocation.started": {"payload.request.messages.*.name": "keep"},
                          "*": {"payload.value.password": "drop", "payload.**.apiKey": "mask"}}
    assert policies.for_topic_prefix("agentlog-ci").metrics_only
    assert policies.for_topic_prefix("agentlog-ci").fields == top.fields
    assert policies.for_topic_prefix("prod").detectors == {"employee_id": "mask", "phone": "hash",
                                                            "high_entropy": "off", "ip": "off"}
    assert policies.for_topic_prefix("other") is top
    assert top.metrics_only_classes == {"ci"} and not top.metrics_only
    assert policies.for_topic_prefix("prod").metrics_only_classes == {"load-test"}  # merged over the top level


def test_the_module_docstring_example_parses():
    """The format's documentation is the module docstring; its example must stay a valid policy."""
    doc = redaction.__doc__ or ""
    example = doc.split("Every key is optional::\n\n", 1)[1].split("\n\nA path names", 1)[0]
    text = "\n".join(line[4:] for line in example.splitlines())
    parsed = parse_policy(text)
    assert parsed.default.detectors["phone"] == "hash" and parsed.topics["agentlog-ci"].metrics_only


# (policy text, code, line of the offending entry) — lines counted by hand.
BAD = [
    ('[detectors]\nemial = "mask"\n', "redaction_policy_invalid", 2),
    ('metrics_only = true\nretention = 3\n', "redaction_policy_invalid", 2),
    ('version = 2\n', "redaction_policy_invalid", 1),
    ('\n\n[patterns.customer]\naction = "mask"\nregex = "(unclosed"\n', "redaction_policy_invalid", 5),
    ('[patterns.email]\nregex = "x"\n', "redaction_policy_invalid", 1),
    ('[patterns.anything]\nregex = "a*"\n', "redaction_policy_invalid", 2),
    ('[fields."*"]\n"payload.a" = "mask"\n"payload.b" = "zap"\n', "redaction_policy_invalid", 3),
    ('[fields."variable.changed"]\n"value.secret" = "drop"\n', "redaction_policy_invalid", 2),
    ('[topics.ci]\nmetrics_only = false\n\n[topics.ci.detectors]\ncard = "mask"\nfoo = "off"\n',
     "redaction_policy_invalid", 6),
    ('[topics."agentlog-ci"]\nmetrics_only = "yes"\n', "redaction_policy_invalid", 2),
    ('[phone]\nregions = ["DE", "XX"]\n', "redaction_policy_invalid", 2),
    ('[classes."c i"]\nmetrics_only = true\n', "redaction_policy_invalid", 1),
    ('[classes.ci]\nmetrics_only = true\ndetectors = {}\n', "redaction_policy_invalid", 3),
    ('\n[classes.ci]\nmetrics_only = 1\n', "redaction_policy_invalid", 3),
    ('classes = 3\n', "redaction_policy_invalid", 1),
    ('[patterns]\nx = { regex = "a+", action = "nuke" }\n', "redaction_policy_invalid", 2),
    ('[detectors]\nemail = "mask"\nemail = "hash"\n', "redaction_policy_syntax", 3),
    ('[detectors\nemail = "mask"\n', "redaction_policy_syntax", 1),
    ('metrics_only = true\n[fields."*"]\n"payload.x" = \n', "redaction_policy_syntax", 3),
]


@pytest.mark.parametrize("text, code, line", BAD)
def test_a_bad_policy_is_refused_with_its_line(text, code, line):
    with pytest.raises(PolicyError) as e:
        parse_policy(text, source="policy.toml")
    assert isinstance(e.value, AgentlogError)
    assert (e.value.code, e.value.line) == (code, line)
    assert str(e.value).startswith(f"policy.toml line {line}: ")
    assert "\n" not in str(e.value)


def test_every_builtin_detector_can_be_turned_off():
    text = "[detectors]\n" + "".join(f'{name} = "off"\n' for name in BUILTIN_DETECTORS)
    policy = parse_policy(text).default
    out = redaction.Redactor(policy).redact({"eventId": "e", "runId": "r", "type": "variable.changed", "sequence": 0,
                                             "payload": {"name": "n", "value": "alice@example.com 4111111111111111"}})
    assert out.summary == () and out.doc["payload"]["value"] == "alice@example.com 4111111111111111"


def test_error_messages_name_the_key_path():
    with pytest.raises(PolicyError, match=re.escape("topics.ci.detectors.foo: no detector of that name")):
        parse_policy('[topics.ci.detectors]\nfoo = "off"\n')
