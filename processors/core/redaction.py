"""Redaction: secrets and personal data found in an event's content and masked, hashed or dropped by a policy.

Redaction runs on the content members of a RunEventDoc only (:mod:`agentlog.schemas.content`): metadata — ids,
names, token counts, cache keys — is never read or changed. Inside a content member it walks nested JSON to any
depth and scans every string (and every integer of seven digits or more, which a card or phone number may be
published as); object keys are left as they are.

Detectors, in the order that decides which one claims overlapping text:

* ``private_key``: a PEM private key block (``-----BEGIN … PRIVATE KEY-----`` to its end line);
* ``jwt``: a JSON Web Token (base64url ``eyJ…`` header and payload, and a signature);
* ``api_key``: a well-known key prefix: ``sk-`` (OpenAI ``sk-proj-``, Anthropic ``sk-ant-``), ``AKIA``/``ASIA``
  (AWS), ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``/``github_pat_`` (GitHub), ``xox[bpas]-`` (Slack), ``AIza``
  (Google), ``sk_live_``/``rk_live_`` and their ``_test_`` forms (Stripe), ``hf_`` (Hugging Face), ``glpat-``
  (GitLab), ``npm_``, ``pypi-``;
* ``email``: an address, with plus-addressing and internationalised (IDN) local parts and domains;
* ``iban``: an IBAN, grouped or not, whose country format and mod-97 check digits hold (``python-stdnum``);
* ``card``: 13 to 19 digits, grouped or not, with a card scheme's prefix and length and a valid Luhn digit;
* ``ip``: an IPv4 or IPv6 address (loopback and unspecified addresses excepted);
* ``phone``: a number valid in international form, or in national form in one of the policy's regions with its
  digits grouped as that country writes them (``phonenumbers``);
* ``high_entropy``: a token of 24 to 256 characters that looks random (:func:`looks_random` says how).

A policy's own regex detectors (``patterns``) come before all of these.

Replacements: ``mask`` writes ``[REDACTED:<detector>]``; ``hash`` writes ``[HASH:<detector>:<hex>]``, the first 16
hex digits of HMAC-SHA256 under the deployment's salt over the matched text (a field rule's: over the value's
canonical JSON, a string's own text), so equal values stay joinable without being readable; ``drop`` removes the
member the text stands in (an object's member, a list's element; a whole payload reads ``null``).

**The policy** (TOML, read by :func:`parse_policy`). Without one, every built-in detector masks every content
member (:data:`DEFAULT_POLICY`); a file relaxes or extends that. Every key is optional::

    version = 1
    metrics_only = false        # true: every content member is dropped; metadata alone is kept

    [detectors]                 # a built-in or pattern detector's action: "mask" | "hash" | "drop" | "off"
    phone = "hash"
    high_entropy = "off"

    [phone]
    regions = ["DE", "FR", "US"]  # where national-form numbers are looked for (international form: anywhere)

    [patterns.employee_id]      # a detector of the policy's own: a Python regex, and its action (default "mask")
    regex = 'EMP-\\d{6}'
    action = "hash"

    [fields."agent.invocation.started"]   # rules by path for one event type, or "*" for every type
    "payload.request.messages.*.name" = "keep"   # no detector runs inside
    [fields."*"]
    "payload.value.password" = "drop"     # "drop" | "mask" | "hash" (the whole value) | "keep"
    "payload.**.apiKey" = "mask"

    [classes."ci"]              # a run class (``run.started`` ``runClass``, a child run's parent's): metrics-only
    metrics_only = true

    [topics."agentlog-ci"]      # one topic prefix (AGENTLOG_TOPIC_PREFIX): any of the keys above, merged over them
    metrics_only = true

A path names members from ``payload`` down, list elements by their index; in a glob ``*`` stands for one name
and ``**`` for any number of them. A rule reaches content only (a path to a metadata member never matches), the
first matching rule wins, the event type's rules before ``"*"``'s. A topic section merges over the top level:
detectors, patterns and field paths by name, the rest replaced.

A policy is validated whole before it is used: a bad one raises :class:`PolicyError` naming the line of the
offending entry, and nothing of it is applied.

**What is recorded.** :meth:`Redactor.redact` returns the redacted doc and a summary, one entry per content
member, detector and action, with the number of matches (never the matched text)::

    [{"path": "payload.request.messages", "rule": "email", "action": "mask", "count": 2}]

A field rule's entry names it ``field:<glob>``, metrics-only mode ``metrics-only``. :meth:`Redactor.stored` is what the
sequencer stores: the redacted doc with that summary in the payload's ``$redactions`` member
(:data:`agentlog.schemas.content.REDACTIONS`), metadata of every event type, so it stays clear and the hash chain covers
it. The envelope admits no member of ours (upstream ``additionalProperties: false``) and its ``payload`` any JSON, so
the record goes inside the payload: beside the members of an object payload; a payload that is not an object (an
opaque event's list or scalar) and was redacted becomes ``{"$redactions": […], "$value": <redacted value>}``
(``$value`` absent when it was dropped). An event without a redaction is stored as published.

Deterministic: the same doc, policy and salt give the same bytes, so a redelivered record is redacted
byte-identically. Pure: no I/O (the caller reads the policy file and the salt).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import math
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import phonenumbers
from stdnum import iban as stdnum_iban
from stdnum import luhn

from agentlog.schemas.canonical import jcs
from agentlog.schemas.content import REDACTIONS, clear_tree, content_members, is_sealed
from agentlog.schemas.errors import AgentlogError, ReplayError
from agentlog.schemas.payloads import RUN_CLASS

__all__ = [
    "ACTIONS", "BUILTIN_DETECTORS", "DEFAULT_PHONE_REGIONS", "DEFAULT_POLICY", "FIELD_ACTIONS", "METRICS_ONLY",
    "Policy", "PolicyError", "PolicyFile", "REDACTIONS", "REJECTION_REDACTIONS", "Redacted", "Redactor", "VALUE",
    "looks_random",
    "metrics_only_error", "parse_policy", "stored_metrics_only",
]  # fmt: skip

#: What a detector does with its matches; ``off`` turns it off.
ACTIONS: Final = ("mask", "hash", "drop", "off")
#: What a field rule does with the whole value at its path.
FIELD_ACTIONS: Final = ("drop", "mask", "hash", "keep")
#: The regions whose national-form phone numbers the default policy knows.
DEFAULT_PHONE_REGIONS: Final = ("US", "GB", "DE", "FR", "ES", "JP")
#: Where a redacted payload that is not an object keeps its redacted value (:meth:`Redactor.stored`).
VALUE: Final = "$value"
#: A rejection record's member listing what redaction did to its content members (:meth:`Redactor.rejection`).
REJECTION_REDACTIONS: Final = "redactions"

#: The rule metrics-only mode records for each content member it drops.
METRICS_ONLY: Final = "metrics-only"
#: The one policy format this module reads.
POLICY_VERSION: Final = 1


class PolicyError(AgentlogError):
    """A redaction policy that cannot be used whole; ``line`` is the line of the offending entry (1-based).

    Fix the entry the message names and start again: a policy is applied whole or not at all.
    """

    code = "redaction_policy_invalid"

    def __init__(self, message: str, *, line: int | None = None, source: str = "policy",
                 code: str | None = None) -> None:
        where = f"{source} line {line}" if line is not None else source
        super().__init__(f"{where}: {message}", code=code)
        self.line = line


# --- detectors ------------------------------------------------------------------------------------------------

Span = tuple[int, int]
#: The spans earlier detectors claimed in a text, with the detector and its action.
Claimed = list[tuple[int, int, str, str]]


@dataclass(frozen=True, slots=True)
class _Regex:
    """A detector by regex: ``needle`` (a substring every match contains) skips the scan of most strings;
    ``check`` confirms a match (a checksum) and may narrow it, returning the span to redact or ``None``."""

    pattern: re.Pattern[str]
    needle: str | None = None
    check: Callable[[str, re.Match[str]], Span | None] | None = None

    def spans(self, text: str, claimed: Claimed) -> Iterator[Span]:
        if self.needle is not None and self.needle not in text:
            return
        for m in self.pattern.finditer(text):
            span = m.span() if self.check is None else self.check(text, m)
            if span is not None:
                yield span


_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
    r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[A-Za-z0-9+/=\s\\:,-]*)",  # a block cut short: to its body's end
    re.DOTALL)  # fmt: skip
_JWT = re.compile(r"(?<![\w-])eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", re.ASCII)
_API_KEY = re.compile(
    r"(?<![\w-])(?:"
    r"sk-(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{20,}"  # OpenAI (sk-, sk-proj-, sk-svcacct-), Anthropic (sk-ant-)
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}"  # GitHub
    r"|xox[bpas]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AIza[A-Za-z0-9_-]{35}"  # Google API keys
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{10,}"  # Stripe secret and restricted keys
    r"|hf_[A-Za-z0-9]{30,}|glpat-[A-Za-z0-9_-]{20,}"  # Hugging Face, GitLab
    r"|npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_-]{50,}"  # npm, PyPI
    r")(?![\w-])", re.ASCII)  # fmt: skip
# Local part and domain labels take Unicode letters (internationalised addresses); the top-level domain is ASCII
# letters, an IDN's punycode form or letters of another script. A match starts where a run of address characters
# starts (the scan stays linear on long words). File names such as ``icon@2x.png`` are not addresses.
_EMAIL = re.compile(
    r"(?<![\w.!#$%&'*+/=?^`{|}~-])[\w.!#$%&'*+/=?^`{|}~-]+"  # local part
    r"@(?:[\w-]+\.)+(?:[a-z]{2,63}(?![a-z0-9_-])|xn--[a-z0-9-]+|[^\W\d_a-z]{2,})",  # domain
    re.IGNORECASE)
_FILE_SUFFIXES = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "pdf", "js", "ts", "css", "json",
                            "py", "txt", "md", "html", "yaml", "yml", "toml", "lock"})
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b", re.ASCII)
_CARD = re.compile(r"(?<![\w.,-])\d(?:[ -]?\d){12,18}(?!\w)", re.ASCII)
_IPV4 = re.compile(r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
                   r"(?!\w|\.\d)", re.ASCII)
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:(?<=:)\d{1,3}(?:\.\d{1,3}){3})?"
                   r"(?![\w:]|\.\d)", re.ASCII)
# A run of at least seven digits that a phone number may be: an optional + or 00, digits grouped by spaces, dots,
# dashes, slashes or brackets. ``phonenumbers`` decides.
_PHONE = re.compile(r"(?<![\w+.,/-])(?:\+|\(\+?)?\d[\d ().\-/\u00a0]{5,20}\d(?![\w/]|[.,]\d)", re.ASCII)
_DATE = re.compile(r"\d{4}([-/.])\d{1,2}\1\d{1,2}|\d{1,2}([-/.])\d{1,2}\2\d{4}", re.ASCII)
_TOKEN = re.compile(r"(?<![\w+/=-])[A-Za-z0-9+/_-]{24,256}={0,2}(?![\w+/=-])", re.ASCII)


def _email_check(text: str, m: re.Match[str]) -> Span | None:
    tld = m.group().rsplit(".", 1)[1].lower()
    return None if tld in _FILE_SUFFIXES else m.span()


def _iban_check(text: str, m: re.Match[str]) -> Span | None:
    # The country's length and format and the mod-97 check digits; not the national check some countries add,
    # whose rules (and bank registries) ``python-stdnum`` knows for a few countries only.
    return m.span() if stdnum_iban.is_valid(m.group(), check_country=False) else None


# ISO/IEC 7812 issuer prefixes of the card schemes in use, with the lengths each issues: Visa 4; Mastercard 51-55,
# 2221-2720; American Express 34, 37; Diners 300-305, 36, 38, 39; JCB 3528-3589; Maestro 50, 56-58;
# Discover, UnionPay and Maestro 6.
_CARD_SCHEMES = (
    (re.compile(r"4"), frozenset({13, 16, 19})),
    (re.compile(r"5[1-5]|2(?:22[1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)"), frozenset({16})),
    (re.compile(r"3[47]"), frozenset({15})),
    (re.compile(r"30[0-5]|3[689]"), frozenset(range(14, 20))),
    (re.compile(r"35(?:2[89]|[3-8]\d)"), frozenset(range(16, 20))),
    (re.compile(r"5[0678]|6"), frozenset(range(13, 20))),
)


def _card_number(digits: str) -> bool:
    return any(prefix.match(digits) and len(digits) in lengths for prefix, lengths in _CARD_SCHEMES) and \
        luhn.is_valid(digits)


def _card_check(text: str, m: re.Match[str]) -> Span | None:
    """The longest leading run of the match's digit groups that is a card number (text may follow a card)."""
    start, end = m.span()
    groups = list(re.finditer(r"\d+", m.group()))
    for last in range(len(groups), 0, -1):
        digits = "".join(g.group() for g in groups[:last])
        if len(digits) < 13:
            break
        if _card_number(digits):
            return start, start + groups[last - 1].end()
    return None


