"""A cache bounded by bytes, not by entries: the relay's memory has a ceiling whatever the rows.

Every cache of the publish path (parsed options, encoded properties, method frames) keeps
entries whose size a producer controls (an options text, a header table): a cap on the number
of entries alone would let a few thousand large ones take hundreds of megabytes. Each entry
here is charged a weight in bytes; past the budget the cache starts over (rows of one producer
share their options, so it refills at once with what is in use).
"""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A dict whose entries' weights add up to at most `max_bytes`."""

    def __init__(self, max_bytes: int, *, max_entry_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        # An entry heavier than this is not kept at all (computed again when needed).
        self.max_entry_bytes = max_bytes // 16 if max_entry_bytes is None else max_entry_bytes
        self._data: dict[K, V] = {}
        self.weight = 0

    def get(self, key: K) -> V | None:
        """The cached value, or None."""
        return self._data.get(key)

    def put(self, key: K, value: V, weight: int) -> None:
        """Keep `value` under `key`, charged `weight` bytes (the key's own size included)."""
        if weight > self.max_entry_bytes:
            return
        if self.weight + weight > self.max_bytes:
            self.clear()
        self._data[key] = value
        self.weight += weight

    def clear(self) -> None:
        """Drop every entry."""
        self._data.clear()
        self.weight = 0

    def __len__(self) -> int:
        return len(self._data)
