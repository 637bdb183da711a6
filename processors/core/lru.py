"""A bounded least-recently-used map: the decoded values a worker keeps of what lives on disk."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(OrderedDict[K, V]):
    """An ``OrderedDict`` that keeps its ``size`` newest entries: :meth:`keep` puts one as the newest.

    Reads stay the dict's own (``get``, ``in``); a reader that wants a hit to count as use calls ``move_to_end``.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def keep(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)
