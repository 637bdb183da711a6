"""Who may call the worker's endpoints: the bearer token ``AGENTLOG_WEB_TOKEN``.

One rule for every server the worker runs (the web console and APIs, the OTLP receivers over
HTTP and gRPC): with a token set, a request carries ``Authorization: Bearer <token>`` (gRPC:
the ``authorization`` metadata key), on loopback too; without one (loopback only, which
:func:`agentlog.streams.settings.check_web_access` enforces) every request is let through. The token
is compared in constant time and never logged or echoed.
"""

from __future__ import annotations

import hmac

__all__ = ["bearer", "same_token"]


def same_token(given: str, token: str) -> bool:
    """Whether ``given`` is ``token`` (constant time: a wrong guess says nothing about how close it was)."""
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


def bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive); None for any other."""
    return authorization[7:].strip() if authorization[:7].lower() == "bearer " else None
