"""The fault suite's ledger: every test adds what it sent, what was accepted/rejected, lost, duplicated.

At the end of the session the totals are printed in the terminal summary and written to
``.agentlog/fault-summary.json``, so a CI log (or a human) sees in one place that the suite
pushed N events through crashes, broker loss and garbage and lost none.

``lost`` and ``duplicated`` are counts a test made (``tests/faults/accounting.py`` counts them by
source position); a test that does not pass them is listed as "not counted", never as zero.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUMMARY_PATH = REPO / ".agentlog" / "fault-summary.json"


class FaultLedger:
    def __init__(self) -> None:
        self.seconds = 0.0  # wall time of the fault tests themselves (setup + call + teardown)
        self.sent = 0
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.violations: Counter[str] = Counter()
        self.lost = 0
        self.duplicated = 0
        self.not_counted: list[str] = []  # tests that recorded no lost/duplicated count
        self.tests: dict[str, dict] = {}

    def record(self, test: str, *, sent: int = 0, accepted: int = 0, rejected: dict | None = None,
               violations: dict | None = None, lost: int | None = None, duplicated: int | None = None,
               **extra) -> None:
        """``lost``/``duplicated``: None (the default) means the test did not count them (listed as such
        when it sent events)."""
        self.sent += sent
        self.accepted += accepted
        self.rejected.update(rejected or {})
        self.violations.update(violations or {})
        if sent and (lost is None or duplicated is None):
            self.not_counted.append(test)
        self.lost += lost or 0
        self.duplicated += duplicated or 0
        self.tests[test] = {"sent": sent, "accepted": accepted, "rejected": dict(rejected or {}),
                            "violations": dict(violations or {}), "lost": lost, "duplicated": duplicated, **extra}

    def to_dict(self) -> dict:
        return {
            "eventsSent": self.sent,
            "accepted": self.accepted,
            "rejectedByReason": dict(sorted(self.rejected.items())),
            "violationsByCode": dict(sorted(self.violations.items())),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "lostAndDuplicatedNotCountedBy": sorted(self.not_counted),
            "seconds": round(self.seconds, 1),
            "tests": self.tests,
        }

    def lines(self) -> list[str]:
        d = self.to_dict()
        not_counted = f"  (not counted by: {', '.join(d['lostAndDuplicatedNotCountedBy'])})" if self.not_counted else ""
        out = [
            f"events sent      {d['eventsSent']}",
            f"accepted         {d['accepted']}",
            f"rejected         {sum(self.rejected.values())}  "
            + " ".join(f"{k}={v}" for k, v in d["rejectedByReason"].items()),
            f"violations       {sum(self.violations.values())}  "
            + " ".join(f"{k}={v}" for k, v in d["violationsByCode"].items()),
            f"lost             {d['lost']}{not_counted}",
            f"duplicated       {d['duplicated']}{not_counted}",
            f"time             {d['seconds']} s (the fault tests' own wall time)",
        ]
        for name, t in self.tests.items():
            extra = {k: v for k, v in t.items() if k not in ("rejected", "violations")}
            out.append(f"  {name}: {json.dumps(extra, sort_keys=True)}")
        return out


_LEDGER = FaultLedger()


@pytest.fixture(scope="session")
def ledger() -> FaultLedger:
    return _LEDGER


def pytest_runtest_logreport(report) -> None:
    if "tests/faults/" in report.nodeid.replace("\\", "/"):
        _LEDGER.seconds += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _LEDGER.tests:
        return
    terminalreporter.section("agentlog fault suite")
    for line in _LEDGER.lines():
        terminalreporter.write_line(line)
    SUMMARY_PATH.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY_PATH.write_text(json.dumps(_LEDGER.to_dict(), indent=2, sort_keys=True) + "\n")
    terminalreporter.write_line(f"written to {SUMMARY_PATH}")
