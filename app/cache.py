"""A small thread-safe cache for the server: least recently used entries go first when it is
full, and entries unused for a while can be dropped (:meth:`IdleCache.trim`, run by the
server's janitor)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Hashable, Iterator

__all__ = ["IdleCache"]


class IdleCache:
    """At most ``size`` entries; keys in ``pinned`` are never dropped."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pinned: set[Hashable] = set()
        self._items: "OrderedDict[Hashable, tuple[Any, float]]" = OrderedDict()  # key -> (value, last used)
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now counted as used), or ``default``."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return default
            self._items[key] = (hit[0], time.monotonic())
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = (value, time.monotonic())
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                old = next((k for k in self._items if k not in self.pinned), None)
                if old is None:
                    break
                del self._items[old]

    def trim(self, max_idle_s: float) -> int:
        """Drop the entries unused for ``max_idle_s`` seconds (pinned ones stay); how many."""
        now = time.monotonic()
        with self._lock:
            old = [k for k, (_, used) in self._items.items() if now - used > max_idle_s and k not in self.pinned]
            for k in old:
                del self._items[k]
        return len(old)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __iter__(self) -> Iterator[Hashable]:
        with self._lock:
            return iter(list(self._items))
