"""The redaction corpus through the default policy: every planted value found, the clean look-alikes left alone.

The corpus files are written by ``corpus.py`` (``python -m tests.unit.redaction.corpus``); the checksums it plants
are computed there from the standards, independently of the detectors under test.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import pytest

from agentlog.core.redaction import Redactor
from agentlog.schemas.content import clear_tree, content_members
from agentlog.schemas.validate import validate_doc
from tests.unit.redaction import corpus

#: The kinds the goal asks 100% of: structured values with a format or a checksum.
STRUCTURED = ("card", "iban", "email", "api_key", "jwt", "private_key")
#: The false-positive rate the goal allows on the clean corpus.
MAX_FALSE_POSITIVES = 0.01

REDACTOR = Redactor()


def _load(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


PLANTED = _load(corpus.PLANTED)
CLEAN = _load(corpus.CLEAN)


def _forms(entry: dict[str, Any]) -> list[str]:
    """The texts that must not survive: the value as written and, for grouped numbers, its digits alone."""
    value = entry["value"]
    forms = [value]
    if entry["kind"] in ("card", "iban"):
        forms.append(value.replace(" ", "").replace("-", ""))
    if entry["kind"] == "private_key":
        forms += [line for line in value.splitlines() if "-----" not in line]
    return forms


def _metadata(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every content member removed: what redaction must leave exactly as it was."""
    payload = copy.deepcopy(doc["payload"])
    for path, _ in list(content_members(payload, clear_tree(doc["type"]))):
        parent = payload
        for name in path[:-1]:
            parent = parent[name]
        del parent[path[-1]]
    return {**doc, "payload": payload}


def test_the_files_are_what_the_generator_writes():
    assert corpus.PLANTED.read_text("utf-8") == corpus.lines(corpus.planted())
    assert corpus.CLEAN.read_text("utf-8") == corpus.lines(corpus.clean())


def test_the_corpus_is_large_and_varied():
    kinds = Counter(e["kind"] for e in PLANTED)
    assert len(PLANTED) >= 200
    assert set(kinds) == {*STRUCTURED, "phone", "ip", "high_entropy"}
    assert {e["lang"] for e in PLANTED} == {"en", "de", "fr", "es", "ja"}
    assert len({(e["doc"]["type"], e["where"]) for e in PLANTED}) == len(corpus.PLACEMENTS)
    assert len({e["value"][:2] for e in PLANTED if e["kind"] == "iban"}) >= 10  # countries


def test_the_corpus_events_are_valid_run_event_docs():
    for entry in PLANTED + CLEAN:
        validate_doc(entry["doc"])


def test_the_planted_checksums_hold_by_the_standards():
    cards = [e["value"].replace(" ", "").replace("-", "") for e in PLANTED if e["kind"] == "card"]
    assert all(corpus.luhn_ok(c) for c in cards)
    assert corpus.luhn_ok("4111111111111111") and not corpus.luhn_ok("4111111111111112")
    assert all(corpus.iban_ok(e["value"]) for e in PLANTED if e["kind"] == "iban")
    assert corpus.iban_ok("GB29 NWBK 6016 1331 9268 19") and not corpus.iban_ok("GB29 NWBK 6016 1331 9268 18")


def test_every_planted_value_is_redacted_by_its_detector():
    missed = []
    for entry in PLANTED:
        out = REDACTOR.redact(entry["doc"])
        text = json.dumps(out.doc, ensure_ascii=False)
        rules = {s["rule"] for s in out.summary}
        if any(form in text for form in _forms(entry)) or entry["kind"] not in rules:
            missed.append((entry["kind"], entry["value"], entry["where"]))
    found = Counter(e["kind"] for e in PLANTED) - Counter(kind for kind, _, _ in missed)
    rates = {kind: found[kind] / n for kind, n in Counter(e["kind"] for e in PLANTED).items()}
    assert missed == [], f"found per kind: {rates}"


@pytest.mark.parametrize("place", corpus.PLACEMENTS, ids=lambda p: p.__name__)
def test_structured_values_are_redacted_in_every_content_field(place):
    """Each structured value, in each language, put into this content field (as text and as the bare value)."""
    import random

    rng = random.Random(place.__name__)
    for i, entry in enumerate(e for e in PLANTED if e["kind"] in STRUCTURED):
        lang = corpus.LANGS[i % len(corpus.LANGS)]
        _, doc = place(rng, i, corpus._text(rng, lang, entry["value"]), entry["value"])
        out = REDACTOR.redact(doc)
        text = json.dumps([out.doc, out.summary], ensure_ascii=False)
        assert not any(form in text for form in _forms(entry)), (entry["kind"], entry["value"], place.__name__)


def test_the_summary_and_the_doc_hold_no_planted_text():
    for entry in PLANTED:
        out = REDACTOR.redact(entry["doc"])
        summary = json.dumps(out.summary, ensure_ascii=False)
        assert entry["value"] not in summary
        assert all(set(s) == {"path", "rule", "action", "count"} for s in out.summary)
        assert {s["path"] for s in out.summary} == {entry["where"]}


def test_false_positives_on_the_clean_corpus_stay_under_one_percent():
    touched = []
    for entry in CLEAN:
        out = REDACTOR.redact(entry["doc"])
        if out.summary or out.doc != entry["doc"]:
            touched.append((entry["kind"], entry["value"], [s["rule"] for s in out.summary]))
    rate = len(touched) / len(CLEAN)
    assert len(CLEAN) >= 200
    assert rate <= MAX_FALSE_POSITIVES, f"{rate:.2%} of {len(CLEAN)}: {touched}"


def test_metadata_is_never_touched():
    for entry in PLANTED + CLEAN:
        doc = entry["doc"]
        out = REDACTOR.redact(doc)
        assert _metadata(out.doc) == _metadata(doc)


def test_redaction_leaves_the_input_unchanged_and_is_deterministic():
    for entry in PLANTED[::7]:
        before = copy.deepcopy(entry["doc"])
        first = REDACTOR.redact(entry["doc"])
        assert entry["doc"] == before
        again = Redactor().redact(copy.deepcopy(before))
        assert json.dumps([first.doc, first.summary], sort_keys=True) == json.dumps([again.doc, again.summary],
                                                                                    sort_keys=True)
        assert REDACTOR.redact(first.doc).summary == ()  # nothing of a redaction is found again
