"""The Faust app's broker connection, from the same properties file as every other client.

Lives here, not in :mod:`streams.security`, because only ``processors.worker`` may import Faust.
Faust builds its own aiokafka producer, consumers and admin client; it passes them the
credentials given as ``broker_credentials`` (``faust.SASLCredentials`` with an SSL context for
SASL_SSL, a bare ``ssl.SSLContext`` for SSL), so one place here covers all of them.
"""

from __future__ import annotations

from typing import Any

import faust

from streams.security import bootstrap, load_security
from streams.settings import Settings

__all__ = ["faust_broker_kwargs"]


def faust_broker_kwargs(settings: Settings) -> dict[str, Any]:
    """``broker=`` (and, when configured, ``broker_credentials=``) for ``faust.App``.

    Any: the values are what those keyword arguments take (URL list, Faust credentials object).
    """
    urls = [f"kafka://{host.strip()}" for host in bootstrap(settings).split(",") if host.strip()]
    kwargs: dict[str, Any] = {"broker": urls}
    security = load_security(settings)
    if security is None or security.security_protocol == "PLAINTEXT":
        return kwargs
    if security.uses_sasl:
        assert security.sasl_password is not None  # parse_properties guarantees it
        kwargs["broker_credentials"] = faust.SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password.get_secret_value(),
            mechanism=security.sasl_mechanism,
            # None = SASL_PLAINTEXT: Faust picks the protocol from whether a context is given.
            ssl_context=security.ssl_context() if security.uses_tls else None,
        )
    else:
        kwargs["broker_credentials"] = security.ssl_context()
    return kwargs
