"""External programs some tests drive (Debian packages): skip where missing, fail where CI promised them.

Tests never install anything. ``.ci/run`` installs the packages below when their binary is missing and
sets ``AGENTLOG_TEST_REQUIRE_TOOLS=1``, which turns a missing tool into a failure instead of a skip, so
CI cannot quietly skip these tests.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_TOOLS_ENV = "AGENTLOG_TEST_REQUIRE_TOOLS"

#: binary -> Debian package (keep in step with .ci/run)
PACKAGES = {"kcat": "kcat", "chromium": "chromium"}


def require_tool(binary: str) -> str:
    """The path of ``binary``; skips the test when it is missing (fails under ``AGENTLOG_TEST_REQUIRE_TOOLS``)."""
    path = shutil.which(binary)
    if path:
        return path
    message = f"{binary} is not installed (Debian package {PACKAGES[binary]}; .ci/run installs it)"
    if os.environ.get(REQUIRE_TOOLS_ENV):
        pytest.fail(f"{message}, and {REQUIRE_TOOLS_ENV} is set", pytrace=False)
    pytest.skip(message)
