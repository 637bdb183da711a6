"""``state_hash`` for a sequence of fold states, re-serialising only what each event changed.

Both readers of a run's states hash them at every index: the live run-state processor
(one digest per committed event) and re-derivation (checking each recorded digest).
The reference ``processors.core.fold.state_hash`` canonicalises the whole state each time,
which is quadratic over a long run; this is the one incremental implementation both use.

JCS is compositional: an object's canonical bytes are its members' canonical bytes in
UTF-16 key order, an array's its elements' in order. The fold is copy-on-write, so a
value that is the *same object* as in an earlier state has the same bytes; those are
reused instead of walking the whole state again. Leaves go through
:func:`schemas.canonical.canonical_leaf`, which gives the reference bytes (property-tested
against ``rfc8785``). The cache holds a reference to every value it describes (a live
object's id cannot be reused) and is pruned to what the current state reaches whenever
it has grown well past that. The price is the fold's own rule: states are read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.canonical import canonical_leaf, sha256_hex, utf16_key

__all__ = ["StateHasher"]


class StateHasher:
    """Callable ``state -> sha256_hex(jcs(state))`` with an identity cache of canonical bytes.

    One instance per run (states of different runs share nothing worth caching, and one
    run's cache must not keep another's states alive).
    """

    __slots__ = ("_cache", "_keys", "_limit", "_slack")

    def __init__(self, *, slack: int = 10_000) -> None:
        # ``slack``: cache entries tolerated beyond twice what the current state reaches before
        # pruning; small when many runs each keep a hasher (the live processor), large for one.
        self._cache: dict[int, tuple[Any, bytes]] = {}
        self._keys: dict[str, bytes] = {}  # member names by value: strings are immutable
        self._slack = slack
        self._limit = slack

    def __call__(self, state: Mapping[str, Any]) -> str:
        return sha256_hex(self.canonical(state))

    def canonical(self, state: Any) -> bytes:
        """The JCS bytes of ``state`` (cached per sub-value)."""
        data = self._bytes(state)
        if len(self._cache) + len(self._keys) > self._limit:
            self._prune(state)
        return data

    def _bytes(self, obj: Any) -> bytes:
        cache = self._cache
        hit = cache.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        kind = type(obj)
        if kind is dict:
            # Cache hits are looked up inline: a call per unchanged member is most of the cost.
            names = self._keys
            parts = []
            for k in sorted(obj) if "".join(obj).isascii() else sorted(obj, key=utf16_key):
                name = names.get(k)
                if name is None:
                    name = names[k] = canonical_leaf(k)
                v = obj[k]
                hit = cache.get(id(v))
                parts.append(name + b":" + (hit[1] if hit is not None and hit[0] is v else self._bytes(v)))
            data = b"{" + b",".join(parts) + b"}"
        elif kind is list:
            parts = []
            for v in obj:
                hit = cache.get(id(v))
                parts.append(hit[1] if hit is not None and hit[0] is v else self._bytes(v))
            data = b"[" + b",".join(parts) + b"]"
        else:  # leaves: strings and numbers are shared between states too
            data = canonical_leaf(obj)
        cache[id(obj)] = (obj, data)
        return data

    def _prune(self, state: Any) -> None:
        keep: dict[int, tuple[Any, bytes]] = {}
        names: dict[str, bytes] = {}
        stack: list[Any] = [state]
        while stack:
            obj = stack.pop()
            ident = id(obj)
            hit = self._cache.get(ident)
            if ident in keep or hit is None or hit[0] is not obj:
                continue
            keep[ident] = hit
            if type(obj) is dict:
                for k in obj:
                    if k in self._keys:
                        names[k] = self._keys[k]
                stack.extend(obj.values())
            elif type(obj) is list:
                stack.extend(obj)
        self._cache = keep
        self._keys = names
        self._limit = 2 * (len(keep) + len(names)) + self._slack
