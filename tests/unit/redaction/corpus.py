"""The redaction corpus: planted secrets and personal data, and clean look-alikes, inside realistic agent events.

``python -m tests.unit.redaction.corpus`` writes ``planted.jsonl`` and ``clean.jsonl`` beside this file (checked in,
so a reviewer reads the values); ``test_corpus.py`` checks that the files are what this module writes.

Each line is ``{"kind", "value", "where", "lang", "doc"}``: the value, the content field it was put in (a dotted
path), the language of the text around it, and the RunEventDoc. Card numbers get their Luhn digit and IBANs their
mod-97 check digits from the implementations below, written from the standards (ISO/IEC 7812-1 annex B, ISO 7064
MOD 97-10), not from the code under test. Values are drawn from a seeded generator: the files are the same on every
run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLANTED = HERE / "planted.jsonl"
CLEAN = HERE / "clean.jsonl"

B62 = string.ascii_letters + string.digits


# --- checksums, from the standards -------------------------------------------------------------------------------


def luhn_digit(partial: str) -> str:
    """The check digit that makes ``partial + digit`` pass Luhn: double every second digit from the right of the
    full number (the first from the right of ``partial``), sum the digits."""
    total = 0
    for i, c in enumerate(reversed(partial)):
        d = int(c) * (2 if i % 2 == 0 else 1)
        total += d - 9 if d > 9 else d
    return str((10 - total % 10) % 10)


def luhn_ok(number: str) -> bool:
    return luhn_digit(number[:-1]) == number[-1]


def _iban_int(text: str) -> int:
    return int("".join(str(int(c, 36)) for c in text))


def iban(country: str, bban: str) -> str:
    """ISO 13616: check digits 98 - (BBAN + country + "00" as a number, letters A=10 … Z=35) mod 97."""
    check = 98 - _iban_int(bban + country + "00") % 97
    return f"{country}{check:02d}{bban}"


def iban_ok(value: str) -> bool:
    compact = value.replace(" ", "")
    return _iban_int(compact[4:] + compact[:4]) % 97 == 1


# --- planted values -------------------------------------------------------------------------------------------

# (scheme, issuer prefixes, lengths, grouping)
CARD_SCHEMES = [
    ("visa", ["4"], [16, 13, 19], (4, 4, 4, 4)),
    ("mastercard", ["51", "52", "53", "54", "55", "2221", "2720", "2500"], [16], (4, 4, 4, 4)),
    ("amex", ["34", "37"], [15], (4, 6, 5)),
    ("discover", ["6011", "65", "644"], [16], (4, 4, 4, 4)),
    ("jcb", ["3528", "3589"], [16], (4, 4, 4, 4)),
    ("diners", ["36", "300", "38"], [14], (4, 6, 4)),
    ("unionpay", ["62"], [16, 19], (4, 4, 4, 4)),
]
#: Test numbers the card schemes publish (they pass Luhn).
PUBLISHED_CARDS = ["4111111111111111", "4242424242424242", "5555555555554444", "378282246310005",
                   "6011111111111117", "3530111333300000", "5105105105105100", "4012888888881881"]

# ISO 13616 BBAN formats: (country, [(count, "n" digits | "a" upper letters | "c" either)])
IBAN_FORMATS = [
    ("DE", [(18, "n")]), ("AT", [(16, "n")]), ("CH", [(5, "n"), (12, "c")]), ("FR", [(10, "n"), (11, "c"), (2, "n")]),
    ("ES", [(20, "n")]), ("IT", [(1, "a"), (10, "n"), (12, "c")]), ("GB", [(4, "a"), (14, "n")]),
    ("NL", [(4, "a"), (10, "n")]), ("BE", [(12, "n")]), ("PL", [(24, "n")]), ("SE", [(20, "n")]),
    ("NO", [(11, "n")]), ("IE", [(4, "a"), (14, "n")]), ("PT", [(21, "n")]), ("DK", [(14, "n")]),
]
#: Examples the banking registries publish.
PUBLISHED_IBANS = ["DE89 3704 0044 0532 0130 00", "GB29 NWBK 6016 1331 9268 19", "FR14 2004 1010 0505 0001 3M02 606",
                   "ES91 2100 0418 4502 0005 1332", "NL91 ABNA 0417 1643 00", "CH93 0076 2011 6238 5295 7",
                   "BE68 5390 0754 7034", "AT61 1904 3002 3457 3201"]

EMAILS = [
    "alice@example.com", "bob.smith+invoices@example.org", "carol_o'neil@sub.example.co.uk", "dave-99@mail.example.io",
    "Eve.Adams@Example.COM", "frank+agentlog+test@example.net", "grace.hopper@navy.example.mil",
    "heidi@xn--bcher-kva.example", "müller@bücher.de", "josé.garcía@correo.example.es", "françois@société.fr",
    "用户@例子.广告", "δοκιμή@παράδειγμα.δοκιμή", "taro.yamada@example.co.jp", "ivan@пример.рф",
    "support@status.example.com", "no-reply@notifications.example.app", "x@example.museum",
    "first.last@department.university.example.edu", "kim+2026-11@example.kr", "o.riley@example.ie",
    "sales@shop.example.de", "jean.dupont@orange.example.fr", "maria.lopez@telefonica.example.es",
    "hanako@docomo.example.ne.jp", "ops-oncall+pager@example.dev", "a.b.c.d@e.example.org",
    "UPPER.CASE@EXAMPLE.ORG", "billing.team@invoices.example.com", "1234567@example.com",
]

PHONES = [
    # (region of the text, number as written)
    ("en", "+1 415-555-0132"), ("en", "(212) 555-0187"), ("en", "+1 (646) 555-0143"), ("en", "212-555-0199"),
    ("en", "+44 20 7946 0958"), ("en", "020 7946 0321"), ("en", "07911 123456"), ("en", "+44 7400 123456"),
    ("de", "+49 30 901820"), ("de", "030 12345678"), ("de", "+49 151 23456789"), ("de", "0151 23456789"),
    ("de", "+49 89 1234567"), ("de", "089 1234567"),
    ("fr", "+33 6 12 34 56 78"), ("fr", "06 12 34 56 78"), ("fr", "01 42 68 53 00"), ("fr", "+33 1 42 68 53 00"),
    ("fr", "07 81 23 45 67"),
    ("es", "+34 612 345 678"), ("es", "612 34 56 78"), ("es", "91 123 45 67"), ("es", "+34 91 123 45 67"),
    ("ja", "03-1234-5678"), ("ja", "090-1234-5678"), ("ja", "+81 90-1234-5678"), ("ja", "+81 3-1234-5678"),
    ("ja", "06-6123-4567"), ("en", "+61 2 9876 5432"), ("en", "+91 98765 43210"),
]

IPS = ["203.0.113.7", "198.51.100.23", "192.0.2.146", "10.12.4.201", "172.16.254.3", "192.168.1.20",
       "8.8.8.8", "81.2.69.160", "2001:db8::8a2e:370:7334", "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
       "fe80::1ff:fe23:4567:890a", "2a00:1450:4001:81b::200e", "2001:db8:0:1:1:1:1:1", "::ffff:192.0.2.128",
       "2606:4700:4700::1111", "fd12:3456:789a:1::1", "100.64.0.17", "185.199.108.153", "2001:db8:a0b:12f0::1",
       "93.184.216.34"]


def _cards(rng: random.Random) -> Iterator[str]:
    yield from PUBLISHED_CARDS
    for _scheme, prefixes, lengths, grouping in CARD_SCHEMES:
        for prefix in prefixes:
            for length in lengths[:2]:
                body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
                number = body + luhn_digit(body)
                assert luhn_ok(number)
                style = rng.choice(["plain", "spaced", "dashed"])
                if style == "plain" or len(number) != sum(grouping):
                    yield number
                else:
                    parts, at = [], 0
                    for g in grouping:
                        parts.append(number[at:at + g])
                        at += g
                    yield (" " if style == "spaced" else "-").join(parts)


def _ibans(rng: random.Random) -> Iterator[str]:
    yield from PUBLISHED_IBANS
    alphabet = {"n": string.digits, "a": string.ascii_uppercase, "c": string.ascii_uppercase + string.digits}
    for i, (country, fmt) in enumerate(IBAN_FORMATS * 2):
        bban = "".join(rng.choice(alphabet[kind]) for count, kind in fmt for _ in range(count))
        value = iban(country, bban)
        assert iban_ok(value)
        yield " ".join(value[j:j + 4] for j in range(0, len(value), 4)) if i % 2 else value


def _api_keys(rng: random.Random) -> Iterator[str]:
    def r(n: int, alphabet: str = B62) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    for _ in range(3):
        yield "sk-" + r(48)
        yield "sk-proj-" + r(40, B62 + "-_") + r(8)
        yield "sk-ant-api03-" + r(93, B62 + "-_") + "AA"
        yield "AKIA" + r(16, string.ascii_uppercase + "234567")
        yield "ASIA" + r(16, string.ascii_uppercase + "234567")
        yield "ghp_" + r(36)
        yield "gho_" + r(36)
        yield "github_pat_11" + r(20, string.ascii_uppercase + string.digits) + "_" + r(59)
        yield "xoxb-" + r(12, string.digits) + "-" + r(13, string.digits) + "-" + r(24)
        yield "xoxp-" + r(12, string.digits) + "-" + r(12, string.digits) + "-" + r(13, string.digits) + "-" + r(32, "0123456789abcdef")
        yield "AIza" + r(35, B62 + "-_")
        yield "sk_live_" + r(24)
        yield "rk_live_" + r(24)
    yield "xoxa-2-" + r(40)
    yield "xoxs-" + r(40)
    yield "hf_" + r(34)
    yield "glpat-" + r(20, B62 + "-_")
    yield "npm_" + r(36)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwts(rng: random.Random) -> Iterator[str]:
    for i in range(10):
        header = {"alg": ["HS256", "RS256", "ES256"][i % 3], "typ": "JWT"}
        claims = {"sub": str(uuid.UUID(int=rng.getrandbits(128))), "iat": 1764300000 + i, "scope": "read write",
                  "email": f"user{i}@example.com"}
        signature = bytes(rng.getrandbits(8) for _ in range(32 if i % 3 == 0 else 64))
        yield ".".join((_b64url(json.dumps(header, separators=(",", ":")).encode()),
                        _b64url(json.dumps(claims, separators=(",", ":")).encode()), _b64url(signature)))


def _private_keys(rng: random.Random) -> Iterator[str]:
    for label in ("RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
        body = base64.b64encode(bytes(rng.getrandbits(8) for _ in range(rng.choice([121, 256, 633])))).decode()
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        yield "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"])


def _tokens(rng: random.Random) -> Iterator[str]:
    for i in range(15):
        yield "".join(rng.choice(B62 + ("-_" if i % 3 == 0 else "")) for _ in range(rng.choice([32, 40, 48, 64])))


def planted_values() -> list[tuple[str, str]]:
    """``(kind, value)``: the kind is the detector that must find the value."""
    rng = random.Random(20261128)
    values = [("card", v) for v in _cards(rng)]
    values += [("iban", v) for v in _ibans(rng)]
    values += [("email", v) for v in EMAILS]
    values += [("api_key", v) for v in _api_keys(rng)]
    values += [("jwt", v) for v in _jwts(rng)]
    values += [("private_key", v) for v in _private_keys(rng)]
    values += [("high_entropy", v) for v in _tokens(rng)]
    values += [("phone", v) for _, v in PHONES]
    values += [("ip", v) for v in IPS]
    return values


# --- text around a value, in several languages ------------------------------------------------------------------

SENTENCES = {
    "en": ["Please update my billing details: {v}. Thanks!", "The customer wrote: \"you can reach me at {v}\".",
           "Found in the config file: {v} (line 12).", "Use {v} for the next step, then report back."],
    "de": ["Bitte aktualisieren Sie meine Daten: {v}. Vielen Dank!", "Der Kunde schrieb: „erreichbar unter {v}“.",
           "In der Konfiguration gefunden: {v} (Zeile 12).", "Verwende {v} für den nächsten Schritt."],
    "fr": ["Merci de mettre à jour mes coordonnées : {v}. Bonne journée !", "Le client a écrit : « joignable au {v} ».",
           "Trouvé dans le fichier de configuration : {v} (ligne 12).", "Utilise {v} pour l'étape suivante."],
    "es": ["Por favor, actualice mis datos: {v}. ¡Gracias!", "El cliente escribió: «puede contactarme en {v}».",
           "Encontrado en el archivo de configuración: {v} (línea 12).", "Usa {v} para el siguiente paso."],
    "ja": ["お支払い情報を更新してください：{v}。よろしくお願いします。", "お客様より「連絡先は {v} です」とのことです。",
           "設定ファイルに {v} が見つかりました（12行目）。", "次の手順では{v}を使ってください。"],
}
LANGS = list(SENTENCES)
PHONE_LANG = {v: lang for lang, v in PHONES}


def _text(rng: random.Random, lang: str, value: str) -> str:
    return rng.choice(SENTENCES[lang]).format(v=value)


def _doc(rng: random.Random, i: int, type_: str, payload: Any) -> dict[str, Any]:
    run = uuid.UUID(int=rng.getrandbits(128), version=4)
    return {"eventId": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "runId": f"run-{str(run)[:8]}",
            "type": type_, "payload": payload, "timestamp": f"2026-11-28T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "sequence": i % 40, "nodeId": rng.choice(["planner", "researcher", "billing-agent", "writer"])}


def _cache_key(rng: random.Random) -> str:
    return "sha256:" + hashlib.sha256(rng.randbytes(16)).hexdigest()


# Each placement puts a text (or the bare value) into a content field of an event and says where it is.
Placement = Callable[[random.Random, int, str, str], tuple[str, dict[str, Any]]]


def _in_messages(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.request.messages", _doc(rng, i, "agent.invocation.started", {
        "request": {"provider": "openai", "model": "gpt-5", "temperature": 0.2, "maxOutputTokens": 1024,
                    "messages": [{"role": "system", "content": "You are a careful billing assistant."},
                                 {"role": "user", "content": [{"type": "text", "text": text}]}]},
        "cacheKey": _cache_key(rng), "recipe": "openwop-semantic-request-v2"})


def _in_system(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.request.system", _doc(rng, i, "agent.invocation.started", {
        "request": {"provider": "anthropic", "model": "claude-sonnet-4", "system": f"Context for this session. {text}",
                    "messages": [{"role": "user", "content": "Summarise the account."}]},
        "cacheKey": _cache_key(rng), "recipe": "openwop-semantic-request-v2"})


def _in_output(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.envelope", _doc(rng, i, "agent.invocation.completed", {
        "cacheKey": _cache_key(rng), "finishReason": "stop",
        "usage": {"inputTokens": rng.randint(200, 9000), "outputTokens": rng.randint(20, 900)},
        "envelope": {"kind": "message", "content": [{"type": "text", "text": text}]}})


def _in_tool_args(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.args", _doc(rng, i, "agent.toolCalled", {
        "callId": f"call_{rng.getrandbits(40):010x}", "tool": "crm.update_contact",
        "args": {"contact": {"id": rng.randint(1000, 99999), "fields": [{"name": "note", "value": text}],
                             "raw": value}, "dryRun": False}})


def _in_tool_result(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.result", _doc(rng, i, "agent.toolReturned", {
        "callId": f"call_{rng.getrandbits(40):010x}", "tool": "search.documents", "isError": False,
        "result": {"hits": [{"score": 0.87, "snippet": "no match here"},
                            {"score": 0.81, "snippet": text, "meta": {"tags": ["inbox", value]}}], "total": 2}})


def _in_variable(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.value", _doc(rng, i, "variable.changed", {"name": "customer_profile", "value": {
        "notes": [text], "contact": {"primary": value}, "verified": True}})


def _in_channel(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.value", _doc(rng, i, "channel.written", {"channel": "handoff", "value": [[text]]})


def _in_error(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.error.message", _doc(rng, i, "run.failed", {
        "status": "failed", "error": {"code": "tool_failed", "message": f"Tool call failed: {text}",
                                      "retryable": False}})


def _in_upstream(rng: random.Random, i: int, text: str, value: str) -> tuple[str, dict[str, Any]]:
    return "payload.message", _doc(rng, i, "conversation.exchanged", {"agentId": "support", "message": text})


PLACEMENTS: list[Placement] = [_in_messages, _in_system, _in_output, _in_tool_args, _in_tool_result, _in_variable,
                               _in_channel, _in_error, _in_upstream]


def planted() -> list[dict[str, Any]]:
    rng = random.Random(7)
    out = []
    for i, (kind, value) in enumerate(planted_values()):
        lang = PHONE_LANG.get(value, LANGS[i % len(LANGS)]) if kind == "phone" else LANGS[i % len(LANGS)]
        place = PLACEMENTS[i % len(PLACEMENTS)]
        where, doc = place(rng, i, _text(rng, lang, value), value)
        out.append({"kind": kind, "value": value, "where": where, "lang": lang, "doc": doc})
    return out


# --- clean look-alikes ------------------------------------------------------------------------------------------

#: A 1x1 PNG and a 1x1 GIF, as agents pass images inline.
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
GIF_1X1 = "R0lGODlhAQABAIAAAP///wAAACH5BAEAAAAALAAAAAABAAEAAAICRAEAOw=="


def clean_values() -> list[tuple[str, str]]:
    """``(kind, value)`` of text an agent writes that none of the detectors may touch."""
    rng = random.Random(42)
    v: list[tuple[str, str]] = []
    for _ in range(15):
        v.append(("uuid", str(uuid.UUID(int=rng.getrandbits(128), version=4))))
    for _ in range(5):
        v.append(("uuid", str(uuid.UUID(int=rng.getrandbits(128), version=4)).upper()))
    for _ in range(10):
        v.append(("sha256", hashlib.sha256(rng.randbytes(32)).hexdigest()))
    for _ in range(10):
        sha = hashlib.sha1(rng.randbytes(20)).hexdigest()
        v.append(("commit", sha if len(v) % 2 else sha[:7]))
    for _ in range(10):
        v.append(("cache_key", "sha256:" + hashlib.sha256(rng.randbytes(8)).hexdigest()))
    for _ in range(8):
        v.append(("run_id", f"run-{rng.getrandbits(32):08x}"))
    for _ in range(4):
        v.append(("run_id", str(uuid.UUID(int=rng.getrandbits(128), version=4))))
    for _ in range(6):
        ulid = "01J" + "".join(rng.choice("0123456789ABCDEFGHJKMNPQRSTVWXYZ") for _ in range(23))
        v.append(("ulid", ulid))
    for _ in range(10):
        y, m, d = rng.randint(2019, 2027), rng.randint(1, 12), rng.randint(1, 28)
        v.append(("date", rng.choice([f"{y}-{m:02d}-{d:02d}", f"{d:02d}.{m:02d}.{y}", f"{m}/{d}/{y}",
                                      f"{y}年{m}月{d}日", f"{d} {['janvier', 'mars', 'juin'][m % 3]} {y}"])))
    for _ in range(10):
        y, m, d, hh, mm, ss = (rng.randint(2019, 2027), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                               rng.randint(0, 59), rng.randint(0, 59))
        v.append(("timestamp", rng.choice([f"{y}-{m:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}Z",
                                           f"{y}-{m:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}.{rng.randint(0, 999999):06d}+01:00",
                                           f"{y}-{m:02d}-{d:02d} {hh:02d}:{mm:02d}:{ss:02d}",
                                           f"{hh:02d}:{mm:02d}:{ss:02d}",
                                           str(rng.randint(1_600_000_000_000, 1_800_000_000_000))])))
    for _ in range(10):
        a, b, c = rng.randint(0, 12), rng.randint(0, 40), rng.randint(0, 99)
        v.append(("version", rng.choice([f"{a}.{b}.{c}", f"v{a}.{b}.{c}", f"{a}.{b}.{c}-rc.{rng.randint(1, 9)}",
                                         f"v{a}.{b}.{c}.{rng.randint(0, 9)}", f"python{3}.{b % 14}"])))
    v += [("version", "10.0.19041.1"), ("version", "1.2.3+build.20261128")]
    for _ in range(12):
        amount = rng.randint(1, 250_000) / 100
        v.append(("price", rng.choice([f"${amount:,.2f}", f"{amount:,.2f} €".replace(",", " ").replace(".", ","),
                                       f"¥{int(amount * 100):,}", f"£{amount:.2f}", f"EUR {amount:.2f}",
                                       f"{int(amount * 1000):,} JPY"])))
    for _ in range(12):
        v.append(("order", rng.choice([f"ORD-{rng.randint(2019, 2027)}-{rng.randint(0, 999999):06d}",
                                       f"#{rng.randint(10000, 9999999)}", f"INV-{rng.randint(0, 99999999):08d}",
                                       f"PO{rng.randint(100000, 999999)}", f"A{rng.randint(10, 99)}-{rng.randint(1000, 9999)}",
                                       f"order {rng.randint(100000, 99999999)}"])))
    v += [("path", p) for p in [
        "/home/alice/projects/agentlog/processors/core/redaction.py", "C:\\Users\\Public\\Documents\\report_2026.xlsx",
        "src/components/Button/Button.test.tsx", "~/.config/agentlog/policy.toml", "s3://acme-data-lake/raw/2026/11/28/events-00042.parquet",
        "/var/log/nginx/access.log.2.gz", "./node_modules/@types/node/index.d.ts", "gs://bucket-eu/models/ckpt-12000/model.safetensors",
        "/usr/lib/python3.11/site-packages/pydantic/main.py", "assets/icons/icon@2x.png"]]
    v += [("url", u) for u in [
        "https://docs.python.org/3/library/re.html#re.ASCII", "https://github.com/acme/widgets/pull/1234/files",
        "https://example.com/api/v2/users?page=3&per_page=50", "http://localhost:8080/healthz",
        "https://www.example.org/2026/11/28/announcing-v2.html"]]
    v += [("identifier", s) for s in [
        "HTTP2ConnectionPoolManager", "getUserAccountBalance2", "AgentInvocationStarted", "test_redaction_corpus_v2",
        "OpenAIChatCompletionV2Client", "claude-3-5-sonnet-20241022", "gpt-4o-mini-2024-07-18", "text-embedding-3-large",
        "worker-7d9f8c6b5-x2x9q", "std::vector<int>", "x[1::2]", "Base64EncodedImageData", "MAX_OUTPUT_TOKENS_PER_REQUEST",
        "llama-3.1-70b-instruct", "@types/node@20.11.5", "numpy==2.1.3", "ResourceExhausted", "agentlog.core.redaction"]]
    v += [("number", n) for n in ["1,234,567 tokens", "42", "3.14159", "52.5200, 13.4050", "978-3-16-148410-0",
                                  "0.000134 USD", "12.5%", "HTTP 503", "port 5432", "128000", "offset 18274619",
                                  "sequence 000412", "10:00-18:00", "2x3x4", "1e-9", "24/7"]]
    v += [("network", n) for n in ["127.0.0.1", "0.0.0.0:8080", "localhost:19192", "::1", "00:1A:2B:3C:4D:5E",
                                   "10:45:12.123"]]
    v += [("image", f"data:image/png;base64,{PNG_1X1}"), ("image", PNG_1X1), ("image", GIF_1X1),
          ("image", "data:image/gif;base64," + GIF_1X1)]
    digest = "sha256:" + hashlib.sha256(b"image").hexdigest()
    v += [("digest", f"ghcr.io/acme/agent@{digest}"), ("digest", digest.upper().replace("SHA256:", "sha256:")),
          ("digest", "md5:" + hashlib.md5(b"x").hexdigest()), ("digest", hashlib.sha512(b"y").hexdigest()),
          ("digest", base64.b64encode(hashlib.sha256(b"z").digest()).decode()),
          ("digest", "sha384-" + base64.b64encode(hashlib.sha384(b"script").digest()).decode()),
          ("digest", "sha256-" + base64.b64encode(hashlib.sha256(b"style").digest()).decode())]
    # Ids that model and payment APIs mint: random-looking, passed around by agents, not secrets.
    v += [("api_id", "chatcmpl-" + "".join(rng.choice(B62) for _ in range(29))) for _ in range(3)]
    v += [("api_id", "call_" + "".join(rng.choice(B62) for _ in range(24))) for _ in range(3)]
    v += [("api_id", "msg_01" + "".join(rng.choice(B62) for _ in range(22))) for _ in range(2)]
    v += [("api_id", "toolu_01" + "".join(rng.choice(B62) for _ in range(22))) for _ in range(2)]
    v += [("api_id", "pi_3" + "".join(rng.choice(B62) for _ in range(23))), ("api_id", "cus_NffrFeUfNV2Hib")]
    v += [("misc", s) for s in [
        "arn:aws:iam::123456789012:role/agent-runner", "refs/heads/feature/redaction-policy", "python:3.11-slim-bookworm",
        "node:20.11.1-alpine3.19", "2026-W48", "PT1H30M", "1h23m45s", "ext. 4521", "10115 Berlin", "75008 Paris",
        "〒100-0001", "#1E90FF", "{3F2504E0-4F89-11D3-9A0C-0305E82C3301}", "^1.2.0", "~=3.11", "RFC 9110",
        "ISO 8601", "EN 1090-2", "DIN 5008", "JIS X 0208", "page 12 of 340", "3 × 4 = 12", "+/- 0.5 mm",
        "(555 items)", "PR #1234", "issue 42", "CVE-2024-3094", "E11000 duplicate key", "errno 111",
        "0x7ffee4b2c8a0", "tel: see CRM", "Mo-Fr 9-17 Uhr", "9h-18h", "午前9時〜午後6時",
        "2026/11/28 10:00:00", "28/11/2026", "Q4 2026", "FY2026", "1.299,00 EUR", "12 345,67 €",
        "4 items x 19.99 = 79.96", "ID 4839201745", "ticket 1029384756", "shipment 00340434161094022115"]]
    return v


CLEAN_SENTENCES = {
    "en": ["Step 3 finished; recorded {v} in the summary.", "Compare {v} with the previous run before merging.",
           "The log line says {v} and nothing else."],
    "de": ["Schritt 3 ist fertig; {v} steht in der Zusammenfassung.", "Vergleiche {v} mit dem letzten Lauf."],
    "fr": ["Étape 3 terminée ; {v} figure dans le résumé.", "Compare {v} avec l'exécution précédente."],
    "es": ["Paso 3 terminado; {v} queda en el resumen.", "Compara {v} con la ejecución anterior."],
    "ja": ["手順3が完了し、{v}を要約に記録しました。", "前回の実行と{v}を比較してください。"],
}


def clean() -> list[dict[str, Any]]:
    rng = random.Random(11)
    out = []
    for i, (kind, value) in enumerate(clean_values()):
        lang = LANGS[i % len(LANGS)]
        text = rng.choice(CLEAN_SENTENCES[lang]).format(v=value)
        where, doc = PLACEMENTS[i % len(PLACEMENTS)](rng, i, text, value)
        out.append({"kind": kind, "value": value, "where": where, "lang": lang, "doc": doc})
    return out


def lines(entries: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n" for e in entries)


def main() -> None:
    PLANTED.write_text(lines(planted()), "utf-8")
    CLEAN.write_text(lines(clean()), "utf-8")
    print(f"{PLANTED}: {len(planted())} values; {CLEAN}: {len(clean())} values")


if __name__ == "__main__":
    main()