def _ipv4_check(text: str, m: re.Match[str]) -> Span | None:
    address = ipaddress.IPv4Address(m.group())
    return None if address.is_loopback or address.is_unspecified else m.span()


def _ipv6_check(text: str, m: re.Match[str]) -> Span | None:
    if len(m.group()) < 6:  # "1::2" is a slice, "a::b" a scope
        return None
    try:
        address = ipaddress.IPv6Address(m.group())
    except ValueError:
        return None
    return None if address.is_loopback or address.is_unspecified else m.span()


def _ip_spans(text: str, claimed: Claimed) -> Iterator[Span]:
    if "." in text:
        yield from _IP4_DETECTOR.spans(text, claimed)
    if "::" in text or text.count(":") >= 5:
        yield from _IP6_DETECTOR.spans(text, claimed)


_IP4_DETECTOR = _Regex(_IPV4, check=_ipv4_check)
_IP6_DETECTOR = _Regex(_IPV6, check=_ipv6_check)

#: The magic numbers of images in base64 (PNG, JPEG, GIF, WebP): an image is content, not a secret.
_IMAGE_BASE64 = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR")
#: A digest named by its algorithm (Subresource Integrity ``sha384-…``, Nix ``sha256:…``) is not a secret.
_DIGEST_PREFIX = re.compile(r"(?:sha|SHA)(?:1|224|256|384|512)[-:_]")
#: Object ids that APIs mint with a type prefix (OpenAI ``chatcmpl-``/``call_``, Anthropic ``msg_``/``toolu_``,
#: Stripe ``cus_``/``pi_``…): random-looking, and what agents pass around, not secrets.
_ID_PREFIX = re.compile(r"(?:chatcmpl|call|msg|msgbatch|toolu|srvtoolu|req|resp|run|step|asst|thread|file|batch|"
                        r"cus|pi|ch|txn|evt|in|sub|price|prod|seti|pm|tok|ft|ftjob|org|proj|user)[_-]")
