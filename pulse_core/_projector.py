"""The Projector: keeps projection states current, checkpointed so a restart resumes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from pulse_core._errors import AppendRejected, EventLogLost, PulseError, StoreError
from pulse_core._events import Event, EventDraft
from pulse_core._homelock import private_folder
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.store import EventStore

log = logging.getLogger("pulse")


class _Checkpoint(msgspec.Struct):
    name: str
    version: int
    seq: int
    state: msgspec.Raw
    at: str = ""  # the id of the event at `seq`: a log with another event there is another log


class Loaded(NamedTuple):
    """A checkpoint read back: the seq it reflects, the state, and the id of the event at
    that seq when it was written."""

    seq: int
    state: Any
    at: str


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, PersistentMap):
        return dict(obj.items())
    raise NotImplementedError(f"cannot checkpoint a {type(obj).__name__}")


def _dec_hook(type_: Any, obj: Any) -> Any:
    if typing.get_origin(type_) is PersistentMap or type_ is PersistentMap:
        args = typing.get_args(type_) or (Any, Any)
        return PersistentMap(msgspec.convert(obj, dict[args[0], args[1]],  # type: ignore[valid-type]
                                             dec_hook=_dec_hook))
    raise NotImplementedError(f"cannot restore a {type_!r} from a checkpoint")


def save_checkpoint(folder: Path, name: str, version: int, seq: int, state: Any, *,
                    at: str = "") -> None:
    """Write a state, the seq it reflects and the id of the event at that seq (`at`),
    atomically, to `folder/name.ckpt`."""
    private_folder(folder)
    raw = msgspec.msgpack.encode(state, enc_hook=_enc_hook)
    body = msgspec.msgpack.encode(_Checkpoint(name, version, seq, msgspec.Raw(raw), at))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, folder / f"{name}.ckpt")
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_checkpoint(folder: Path, name: str, version: int, type: Any) -> Loaded | None:
    """The checkpoint in `folder/name.ckpt`, or None when absent, stale or unreadable.

    A checkpoint is only a cache of the log: anything wrong with it means rebuild, not fail.
    """
    try:
        body = (folder / f"{name}.ckpt").read_bytes()
        ckpt = msgspec.msgpack.decode(body, type=_Checkpoint)
        if ckpt.name != name or ckpt.version != version:
            return None
        state = msgspec.msgpack.decode(ckpt.state, type=type, dec_hook=_dec_hook)
        return Loaded(ckpt.seq, state, ckpt.at)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def checkpoint_seqs(folder: Path) -> dict[str, int]:
    """The seq each readable checkpoint in `folder` reflects, by name."""
    seqs: dict[str, int] = {}
    for path in sorted(folder.glob("*.ckpt")):
        with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
            ckpt = msgspec.msgpack.decode(path.read_bytes(), type=_Checkpoint)
            seqs[ckpt.name] = ckpt.seq
    return seqs


async def refuse_lost_log(events: EventStore, folder: Path) -> None:
    """Raise EventLogLost when `events` is empty though `folder` holds checkpoints: they are
    written only once the log has events, so it was truncated, replaced, or lost its -wal, and
    a new log must not silently take its place."""
    if await events.last_seq() > 0:
        return
    seqs = await asyncio.to_thread(checkpoint_seqs, folder)
    if seqs:
        found = ", ".join(f"{name} at #{seq}" for name, seq in sorted(seqs.items()))
        raise EventLogLost(
            f"{events.recorder.location} holds no events, but {folder} holds checkpoints of a "
            f"log up to #{max(seqs.values())} ({found}): the event log was lost (truncated, "
            f"replaced, or its -wal deleted) — restore it (events.db with its -wal) from a "
            f"backup, or delete {folder} to start a new log deliberately")


async def id_at(store: EventStore, seq: int) -> str:
    """The id of the stored row `seq` ("" for seq 0 or a row the log does not hold)."""
    if seq <= 0:
        return ""
    rows = await store.read_rows(seq - 1, limit=1)
    return rows[0].id if rows and rows[0].seq == seq else ""


async def foreign_checkpoints(store: EventStore, marks: Mapping[str, tuple[int, str]]
                              ) -> dict[str, int]:
    """Of `marks` (name: the seq a checkpoint reflects and the id of the event there), those
    this log does not bear out: it ends before that seq, or holds another event there (a log
    restored from a backup, then written again). A checkpoint of an empty fold always holds."""
    ids: dict[int, str] = {}
    foreign: dict[str, int] = {}
    for name, (seq, at) in marks.items():
        if seq <= 0:
            continue
        if seq not in ids:
            ids[seq] = await id_at(store, seq)
        if not at or ids[seq] != at:
            foreign[name] = seq
    return foreign


async def discard_checkpoints(store: EventStore, folder: Path | None,
                              foreign: Mapping[str, int]) -> None:
    """Delete the checkpoints `foreign` (name: the seq each reflects), which this log does not
    bear out, and record a `checkpoint-discarded` event for each (logged when the store
    cannot take it)."""
    last_seq = await store.last_seq()
    for name, seq in foreign.items():
        log.warning("pulse: checkpoint %r reflects a log whose event #%d this one does not "
                    "hold (it ends at #%d, or holds another event there): discarded, the fold "
                    "is rebuilt from the log", name, seq, last_seq)
        if folder is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / f"{name}.ckpt")
    if store.read_only:
        return
    with contextlib.suppress(StoreError, AppendRejected):
        await store.append([EventDraft("checkpoint-discarded", f"checkpoint:{name}",
                                       {"name": name, "seq": seq, "last_seq": last_seq},
                                       origin="engine")
                            for name, seq in foreign.items()])


INLINE_FOLD = 256
"""Pages up to this many events are folded on the event loop; longer ones in a thread."""


class Projector:
    """Keeps projection states current by applying only the events each one has not seen.

    States are checkpointed to `checkpoints` every `checkpoint_every` events or
    `checkpoint_interval` seconds, so a restart resumes from there instead of seq 0.
    """

    def __init__(
        self,
        store: EventStore,
        projections: Sequence[Projection[Any]],
        *,
        checkpoints: Path | None = None,
        checkpoint_every: int = 10_000,
        checkpoint_interval: float = 60.0,
        page: int = 5_000,
    ) -> None:
        names = [p.name for p in projections]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise PulseError(f"projection names must be unique; repeated: {sorted(duplicates)}")
        self.store = store
        self.projections = list(projections)
        self.checkpoints = checkpoints
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self.page = page
        self.states: dict[str, Any] = {}
        self.seqs: dict[str, int] = {}
        self._saved_seq: dict[str, int] = {}
        self._saved_at = time.monotonic()
        self._save_failing = False
        self._lock = asyncio.Lock()
        kinds: set[str] | None = set()
        for proj in self.projections:
            kinds = None if proj.kinds is None or kinds is None else kinds | proj.kinds
        self._kinds = None if kinds is None else sorted(kinds)
        self._unverified: dict[str, tuple[int, str]] = {}  # loaded, not yet checked
        for proj in self.projections:
            loaded = None
            if checkpoints is not None:
                loaded = load_checkpoint(checkpoints, proj.name, proj.version, proj.state_type())
            if loaded is None:
                loaded = Loaded(0, proj.initial(), "")
            self.states[proj.name] = loaded.state
            self.seqs[proj.name] = self._saved_seq[proj.name] = loaded.seq
            self._unverified[proj.name] = (loaded.seq, loaded.at)

    @property
    def seq(self) -> int:
        """The seq every projection has reached."""
        return min(self.seqs.values(), default=0)

    async def catch_up(self) -> dict[str, Any]:
        """Apply every new event and return a copy of the states.

        The log is read a page at a time; a page longer than INLINE_FOLD events (the first
        open of a long log) is folded in a worker thread, so the event loop never stalls.
        """
        async with self._lock:
            if self._unverified:  # first: checkpoints of another log are rebuilt
                foreign = await foreign_checkpoints(self.store, self._unverified)
                self._unverified = {}
                for proj in self.projections:
                    if proj.name in foreign:
                        self.states[proj.name] = proj.initial()
                        self.seqs[proj.name] = self._saved_seq[proj.name] = 0
                if foreign:
                    await discard_checkpoints(self.store, self.checkpoints, foreign)
            if self.projections:
                head = await self._fold_new()
                # That last read saw every event up to its last_seq: none left for anyone.
                for name in self.seqs:
                    self.seqs[name] = max(self.seqs[name], head)
                if self._checkpoint_due(force=False):
                    await self._save_or_report()
            return dict(self.states)

    async def take(self, events: Sequence[Event]) -> bool:
        """Fold `events` an append just returned when they are the log's very next events
        for every projection (consecutive seqs right after `seq`): what reading them back
        would fold, without the read. False (nothing folded) otherwise: the next catch_up
        reads them."""
        async with self._lock:
            if self._unverified or not events or not self.projections:
                return False
            first = events[0].seq
            if any(seq != first - 1 for seq in self.seqs.values()) or any(
                    e.seq != first + n for n, e in enumerate(events)):
                return False
            if len(events) > INLINE_FOLD:
                await asyncio.to_thread(self._fold, list(events))
            else:
                self._fold(list(events))
            return True

    async def _save_or_report(self) -> None:
        """Checkpoint; a disk that refuses is logged once (until a save works again) and
        retried at the next interval, never raised: a checkpoint is only a cache."""
        try:
            await self._save_now()
        except OSError as exc:
            self._saved_at = time.monotonic()
            if not self._save_failing:
                log.warning("pulse: cannot write the projections' checkpoints in %s (%s): "
                            "folds go on in memory, a restart replays more of the log",
                            self.checkpoints, exc)
            self._save_failing = True
        else:
            self._save_failing = False

    async def _fold_new(self) -> int:
        """Fold every event after `seq`; the log's newest seq as the last read saw it."""
        head = 0
        async for page in self.store.pages(self.seq, kinds=self._kinds, limit=self.page):
            if len(page.events) > INLINE_FOLD:
                await asyncio.to_thread(self._fold, page.events)
            else:
                self._fold(page.events)
            head = page.last_seq
        return head

    def _fold(self, events: list[Event]) -> None:
        """Fold a page (ascending seqs) into each projection not past it, in one call."""
        if not events:
            return
        last = events[-1].seq
        for proj in self.projections:
            name = proj.name
            seen = self.seqs[name]
            if last <= seen:
                continue
            mine = [e for e in events if e.seq > seen
                    and (proj.kinds is None or e.kind in proj.kinds)]
            if mine:
                self.states[name] = proj.apply_all(self.states[name], mine)
            self.seqs[name] = last

    def _checkpoint_due(self, *, force: bool) -> bool:
        if self.checkpoints is None:
            return False
        behind = max(self.seqs[n] - self._saved_seq[n] for n in self.seqs) if self.seqs else 0
        due = time.monotonic() - self._saved_at >= self.checkpoint_interval
        return force or behind >= self.checkpoint_every or (due and behind > 0)

    async def _save_now(self) -> None:
        """Write every projection that moved, each with the id of the event at its seq (the
        caller holds the lock, so nothing folds meanwhile)."""
        moved = {n: seq for n, seq in self.seqs.items() if seq != self._saved_seq[n]}
        ats = {seq: await id_at(self.store, seq) for seq in set(moved.values())}
        await asyncio.to_thread(self._save, {n: ats[seq] for n, seq in moved.items()})

    def _save(self, ats: Mapping[str, str]) -> None:
        assert self.checkpoints is not None
        for proj in self.projections:
            name = proj.name
            if name in ats:
                save_checkpoint(self.checkpoints, name, proj.version, self.seqs[name],
                                self.states[name], at=ats[name])
                self._saved_seq[name] = self.seqs[name]
        self._saved_at = time.monotonic()

    async def checkpoint(self) -> None:
        """Write every projection that moved since its last checkpoint."""
        async with self._lock:
            if self._checkpoint_due(force=True):
                await self._save_now()
