"""Suites every implementation of a port runs (imported by the tests of each implementation)."""

import pytest

pytest.register_assert_rewrite("tests.contract.txlog")
