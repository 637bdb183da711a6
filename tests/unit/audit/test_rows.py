"""The sink's mapping of parsed records (``rows_for(..., parsed=True)``) gives the very rows of the general one.

The sink decodes every log record with ``loads_strict`` and maps it with ``parsed=True``, which
canonicalises ``doc`` and ``payload`` without reading them back (for the sink's throughput).
A row must be a deterministic function of its record whichever path made it: a re-formed batch
is compared by natural key, and ``doc`` is what the hash chain is re-checked from.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.audit.rows import rows_for
from agentlog.schemas.canonical import GENESIS, chain_hash, loads_strict
from agentlog.streams.codec import encode_record
from tests.unit.schemas.strategies import valid_docs


def _committed(doc, state_hash="ab" * 32):
    return {"doc": doc, "prevHash": GENESIS, "hash": chain_hash(GENESIS, doc),
            "source": {"topic": "t.ingest", "partition": 1, "offset": 7, "timestampMs": 1_700_000_000_000},
            "stateHash": state_hash}


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_docs(), min_size=1, max_size=4))
def test_parsed_mapping_equals_the_general_one(docs):
    records = [loads_strict(encode_record(_committed(d))) for d in docs]
    assert rows_for("committed", records, parsed=True) == rows_for("committed", records)


def test_payloads_orjson_would_spell_otherwise_map_the_same():
    doc = {"eventId": "e", "runId": "r", "type": "variable.changed", "sequence": 0,
           "timestamp": "2026-01-01T00:00:00.000Z",
           "payload": {"\U0001F600": 1, "\ue000": [1e21, 1e-7, 0.5], "null": None}}
    records = [loads_strict(encode_record(_committed(doc)))]
    parsed = rows_for("committed", records, parsed=True)
    assert parsed == rows_for("committed", records)
    names, cols = parsed[1], parsed[2]
    assert cols[names.index("payload")][0] == '{"null":null,"\U0001F600":1,"\ue000":[1e+21,1e-7,0.5]}'