_MIN_ENTROPY: Final = 3.5
#: Phone candidates whose verdict a :class:`Redactor` keeps.
_PHONE_MEMO: Final = 4096
_MIN_CLASS_CHANGES: Final = 0.4


def _char_class(c: str) -> int:
    return 0 if "a" <= c <= "z" else 1 if "A" <= c <= "Z" else 2 if "0" <= c <= "9" else 3


def looks_random(token: str) -> bool:
    """``token`` looks like a generated secret rather than a word, an identifier or a digest.

    It must mix lower case, upper case and digits: hex digests, commit SHAs and UUIDs (one case) and ULIDs, dates
    and snake_case names fail here, so a hex-only secret is left to the prefix rules. Then two measures, chosen on
    random tokens against identifiers: the Shannon entropy of its characters is at least 3.5 bits (a random
    24-character base62 token has 4.25 at the median and 3.86 at the 1st percentile; ``getUserAccountBalance2``
    has 3.75), and the character class changes between at least 40% of neighbouring characters (a random token
    near 62%, 0.39 at the 1st percentile for 24 characters and more for longer ones; CamelCase identifiers
    such as ``HTTP2ConnectionPoolManager`` 0.23-0.35, their letters being words). About 98% of random 24-character
    tokens pass both, 99.6% of 40-character ones.
    """
    classes = [_char_class(c) for c in token]
    if not {0, 1, 2} <= set(classes):
        return False
    changes = sum(a != b for a, b in zip(classes, classes[1:], strict=False)) / (len(classes) - 1)
    if changes < _MIN_CLASS_CHANGES:
        return False
    n = len(token)
    entropy = -sum(k / n * math.log2(k / n) for k in Counter(token).values())
    return entropy >= _MIN_ENTROPY


