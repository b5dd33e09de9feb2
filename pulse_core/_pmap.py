"""PersistentMap: an immutable mapping whose updates share almost everything with the original.

Projections must return a new state instead of changing the old one (the previous snapshot
still holds it). For a state of 10,000 identities, copying a dict per event costs O(n); this
map copies one bucket of ~n/256 entries and a 256-slot tuple instead, and two versions can be
diffed by comparing buckets by identity. Each version also remembers the keys bound or removed
since its line of versions began (the last `_LOG` of them), so a version and one it was made
from are diffed by reading those keys alone.
"""

from __future__ import annotations

import builtins
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from typing import Generic, TypeVar, cast, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_BUCKETS = 256
_EMPTY: dict[object, object] = {}
_MISSING = object()
_LOG = 4096
"""The most keys a line of versions remembers; the next change starts a new line."""


class _Start:
    """Where a line of versions begins: a token no other line shares. A line begun because
    the one before it was full keeps that line's newest change and its count (`before`), so
    a version is diffed from the line before its own by reading logs too; only that one: the
    link behind it is dropped, so at most two lines' keys are kept."""

    __slots__ = ("before",)

    def __init__(self, before: tuple[object, int] | None = None) -> None:
        self.before = before


def _next_line(log: object, logged: int) -> _Start:
    """A line begun after the full line whose newest change is `log`, its `logged`th."""
    node = log
    for _ in range(logged):  # to the full line's own start, to drop the link behind it
        node = cast("tuple[object, object]", node)[1]
    cast("_Start", node).before = None
    return _Start((log, logged))


class PersistentMap(Mapping[K, V], Generic[K, V]):
    """An immutable Mapping; `set` and `delete` return a new map sharing untouched buckets."""

    __slots__ = ("_buckets", "_len", "_log", "_logged")

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        buckets: list[dict[K, V]] = [_EMPTY for _ in range(_BUCKETS)]  # type: ignore[misc]
        for key, value in (items or {}).items():
            index = hash(key) % _BUCKETS
            if buckets[index] is _EMPTY:
                buckets[index] = {}
            buckets[index][key] = value
        self._buckets: tuple[dict[K, V], ...] = tuple(buckets)
        self._len = sum(len(b) for b in buckets)
        # the keys changed since the line began, newest first, as (key, rest) pairs
        self._log: object = _Start()
        self._logged = 0

    def _of(self, buckets: tuple[dict[K, V], ...], length: int, key: K) -> PersistentMap[K, V]:
        """A version made from this one by changing `key`."""
        new: PersistentMap[K, V] = self.__new__(type(self))
        new._buckets = buckets
        new._len = length
        if self._logged < _LOG:
            new._log, new._logged = (key, self._log), self._logged + 1
        else:
            new._log, new._logged = (key, _next_line(self._log, self._logged)), 1
        return new

    def __getitem__(self, key: K) -> V:
        return self._buckets[hash(key) % _BUCKETS][key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...

    def get(self, key: K, default: object = None, /) -> object:
        """The value of `key`, or `default` (one bucket lookup, no exception raised)."""
        return self._buckets[hash(key) % _BUCKETS].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets[hash(key) % _BUCKETS]

    def __iter__(self) -> Iterator[K]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._len

    def values(self) -> ValuesView[V]:
        """The values, read bucket by bucket (no lookup per key)."""
        return _Values(self)

    def items(self) -> ItemsView[K, V]:
        """The (key, value) pairs, read bucket by bucket (no lookup per key)."""
        return _Items(self)

    def __repr__(self) -> str:
        return f"PersistentMap({dict(self.items())!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and all(
            k in other and other[k] == v for k, v in self.items())

    __hash__ = None  # type: ignore[assignment]

    def set(self, key: K, value: V) -> PersistentMap[K, V]:
        """A map with `key` bound to `value`."""
        index = hash(key) % _BUCKETS
        old = self._buckets[index]
        bucket = {**old, key: value}
        buckets = (*self._buckets[:index], bucket, *self._buckets[index + 1:])
        return self._of(buckets, self._len + (0 if key in old else 1), key)

    def update(self, changes: Mapping[K, V]) -> PersistentMap[K, V]:
        """A map with every binding of `changes`, copying each touched bucket once (a
        sweep rebinds hundreds of keys, mostly in different buckets of a large map)."""
        if not changes:
            return self
        buckets = list(self._buckets)
        fresh: builtins.set[int] = builtins.set()
        added = 0
        for key, value in changes.items():
            index = hash(key) % _BUCKETS
            if index not in fresh:
                buckets[index] = dict(buckets[index])
                fresh.add(index)
            bucket = buckets[index]
            added += key not in bucket
            bucket[key] = value
        new: PersistentMap[K, V] = self.__new__(type(self))
        new._buckets, new._len = tuple(buckets), self._len + added
        log, logged = self._log, self._logged
        if len(changes) >= _BUCKETS:  # most buckets changed: comparing them costs no more
            log, logged = _Start(), 0
        else:
            for key in changes:
                log, logged = ((key, log), logged + 1) if logged < _LOG else \
                    ((key, _next_line(log, logged)), 1)
        new._log, new._logged = log, logged
        return new

    def delete(self, key: K) -> PersistentMap[K, V]:
        """A map without `key` (the same map if it was absent)."""
        index = hash(key) % _BUCKETS
        old = self._buckets[index]
        if key not in old:
            return self
        bucket = {k: v for k, v in old.items() if k != key}
        buckets = (*self._buckets[:index], bucket, *self._buckets[index + 1:])
        return self._of(buckets, self._len - 1, key)

    def changed_keys(self, older: PersistentMap[K, V]) -> builtins.set[K]:
        """Keys added, removed or rebound since `older`: read from this version's log when
        it was made from `older` (by the last `_LOG` to 2 x `_LOG` changes at most), else
        found by comparing buckets."""
        logged = self._logged_since(older)
        if logged is not None:
            ours, others = self._buckets, older._buckets
            return {key for key in logged
                    if ours[hash(key) % _BUCKETS].get(key, _MISSING)
                    is not others[hash(key) % _BUCKETS].get(key, _MISSING)}
        changed: builtins.set[K] = builtins.set()
        for mine, theirs in zip(self._buckets, older._buckets, strict=True):
            if mine is theirs:
                continue
            get = theirs.get
            rebound = [key for key, value in mine.items() if get(key, _MISSING) is not value]
            changed.update(rebound)
            # fewer of theirs kept in mine than they hold: some were removed
            if len(mine) - sum(key not in theirs for key in rebound) != len(theirs):
                changed.update(theirs.keys() - mine.keys())
        return changed

    def _logged_since(self, older: PersistentMap[K, V]) -> builtins.set[K] | None:
        """The keys logged since `older`, read back through this version's line and the
        one before it; None if `older` is in neither (it was not made from `older`, or too
        long ago)."""
        target = older._log
        log, count = self._log, self._logged
        keys: builtins.set[K] = builtins.set()  # a key changed twice is compared once
        for _ in range(2):
            for _ in range(count):
                if log is target:
                    return keys
                key, log = cast("tuple[K, object]", log)
                keys.add(key)
            if log is target:
                return keys
            before = cast("_Start", log).before
            if before is None:
                return None
            log, count = before
        return None


class _Values(ValuesView[V]):
    _mapping: PersistentMap[object, V]

    def __iter__(self) -> Iterator[V]:
        for bucket in self._mapping._buckets:
            yield from bucket.values()


class _Items(ItemsView[K, V]):
    _mapping: PersistentMap[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        for bucket in self._mapping._buckets:
            yield from bucket.items()
