"""The worker's allocator settings: applied through glibc's mallopt, never over the operator's own."""

from __future__ import annotations

import platform

import pytest

from processors.worker.memory import tune_malloc

VARIABLES = ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


@glibc
def test_every_value_is_applied_when_the_environment_sets_none(monkeypatch: pytest.MonkeyPatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert tune_malloc() == VARIABLES


@glibc
def test_a_value_the_operator_set_is_left_alone(monkeypatch: pytest.MonkeyPatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert tune_malloc() == VARIABLES[1:]