def _token_check(text: str, m: re.Match[str]) -> Span | None:
    token = m.group().rstrip("=")
    if (token.startswith(_IMAGE_BASE64) or text.endswith("base64,", 0, m.start()) or _DIGEST_PREFIX.match(token)
            or _ID_PREFIX.match(token)):
        return None
    return m.span() if looks_random(token) else None


class _Phone:
    """Phone numbers: candidates by regex, then ``phonenumbers``: parsed in each region (cheap), and confirmed by
    its matcher at ``STRICT_GROUPING`` in the first region that parses it (the digits grouped as that country
    groups them), which keeps dates, order numbers and amounts out.

    The verdicts on the last :data:`_PHONE_MEMO` candidates are kept: an LLM request repeats the conversation so far,
    so the numbers in it come back at every call, and the library's check is the costliest step of redaction.
    """

    __slots__ = ("memo", "regions")

    def __init__(self, regions: tuple[str, ...]) -> None:
        self.regions = regions
        self.memo: dict[str, tuple[Span, ...]] = {}

    def spans(self, text: str, claimed: Claimed) -> Iterator[Span]:
        for m in _PHONE.finditer(text):
            candidate = m.group()
            start, end = m.span()
            if (sum(c.isdigit() for c in candidate) < 7 or _DATE.fullmatch(candidate)
                    or any(start < e and s < end for s, e, _, _ in claimed)):  # a card's or an IBAN's digits
                continue
            found = self.memo.get(candidate)
            if found is None:
                if len(self.memo) >= _PHONE_MEMO:
                    self.memo.clear()
                found = self.memo[candidate] = tuple(self._numbers(candidate))
            for s, e in found:
                yield start + s, start + e

    def _numbers(self, candidate: str) -> Iterator[Span]:
        """The spans of the phone numbers in ``candidate``, relative to it."""
        international = candidate.startswith(("+", "(+"))
        for region in self.regions[:1] if international else self.regions:
            try:
                valid = phonenumbers.is_valid_number(phonenumbers.parse(candidate, region))
            except phonenumbers.NumberParseException:
                continue
            if not valid:
                continue
            if international:  # a valid number with its country code: no date or amount starts with "+"
                yield 0, len(candidate)
                return
            found = [(n.start, n.end) for n in phonenumbers.PhoneNumberMatcher(
                candidate, region, leniency=phonenumbers.Leniency.STRICT_GROUPING)]
            if found:
                yield from found
                return


#: The built-in detectors, in the order that decides which claims overlapping text.
BUILTIN_DETECTORS: Final = ("private_key", "jwt", "api_key", "email", "iban", "card", "ip", "phone", "high_entropy")

_Spans = Callable[[str, Claimed], Iterator[Span]]
#: What every match of a built-in detector contains one of: a text without any is not scanned further.
_CANDIDATE = re.compile(r"[0-9@]|::|eyJ|PRIVATE KEY|AKIA|ASIA|AIza|xox[bpas]-|gh[pousr]_|github_pat_|[sr]k_|glpat-|hf_"
                        r"|npm_|pypi-", re.ASCII)
#: The shortest match of a built-in detector (an address ``a@b.cd``).
_SHORTEST = 6
_BUILTIN: Final[Mapping[str, _Spans]] = {
    "private_key": _Regex(_PRIVATE_KEY, needle="PRIVATE KEY-----").spans,
    "jwt": _Regex(_JWT, needle="eyJ").spans,
    "api_key": _Regex(_API_KEY).spans,
    "email": _Regex(_EMAIL, needle="@", check=_email_check).spans,
    "iban": _Regex(_IBAN, check=_iban_check).spans,
    "card": _Regex(_CARD, check=_card_check).spans,
    "ip": _ip_spans,
    "high_entropy": _Regex(_TOKEN, check=_token_check).spans,
}


