"""One root exception with a stable ``code``.

Every error agentlog raises on purpose derives from :class:`AgentlogError`. The
``code`` is part of the public contract (CLI ``--json`` output, rejection
records, metrics labels): change a message freely, never a code.
"""

from __future__ import annotations


class AgentlogError(Exception):
    """Root of every agentlog error; ``code`` is stable, ``str()`` says what to do."""

    code: str = "agentlog_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": str(self)}


class ConfigError(AgentlogError):
    """A setting is missing or malformed; the message names the variable to fix."""

    code = "config_error"


class ContractError(AgentlogError):
    """An event breaks the event contract (envelope, payload, canonical form, size)."""

    code = "contract_error"


class InfraError(AgentlogError):
    """The local stack cannot be started, reached or stopped."""

    code = "infra_error"


class StoreError(AgentlogError):
    """ClickHouse (chdb or server) refused or failed a request."""

    code = "store_error"


class StoreLockedError(StoreError):
    """Another live process owns the embedded chdb directory (code ``store_locked``); ``owner`` is its record.

    The embedded store is in-process, so one process at a time holds its directory: query
    through that process's endpoint, stop it, or run this worker with ``--role process``. A ClickHouse
    server (``AGENTLOG_CLICKHOUSE_URL``) has no such limit.
    """

    code = "store_locked"

    def __init__(self, message: str, *, owner: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class ReplayError(AgentlogError):
    """Replay could not run (missing run, unreadable log); a divergence is *not* an error."""

    code = "replay_error"


class LogFormatError(AgentlogError):
    """A committed log record without ``stateHash``: log format 1, which this agentlog does not read.

    Every record the worker commits carries the state hash at its index (log format 2). A record
    without one was committed by an agentlog before 0.2, whose state hashes were on a topic of their
    own. Export the runs with that version (``agentlog export``) and publish the export here
    (``agentlog publish``): the worker commits them again, each record with its state hash.
    """

    code = "log_format_unsupported"

    #: What the user reads, after where the record is.
    ADVICE = ("this log was written by an agentlog before 0.2 (log format 1, records without stateHash); "
              "re-ingest its runs with `agentlog publish` from an export made with that version")

    def __init__(self, where: str = "") -> None:
        super().__init__(f"{where}: {self.ADVICE}" if where else self.ADVICE)


class EventRejected(ContractError):
    """One event was refused at the door; ``code`` is a rejection reason from CONTRACT.md.

    The event is not lost: the sequencer writes it, with this code and ``detail``,
    to the rejections topic. Fix the producer so it emits what ``detail`` says.
    """

    code = "invalid_envelope"

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail, code=code)
        self.detail = detail

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.detail}


class CacheKeyError(ContractError):
    """An LLM request cannot be projected to a cache key (missing model/provider/messages, wrong types)."""

    code = "invalid_cache_request"
