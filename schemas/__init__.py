"""The event contract: envelope, payload models, canonical bytes, hashes, cache key, wire format, topic records.

Nothing here does I/O (the bundled ``.avsc`` is read once at import). Everything
public is re-exported here; the submodules are the place to read *why*.
"""

from agentlog.schemas.avro import SCHEMA_ID, decode_avro, encode_avro
from agentlog.schemas.cachekey import (
    RECIPE_IDS,
    TRANSPORT_FIELDS,
    cache_key,
    canonical_request,
    project_request,
    recipe_id,
)
from agentlog.schemas.canonical import (
    GENESIS,
    MAX_SAFE_INTEGER,
    chain_hash,
    check_json_safe,
    doc_hash,
    jcs,
    loads_strict,
    sha256_hex,
)
from agentlog.schemas.errors import (
    AgentlogError,
    CacheKeyError,
    ConfigError,
    ContractError,
    EventRejected,
    InfraError,
    LogFormatError,
    ReplayError,
    StoreError,
    StoreLockedError,
)
from agentlog.schemas.events import ENVELOPE_FIELDS, OPTIONAL_FIELDS, REQUIRED_FIELDS, RUN_EVENT_TYPES, RunEventDoc
from agentlog.schemas.payloads import PAYLOAD_MODELS
from agentlog.schemas.records import (
    Checkpoint,
    CommittedEvent,
    RecordSource,
    Rejection,
    RunSnapshot,
    Transition,
    Verdict,
    VerdictKind,
    Violation,
    checkpoint,
    committed_event,
    log_format_error,
    record_source,
    rejection,
    run_snapshot,
    transition,
    verdict,
    violation,
)
from agentlog.schemas.stability import (
    VOLATILE_ENVELOPE_FIELDS,
    get_path,
    is_volatile,
    iter_paths,
    parse_path,
    path_matches,
    strip_volatile,
    volatile_paths,
)
from agentlog.schemas.validate import DEFAULT_MAX_BYTES, REJECTION_CODES, validate_doc, validate_payload

__all__ = [
    # errors
    "AgentlogError",
    "CacheKeyError",
    "ConfigError",
    "ContractError",
    "EventRejected",
    "InfraError",
    "LogFormatError",
    "ReplayError",
    "StoreError",
    "StoreLockedError",
    # canonical bytes and hashes
    "GENESIS",
    "MAX_SAFE_INTEGER",
    "chain_hash",
    "check_json_safe",
    "doc_hash",
    "jcs",
    "loads_strict",
    "sha256_hex",
    # envelope and payloads
    "ENVELOPE_FIELDS",
    "OPTIONAL_FIELDS",
    "PAYLOAD_MODELS",
    "REQUIRED_FIELDS",
    "RUN_EVENT_TYPES",
    "RunEventDoc",
    # internal topic records (CONTRACT.md shapes and their builders)
    "Checkpoint",
    "CommittedEvent",
    "RecordSource",
    "Rejection",
    "RunSnapshot",
    "Transition",
    "Verdict",
    "VerdictKind",
    "Violation",
    "checkpoint",
    "committed_event",
    "log_format_error",
    "record_source",
    "rejection",
    "run_snapshot",
    "transition",
    "verdict",
    "violation",
    # validation
    "DEFAULT_MAX_BYTES",
    "REJECTION_CODES",
    "validate_doc",
    "validate_payload",
    # wire format
    "SCHEMA_ID",
    "decode_avro",
    "encode_avro",
    # LLM cache key
    "RECIPE_IDS",
    "TRANSPORT_FIELDS",
    "cache_key",
    "canonical_request",
    "project_request",
    "recipe_id",
    # field stability
    "VOLATILE_ENVELOPE_FIELDS",
    "get_path",
    "is_volatile",
    "iter_paths",
    "parse_path",
    "path_matches",
    "strip_volatile",
    "volatile_paths",
]