# --- the policy -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Policy:
    """What to redact for one topic prefix: detectors and their actions, field rules, metrics-only mode.

    ``detectors`` maps a detector (built-in or pattern) to its action; a built-in one not named masks.
    ``fields`` maps an event type (or ``"*"``) to its ``glob → action`` rules in the policy's order.
    """

    detectors: Mapping[str, str] = field(default_factory=dict)
    patterns: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    phone_regions: tuple[str, ...] = DEFAULT_PHONE_REGIONS
    fields: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    metrics_only: bool = False
    #: Run classes (``run.started`` ``runClass``) whose runs are metrics-only whatever ``metrics_only`` says.
    metrics_only_classes: frozenset[str] = frozenset()

    def action(self, detector: str) -> str:
        return self.detectors.get(detector, "mask")

    @property
    def hashes(self) -> bool:
        """Whether a detector or a field rule hashes: then a :class:`Redactor` needs the deployment's salt."""
        return any(self.action(name) == "hash" for name in (*BUILTIN_DETECTORS, *self.patterns)) or any(
            action == "hash" for rules in self.fields.values() for action in rules.values())


#: No policy configured: every built-in detector masks every content member.
DEFAULT_POLICY: Final = Policy()


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """A parsed policy file: the policy at its top level and the one of each topic prefix it names."""

    default: Policy
    topics: Mapping[str, Policy] = field(default_factory=dict)

    def for_topic_prefix(self, prefix: str) -> Policy:
        """The policy of topic prefix ``prefix`` (the top level's unless a ``[topics."prefix"]`` section names it)."""
        return self.topics.get(prefix, self.default)


_SECTION_KEYS = frozenset({"metrics_only", "detectors", "phone", "patterns", "fields", "classes"})
_PATTERN_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
_GLOB = re.compile(r"payload(?:\.(?:\*\*|[^.]+))*")


