"""glibc's allocator, set for a process that runs for months.

The worker's threads (ClickHouse's inside chdb, RocksDB's, the Kafka clients', Python's) allocate and
free buffers of every size. With glibc's defaults a process keeps up to eight arenas per core, and each
time it frees a large block it raises the threshold above which blocks are mapped on their own, so
later large blocks come from the arenas and their pages stay with the process once freed: resident
memory follows the high-water mark of every buffer size ever used, not what is in use. Two arenas, a
fixed 128 KiB threshold for blocks mapped on their own (returned to the kernel when freed) and trimming
above 128 KiB keep it near what is in use (``bench soak``; ``tests/bench/JOURNAL.md``).

A value set in the environment (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``) is the operator's and is left as it is. Other C libraries: nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("agentlog.worker")

#: (mallopt parameter, value, the environment variable glibc reads for it)
_OPTIONS = (
    (-8, 2, "MALLOC_ARENA_MAX"),  # M_ARENA_MAX
    (-3, 128 * 1024, "MALLOC_MMAP_THRESHOLD_"),  # M_MMAP_THRESHOLD (setting it also stops its raising)
    (-1, 128 * 1024, "MALLOC_TRIM_THRESHOLD_"),  # M_TRIM_THRESHOLD
)


def tune_malloc() -> list[str]:
    """Apply the values above (before the worker starts its threads); returns the variables applied."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return []
    applied = []
    for parameter, value, variable in _OPTIONS:
        if variable in os.environ:
            continue
        if mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            applied.append(variable)
        else:
            log.warning("mallopt(%d, %d) was refused; the C library keeps its default", parameter, value)
    return applied
