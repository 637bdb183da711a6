"""The audit-store fixtures (chdb, and a ClickHouse server when configured), shared with tests/unit/audit."""

from tests.unit.audit.conftest import loaded_store, store, store_url

__all__ = ["loaded_store", "store", "store_url"]