def parse_policy(text: str, *, source: str = "policy") -> PolicyFile:
    """The policy in TOML ``text`` (the module docstring gives the format); ``source`` names it in errors.

    Raises :class:`PolicyError` (code ``redaction_policy_syntax`` for TOML that does not parse,
    ``redaction_policy_invalid`` for an entry that is not understood) with the line of the entry.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None) or _line_of_message(str(e), text)
        raise PolicyError(f"not valid TOML: {str(e).split(' (at ')[0]}", line=line, source=source,
                          code="redaction_policy_syntax") from e

    def fail(path: tuple[str, ...], message: str) -> PolicyError:
        return PolicyError(f"{'.'.join(path)}: {message}", line=_key_line(text, path), source=source)

    version = data.pop("version", POLICY_VERSION)
    if version != POLICY_VERSION:
        raise fail(("version",), f"this agentlog reads policy version {POLICY_VERSION}, not {version!r}")
    topics = data.pop("topics", {})
    if not isinstance(topics, dict):
        raise fail(("topics",), "a table of topic prefixes")
    default = _section(data, DEFAULT_POLICY, (), fail)
    by_prefix = {}
    for prefix, section in topics.items():
        if not isinstance(section, dict):
            raise fail(("topics", prefix), "a table with the keys of the top level")
        by_prefix[prefix] = _section(section, default, ("topics", prefix), fail)
    return PolicyFile(default=default, topics=by_prefix)


_Fail = Callable[[tuple[str, ...], str], PolicyError]


def _section(data: dict[str, Any], base: Policy, at: tuple[str, ...], fail: _Fail) -> Policy:
    """One section (the top level or a topic's) merged over ``base``."""
    for key in data:
        if key not in _SECTION_KEYS:
            raise fail((*at, key), f"unknown key (known: {', '.join(sorted(_SECTION_KEYS | {'version', 'topics'}))})"
                       if not at else f"unknown key (known: {', '.join(sorted(_SECTION_KEYS))})")
    metrics_only = data.get("metrics_only", base.metrics_only)
    if not isinstance(metrics_only, bool):
        raise fail((*at, "metrics_only"), "true or false")
    classes = set(base.metrics_only_classes)
    for name, section in _table(data, "classes", at, fail).items():
        where = (*at, "classes", name)
        if not RUN_CLASS.fullmatch(name):
            raise fail(where, "a run class is letters, digits, '_', '.' and '-' (at most 64)")
        if not isinstance(section, dict):
            raise fail(where, "a table with `metrics_only`")
        for key, value in section.items():
            if key != "metrics_only":
                raise fail((*where, key), "unknown key (known: metrics_only)")
            if not isinstance(value, bool):
                raise fail((*where, key), "true or false")
            (classes.add if value else classes.discard)(name)

    patterns = dict(base.patterns)
    raw_patterns = _table(data, "patterns", at, fail)
    for name, spec in raw_patterns.items():
        where = (*at, "patterns", name)
        if not _PATTERN_NAME.fullmatch(name) or name in BUILTIN_DETECTORS:
            raise fail(where, "a pattern's name is lower case letters, digits and _ (at most 40), and not a "
                       "built-in detector's")
        if not isinstance(spec, dict) or not isinstance(spec.get("regex"), str):
            raise fail(where, 'a table with a `regex` string (and an optional `action`)')
        unknown = set(spec) - {"regex", "action"}
        if unknown:
            raise fail((*where, sorted(unknown)[0]), "unknown key (known: action, regex)")
        try:
            patterns[name] = re.compile(spec["regex"])
        except re.error as e:
            raise fail((*where, "regex"), f"not a valid regex: {e}") from e
        if patterns[name].search(""):
            raise fail((*where, "regex"), "the regex matches the empty string")

    detectors = dict(base.detectors)
    for name, spec in raw_patterns.items():
        detectors[name] = _action(spec.get("action", "mask"), ACTIONS, (*at, "patterns", name, "action"), fail)
    for name, action in _table(data, "detectors", at, fail).items():
        if name not in BUILTIN_DETECTORS and name not in patterns:
            raise fail((*at, "detectors", name), f"no detector of that name (built-in: {', '.join(BUILTIN_DETECTORS)};"
                       " a pattern of the policy's own is declared under [patterns])")
        detectors[name] = _action(action, ACTIONS, (*at, "detectors", name), fail)

    phone_regions = base.phone_regions
    phone = _table(data, "phone", at, fail)
    for key, regions in phone.items():
        if key != "regions":
            raise fail((*at, "phone", key), "unknown key (known: regions)")
        supported = phonenumbers.SUPPORTED_REGIONS
        if (not isinstance(regions, list) or not regions
                or not all(isinstance(r, str) and r in supported for r in regions)):
            raise fail((*at, "phone", "regions"), "a non-empty list of ISO 3166 region codes such as \"DE\"")
        phone_regions = tuple(regions)

    fields = {t: dict(rules) for t, rules in base.fields.items()}
    for event_type, rules in _table(data, "fields", at, fail).items():
        if not isinstance(rules, dict):
            raise fail((*at, "fields", event_type), "a table of `\"path glob\" = action`")
        merged = fields.setdefault(event_type, {})
        for glob, action in rules.items():
            where = (*at, "fields", event_type, glob)
            if not _GLOB.fullmatch(glob):
                raise fail(where, "a path starts with `payload` and names members by `.`, `*` for one and "
                           "`**` for any number")
            merged[glob] = _action(action, FIELD_ACTIONS, where, fail)
    return Policy(detectors=detectors, patterns=patterns, phone_regions=phone_regions, fields=fields,
                  metrics_only=metrics_only, metrics_only_classes=frozenset(classes))


def _table(data: dict[str, Any], key: str, at: tuple[str, ...], fail: _Fail) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise fail((*at, key), "a table")
    return value


def _action(value: Any, allowed: tuple[str, ...], where: tuple[str, ...], fail: _Fail) -> str:
    if value not in allowed:
        raise fail(where, f"{value!r} is not an action here (one of: {', '.join(allowed)})")
    return str(value)


def _line_of_message(message: str, text: str) -> int | None:
    """The line a ``tomllib`` error names: ``(at line 3, column 5)``, or ``(at end of document)``."""
    m = re.search(r"line (\d+)", message)
    if m:
        return int(m.group(1))
    return max(1, len(text.splitlines())) if "end of document" in message else None


def _key_path(fragment: str) -> tuple[str, ...] | None:
    """The key path a TOML table header or dotted key spells, read by ``tomllib`` itself (quoting included)."""
    try:
        data: Any = tomllib.loads(fragment)
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(data, dict) and len(data) == 1:
        name, data = next(iter(data.items()))
        path.append(name)
    return tuple(path)


_HEADER = re.compile(r"\s*(\[\[?)(.+?)\]\]?\s*(?:#.*)?$")
_KEY = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""  # a bare, basic-string or literal-string TOML key
_ASSIGN = re.compile(rf"\s*({_KEY}(?:\s*\.\s*{_KEY})*)\s*=")


def _key_line(text: str, path: tuple[str, ...]) -> int | None:
    """The line (1-based) that defines the longest leading part of ``path``: the entry an error is about."""
    table: tuple[str, ...] = ()
    best, best_len = None, 0
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            table = _key_path(f"[{header.group(2)}]") or ()
            defined = table
        else:
            assign = _ASSIGN.match(line)
            if not assign:
                continue
            key = _key_path(f"{assign.group(1)} = 0")
            if key is None:
                continue
            defined = (*table, *key)
        common = 0
        for a, b in zip(defined, path, strict=False):
            if a != b:
                break
            common += 1
        if common == len(defined) and common > best_len:
            best, best_len = number, common
    return best


# --- applying a policy ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Redacted:
    """A redacted doc and what was done to it: ``{"path", "rule", "action", "count"}`` per member and rule."""

    doc: dict[str, Any]
    summary: tuple[dict[str, Any], ...]


_DROP: Final[Any] = object()


def _glob_regex(glob: str) -> str:
    """``glob`` as a regex over a dotted path: ``*`` within one name, ``**`` any number of names (none too)."""
    head, *names = glob.split(".")
    return re.escape(head) + "".join(r"(?:\.[^.]+)*" if name == "**" else
                                     r"\." + "[^.]*".join(map(re.escape, name.split("*"))) for name in names)


class Redactor:
    """A policy compiled for use: :meth:`redact` applies it to one doc.

    ``salt`` keys the ``hash`` action (HMAC-SHA256): one per deployment, kept secret, so a digest cannot be
    reversed by hashing guesses. A policy that hashes needs one.
    """

    def __init__(self, policy: Policy = DEFAULT_POLICY, *, salt: bytes = b"") -> None:
        self.policy = policy
        self._salt = salt
        spans: dict[str, _Spans] = {}
        for name, pattern in policy.patterns.items():
            spans[name] = _Regex(pattern).spans
        for name in BUILTIN_DETECTORS:
            spans[name] = _Phone(policy.phone_regions).spans if name == "phone" else _BUILTIN[name]
        detectors = [(name, find, policy.action(name)) for name, find in spans.items() if policy.action(name) != "off"]
        self._own = tuple(d for d in detectors if d[0] in policy.patterns)
        self._builtin = tuple(d for d in detectors if d[0] not in policy.patterns)
        self._field_rules: dict[str, tuple[re.Pattern[str], tuple[tuple[str, str], ...]] | None] = {}
        if policy.hashes and not salt:
            raise PolicyError("the policy hashes values, and no salt is configured for it",
                              code="redaction_salt_missing")

    def __repr__(self) -> str:  # the salt never reaches a log
        return f"Redactor({self.policy!r})"

    def redact(self, doc: dict[str, Any], run_class: str | None = None) -> Redacted:
        """``doc`` (of a run of class ``run_class``) with the policy applied to its content members, and the summary
        of what was done. A run of a metrics-only class keeps no content member.

        Copies only what changes: an event without a match is returned as it is.
        """
        payload = doc.get("payload")
        if payload is None:
            return Redacted(doc, ())
        summary: list[dict[str, Any]] = []
        rules = self._rules_for(doc["type"])
        metrics_only = self.policy.metrics_only or run_class in self.policy.metrics_only_classes
        stored = payload
        # content_members walks the payload as published; each change copies the objects on its way only.
        for path, value in content_members(payload, clear_tree(doc["type"])):
            if is_sealed(value):
                continue
            counts: dict[tuple[str, str], int] = {}
            if metrics_only:
                new: Any = _DROP
                counts[METRICS_ONLY, "drop"] = 1
            else:
                new = self._value(value, ".".join(("payload", *path)) if rules is not None else "", rules, counts)
            if counts:
                where = ".".join(("payload", *path))
                summary += ({"path": where, "rule": r, "action": a, "count": n} for (r, a), n in counts.items())
            if new is not value:
                stored = _replace(stored, path, new)
        return Redacted(doc if stored is payload else {**doc, "payload": stored}, tuple(summary))

    def stored(self, doc: dict[str, Any], run_class: str | None = None) -> dict[str, Any]:
        """``doc`` as the sequencer stores it: redacted, what was done recorded in ``payload["$redactions"]``.

        A ``$redactions`` member the host published is removed first: only the sequencer writes it (it is metadata,
        so a host's would otherwise pass unredacted and unsealed). Copies only what changes.
        """
        payload = doc.get("payload")
        if isinstance(payload, dict) and REDACTIONS in payload:
            payload = {k: v for k, v in payload.items() if k != REDACTIONS}
            doc = {**doc, "payload": payload}
        out = self.redact(doc, run_class)
        if not out.summary:
            return out.doc
        record = list(out.summary)
        redacted = out.doc.get("payload")
        if isinstance(redacted, dict):
            return {**out.doc, "payload": {**redacted, REDACTIONS: record}}
        wrapped: dict[str, Any] = {REDACTIONS: record}
        if redacted is not None:
            wrapped[VALUE] = redacted
        return {**out.doc, "payload": wrapped}

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """A model request as the sequencer stores it in an ``agent.invocation.started``: what a replay of a redacted
        recording looks its calls up by (:mod:`agentlog.core.result_cache`)."""
        doc = self.redact({"type": "agent.invocation.started", "payload": {"request": request}}).doc
        return dict(doc["payload"]["request"])

    def rejection(self, rejected: Mapping[str, Any], members: Iterable[str], run_class: str | None = None,
                  ) -> dict[str, Any]:
        """A rejection record (``schemas/CONTRACT.md``) with its content ``members`` redacted: ``raw`` (the original
        bytes, base64) and ``detail`` where it quotes them. Bytes that did not decode have no fields, so every
        detector runs over the whole text (bytes that are not UTF-8 pass through as they were); a match whose
        action drops, or metrics-only mode, empties the member. What was done goes in the record's ``redactions``,
        entries as in ``$redactions`` with the member as the path. Copies only what changes.
        """
        metrics_only = self.policy.metrics_only or run_class in self.policy.metrics_only_classes
        out: dict[str, Any] | None = None
        summary: list[dict[str, Any]] = []
        for member in members:
            value = rejected.get(member)
            if not isinstance(value, str) or not value:
                continue
            raw = member == "raw"
            text = base64.b64decode(value).decode("utf-8", "surrogateescape") if raw else value
            counts: dict[tuple[str, str], int] = {}
            if metrics_only:
                new: Any = _DROP
                counts[METRICS_ONLY, "drop"] = 1
            else:
                new = self._text(text, counts)
            if new is text:
                continue
            new = "" if new is _DROP else new
            if out is None:
                out = dict(rejected)
            out[member] = base64.b64encode(new.encode("utf-8", "surrogateescape")).decode("ascii") if raw else new
            summary += ({"path": member, "rule": r, "action": a, "count": n} for (r, a), n in counts.items())
        if out is None:
            return dict(rejected)
        out[REJECTION_REDACTIONS] = summary
        return out

    def _rules_for(self, event_type: str) -> tuple[re.Pattern[str], tuple[tuple[str, str], ...]] | None:
        """One regex over every glob of ``event_type``'s rules and ``"*"``'s, each glob a named group in order."""
        if event_type not in self._field_rules:
            ordered = [*self.policy.fields.get(event_type, {}).items(),
                       *(self.policy.fields.get("*", {}).items() if event_type != "*" else ())]
            if not ordered:
                self._field_rules[event_type] = None
            else:
                regex = "|".join(f"(?P<r{i}>{_glob_regex(g)})" for i, (g, _) in enumerate(ordered))
                self._field_rules[event_type] = (re.compile(f"(?:{regex})\\Z"), tuple(ordered))
        return self._field_rules[event_type]

    def _value(self, value: Any, where: str, rules: tuple[re.Pattern[str], tuple[tuple[str, str], ...]] | None,
               counts: dict[tuple[str, str], int]) -> Any:
        """``value`` redacted, the same object when nothing changes, :data:`_DROP` when it goes."""
        if rules is not None:
            m = rules[0].match(where)
            if m is not None:
                glob, action = rules[1][int(m.lastgroup[1:])] if m.lastgroup else rules[1][0]
                if action == "keep":
                    return value
                counts[f"field:{glob}", action] = counts.get((f"field:{glob}", action), 0) + 1
                return self._replacement("field", value, action)
        if isinstance(value, str):
            return self._text(value, counts)
        if isinstance(value, dict):
            out: dict[str, Any] | None = None
            for key, item in value.items():
                new = self._value(item, f"{where}.{key}" if rules is not None else where, rules, counts)
                if new is not item:
                    if out is None:
                        out = dict(value)
                    if new is _DROP:
                        del out[key]
                    else:
                        out[key] = new
            return value if out is None else out
        if isinstance(value, list):
            items: list[Any] | None = None
            for i, item in enumerate(value):
                new = self._value(item, f"{where}.{i}" if rules is not None else where, rules, counts)
                if new is not item:
                    if items is None:
                        items = list(value[:i])
                    if new is not _DROP:
                        items.append(new)
                elif items is not None:
                    items.append(item)
            return value if items is None else items
        if type(value) is int and abs(value) >= 1_000_000:
            text = str(value)
            new = self._text(text, counts)
            return value if new is text else new
        return value

    def _text(self, text: str, counts: dict[tuple[str, str], int]) -> Any:
        claimed: Claimed = []
        detectors = self._builtin if len(text) >= _SHORTEST and _CANDIDATE.search(text) else ()
        for name, find, action in (*self._own, *detectors):
            for start, end in find(text, claimed):
                if start < end and all(end <= s or start >= e for s, e, _, _ in claimed):
                    claimed.append((start, end, name, action))
        if not claimed:
            return text
        claimed.sort()
        out, at = [], 0
        dropped = False
        for start, end, name, action in claimed:
            counts[name, action] = counts.get((name, action), 0) + 1
            dropped = dropped or action == "drop"
            out.append(text[at:start])
            out.append(self._replacement(name, text[start:end], action))
            at = end
        if dropped:
            return _DROP
        out.append(text[at:])
        return "".join(out)

    def _replacement(self, kind: str, value: Any, action: str) -> Any:
        if action == "drop":
            return _DROP
        if action == "mask":
            return f"[REDACTED:{kind}]"
        data = value.encode() if isinstance(value, str) else jcs(value)
        return f"[HASH:{kind}:{hmac.new(self._salt, data, hashlib.sha256).hexdigest()[:16]}]"


def stored_metrics_only(docs: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a run (its stored docs) was stored metrics-only: some event's content dropped by that mode. Such a run
    holds no content, so it cannot be replayed (reason ``metrics_only``); its metadata still verifies and adds up."""
    for doc in docs:
        payload = doc.get("payload")
        record = payload.get(REDACTIONS) if isinstance(payload, dict) else None
        if isinstance(record, list) and any(isinstance(r, dict) and r.get("rule") == METRICS_ONLY for r in record):
            return True
    return False


def metrics_only_error(run_id: str) -> ReplayError:
    """The refusal of a replay whose source run was stored metrics-only (code ``metrics_only``)."""
    return ReplayError(f"run {run_id} was stored metrics-only (its topic prefix's redaction policy has metrics_only "
                       "= true): it holds no content to replay; its metadata, analytics and verification remain",
                       code="metrics_only")


def _replace(payload: Any, path: tuple[str, ...], value: Any) -> Any:
    """``payload`` with the member at ``path`` replaced (removed for :data:`_DROP`), copying only the objects on
    the way; the whole payload dropped reads ``null``."""
    if not path:
        return None if value is _DROP else value
    out = dict(payload)
    if len(path) == 1:
        if value is _DROP:
            del out[path[0]]
        else:
            out[path[0]] = value
        return out
    out[path[0]] = _replace(payload[path[0]], path[1:], value)
    return out

