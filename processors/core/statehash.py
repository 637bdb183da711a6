"""``state_hash`` for a sequence of fold states, re-serialising only what each event changed.

Both readers of a run's states hash them at every index: the live worker (the state hash
each committed record carries) and re-derivation (checking each recorded digest). The
reference ``agentlog.core.fold.state_hash`` canonicalises the whole state each time, which
is quadratic over a long run. :class:`StateHasher` (re-derivation's exact path, checkpoints)
caches the bytes of every sub-value; :class:`ExactStateHash` (the live worker, for a run whose
state has grown past :data:`agentlog.core.runstate.INCREMENTAL_FROM_BYTES`) resumes SHA-256
from the first changed top-level member; :class:`ResumableStateHash` is
re-derivation's candidate, checked against the recorded hash.

JCS is compositional: an object's canonical bytes are its members' canonical bytes in
UTF-16 key order, an array's its elements' in order. The fold is copy-on-write, so a
value that is the *same object* as in an earlier state has the same bytes; those are
reused instead of walking the whole state again. Leaves go through
:func:`agentlog.schemas.canonical.canonical_leaf`, which gives the reference bytes (property-tested
against ``rfc8785``). :class:`StateHasher`'s cache holds a reference to every value it
describes (a live object's id cannot be reused) and is pruned to what the current state
reaches whenever it has grown well past that. The price is the fold's own rule: states are
read-only.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Mapping
from itertools import compress, count
from typing import Any, cast

import orjson

from agentlog.schemas.canonical import canonical_leaf, jcs_parsed, sha256_hex, sized, utf16_key
from agentlog.schemas.errors import EventRejected

__all__ = ["ExactStateHash", "ResumableStateHash", "StateHasher"]


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


class ResumableStateHash:
    """Callable ``state -> sha256 hex`` of a *candidate* spelling of the state's JCS, resuming SHA-256.

    Re-derivation checks a recorded stateHash at every index, and a run's state grows to several
    KB while one event changes one top-level member of it. This spells the state as its sorted
    top-level members, each member's value in orjson's sorted-key bytes (a member whose value is
    the *same object* as in the previous state keeps its bytes: the fold is copy-on-write), and
    keeps a copy of the SHA-256 context at every member boundary, so a state hashes only from the
    first member that changed to the end (``variables``, the member most events change, is last).

    Changed members are found in insertion order, in C: the fold copies the state and sets a key,
    which keeps every key where it was, so ``list(state)`` equals the last key list (identity
    compares) and the values are compared by identity pairwise; any other key list starts over.
    (Keeping a large member such as ``variables`` per entry, re-writing only the changed entry,
    does not pay here: the Python to find and join the entries costs as much as orjson writing
    the whole member.)

    The result is only a candidate, as with :func:`agentlog.schemas.canonical.hashes_to`: equal to a
    recorded JCS hash, it proves these bytes *are* the JCS bytes (SHA-256), since orjson spells
    every value of strict JSON faithfully; unequal, it proves nothing (orjson spells some floats
    and the order of non-BMP keys unlike JCS), and the caller computes the exact hash. ``None``
    when orjson cannot spell the state at all (integers beyond 64 bits, non-string keys).
    One instance per walk over one run; states are read-only (the fold's rule).
    """

    __slots__ = ("_checkpoints", "_entry_index", "_entry_names", "_entry_of", "_entry_parts",
                 "_hex", "_ins_keys", "_ins_values", "_last", "_names", "_order", "_parts", "_tail", "_tail_ins",
                 "_tail_key", "_valid")

    def __init__(self) -> None:
        self._valid = False  # whether the lists below describe the last state
        self._ins_keys: list[str] = []  # the last state's member names in insertion order
        self._ins_values: list[Any] = []  # … and their values (the objects the bytes below describe)
        self._order: list[int] = []  # insertion index -> JCS position
        self._names: list[bytes] = []  # by JCS position: '"key":' (with ',' before all but the first)
        self._parts: list[bytes] = []  # by JCS position: the member value's bytes
        self._checkpoints: list[Any] = []  # SHA-256 contexts after '{' and members[:i], by JCS position
        self._tail = -1  # the last JCS position (its checkpoint is kept by every full pass)
        self._last: Any = None
        self._hex: str | None = None
        self._tail_key: str | None = None  # the last member's name in JCS order (set with the key list)
        self._tail_ins = -1  # … and its insertion index
        # :meth:`after_set` only: the last member kept entry by entry, for its value ``_entry_of`` (values
        # are read-only, so the entries describe that object whatever key list it is found in).
        self._entry_of: Any = None
        self._entry_index: dict[str, int] = {}  # entry key -> position (sorted)
        self._entry_names: list[bytes] = []  # by position: '"key":'
        self._entry_parts: list[bytes] = []  # by position: '"key":' and the entry value's bytes

    def __call__(self, state: Mapping[str, Any]) -> str | None:
        if state is self._last:
            return self._hex
        try:
            keys = list(state)
            if self._valid and keys == self._ins_keys:
                values = list(state.values())
                changed = list(compress(count(), map(operator.is_not, values, self._ins_values)))
                self._ins_values = values
                if len(changed) == 1 and (at := self._order[changed[0]]) == self._tail:
                    # The usual event: one member changed, the last in JCS order (``variables``).
                    parts = self._parts
                    parts[at] = sized(orjson.dumps(values[changed[0]], option=_SORTED))
                    h = self._checkpoints[at].copy()
                    h.update(self._names[at])
                    h.update(parts[at])
                    h.update(b"}")
                    digest: str | None = h.hexdigest()
                elif changed:
                    digest = self._resume(values, changed)
                else:
                    digest = self._hex
            else:
                self._reset(state, keys)
                digest = self._resume(None, ())
        except (orjson.JSONEncodeError, TypeError, ValueError, EventRejected):
            # Not spellable this way (orjson) or not JCS at all (the reference errors): no
            # candidate; the caller's exact path decides. Start over with the next state.
            self._valid = False
            digest = None
        self._last, self._hex = state, digest
        return digest

    def after_set(self, state: Mapping[str, Any], prev: Mapping[str, Any] | None, member: str, key: str) -> str | None:
        """What ``self(state)`` gives, for a ``state`` the fold made from ``prev`` by setting ``state[member][key]``.

        The note comes from :func:`agentlog.core.fold.fold_noting`. When ``prev`` is the state
        hashed last and ``member`` is its last member in JCS order (``variables``), that member is
        kept entry by entry and only the entry set is written again: one small orjson call, a join
        and SHA-256 from the member's checkpoint, instead of orjson writing the whole member (~1.7 KB
        in the bench) and the identity diffs that find what changed (about 2 µs of ~4.8 per event).
        A note about anything else, or a set that added a key, goes the general way.

        Only what the note names is looked at: the state and the member have as many keys as before,
        the key was there. The note is the fold's own statement about its step (held to it by a
        property test); if it were wrong, the bytes would be those of a state without the change it
        left out, so the candidate would not be the recorded hash of an honest run's state and the
        caller's exact path would decide. As with ``__call__``, the result is only a candidate.
        """
        if prev is not self._last or self._hex is None or not self._valid:
            return self(state)
        if member != self._tail_key:
            return self(state)
        old = self._ins_values[self._tail_ins]  # prev[member]: the value the kept bytes describe
        value = state[member]
        if (type(value) is not dict or type(old) is not dict or len(value) != len(old)
                or len(state) != len(self._ins_values)):
            return self(state)
        try:
            if self._entry_of is not old:
                self._keep_entries(old)
            at = self._entry_index.get(key)
            if at is None:
                return self(state)
            parts = self._entry_parts
            parts[at] = self._entry_names[at] + orjson.dumps(value[key], option=_SORTED)
        except (orjson.JSONEncodeError, TypeError, ValueError, EventRejected):
            self._valid, self._entry_of, self._last, self._hex = False, None, state, None
            return None
        spelled = b"{" + b",".join(parts) + b"}"
        tail = self._tail
        self._parts[tail] = spelled
        self._ins_values[self._tail_ins] = self._entry_of = value
        h = self._checkpoints[tail].copy()
        h.update(self._names[tail])
        h.update(spelled)
        h.update(b"}")
        digest: str = h.hexdigest()
        self._last, self._hex = state, digest
        return digest

    def forget(self) -> None:
        """Drop everything kept: the next call spells its state from scratch (after a candidate that did not match)."""
        self._valid, self._entry_of, self._last, self._hex = False, None, None, None

    def _keep_entries(self, member: Mapping[str, Any]) -> None:
        """Keep ``member``'s entries one by one, in JCS order, each as ``"key":`` and its value's orjson bytes."""
        self._entry_of = None
        ordered = sorted(member) if "".join(member).isascii() else sorted(member, key=utf16_key)
        names = [canonical_leaf(k) + b":" for k in ordered]
        self._entry_parts = [name + orjson.dumps(member[k], option=_SORTED)
                             for name, k in zip(names, ordered, strict=True)]
        self._entry_names = names
        self._entry_index = {k: i for i, k in enumerate(ordered)}
        self._entry_of = member

    def _digest(self, state: Mapping[str, Any]) -> str:
        """The general path (no usual-event shortcut): what :class:`ExactStateHash` calls."""
        keys = list(state)
        if not self._valid or keys != self._ins_keys:
            self._reset(state, keys)
            return self._resume(None, ())
        values = list(state.values())
        changed = list(compress(count(), map(operator.is_not, values, self._ins_values)))
        if not changed:
            return cast(str, self._hex)
        self._ins_values = values
        return self._resume(values, changed)

    def _resume(self, values: list[Any] | None, changed: Iterable[int]) -> str:
        """Re-write the changed members (insertion indexes) and hash from the first of them on."""
        order, parts, spell = self._order, self._parts, self._spell
        start = 0 if values is None else len(order)
        for i in changed:
            at = order[i]
            if at < start:
                start = at
            parts[at] = spell(cast(list[Any], values)[i])
        checkpoints, names = self._checkpoints, self._names
        h = checkpoints[start].copy()
        last = len(names) - 1
        for i in range(start, last + 1):
            h.update(names[i])
            h.update(parts[i])
            if i < last:
                checkpoints[i + 1] = h.copy()
        h.update(b"}")
        return str(h.hexdigest())

    @staticmethod
    def _spell(value: Any) -> bytes:
        """A member value's bytes: orjson's sorted spelling (a candidate for its JCS)."""
        return sized(orjson.dumps(value, option=_SORTED))

    def _reset(self, state: Mapping[str, Any], keys: list[str]) -> None:
        self._valid = False
        ordered = sorted(keys) if "".join(keys).isascii() else sorted(keys, key=utf16_key)
        position = {k: i for i, k in enumerate(ordered)}
        self._ins_keys = keys
        self._ins_values = list(state.values())
        self._order = [position[k] for k in keys]
        self._tail_key = ordered[-1] if ordered else None
        self._tail_ins = keys.index(ordered[-1]) if ordered else -1
        self._names = [(b"," if i else b"") + canonical_leaf(k) + b":" for i, k in enumerate(ordered)]
        values = [state[k] for k in ordered]
        spell = self._spell
        self._parts = [spell(v) for v in values]
        self._checkpoints = [hashlib.sha256(b"{")] + [None] * max(len(keys) - 1, 0)
        self._tail = len(keys) - 1
        self._valid = True


_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
#: The JCS bytes of an empty object and an empty array.
_EMPTY: dict[type, bytes] = {dict: b"{}", list: b"[]"}


class ExactStateHash(ResumableStateHash):
    """Callable ``state -> sha256_hex(jcs(state))``, exactly, resuming SHA-256 where the state changed.

    The live worker's state hash. :class:`ResumableStateHash`'s layout (sorted
    top-level members, a SHA-256 context kept at every member boundary, a member's bytes reused
    while its value is the same object), with each member's value spelled by
    :func:`agentlog.schemas.canonical.jcs_parsed`: orjson's sorted bytes where they are provably JCS (no
    exponent or integral float token, no 4-byte character, which would change the key order;
    integers past 2**53 and lone surrogates make orjson raise), the exact encoder otherwise. Member
    names are sorted by UTF-16 unit and written by :func:`canonical_leaf`, so the whole is JCS by
    definition and the digest is the reference one, not a candidate.

    The precondition is :func:`jcs_parsed`'s: the state holds only what a strict JSON decoder
    gives (dicts, lists, str, int, finite float, bool, None), which is what the fold builds from
    validated docs. :class:`StateHasher` walked every member of every changed dict in Python,
    ~10% of the worker's main thread at saturation; here a changed member is one C call, and the
    unchanged members before it are not hashed again. A value that cannot be canonicalised raises
    what :func:`agentlog.schemas.canonical.jcs` raises.
    """

    __slots__ = ()

    @staticmethod
    def _spell(value: Any) -> bytes:
        # Most members of a young run are empty: their bytes need no encoder.
        if not value and (kind := type(value)) in _EMPTY:
            return _EMPTY[kind]
        return jcs_parsed(value)  # sized: the worker keeps a dozen members per run in flight

    def after_set(self, state: Mapping[str, Any], prev: Mapping[str, Any] | None, member: str, key: str) -> str:
        """The exact hash: the worker never takes re-derivation's entry-by-entry candidate."""
        return self(state)

    def __call__(self, state: Mapping[str, Any]) -> str:
        if state is self._last and self._hex is not None:
            return self._hex
        try:
            digest = self._digest(state)
        except BaseException:
            self._valid, self._last, self._hex = False, None, None
            raise
        self._last, self._hex = state, digest
        return digest
