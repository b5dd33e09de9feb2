"""The error-log watcher on real files (appends, rotation, truncation, huge lines, files that
appear later), its watchfiles wake-up, and error_escalate through a real engine."""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pulse_core import Engine, ManualClock, Sample, VitalsStore
from pulse_core._watchers import watch_forever
from pulse_survival import ErrorLogPolicy, SurvivalConfig
from pulse_survival.watchers import ErrorLogWatcher
from tests.timing import eventually, scaled

PATTERNS = ("ERROR", "CRITICAL", "Traceback")
MB = 1024 * 1024


def append(path: Path, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, "ab") as out:
        out.write(data)


@pytest.fixture
async def follow() -> AsyncIterator[Callable[..., ErrorLogWatcher]]:
    """`follow(*files, **kwargs)`: an ErrorLogWatcher on real files, closed after the test."""
    watchers: list[ErrorLogWatcher] = []

    def make(*files: Path | str, **kwargs: Any) -> ErrorLogWatcher:
        kwargs.setdefault("patterns", PATTERNS)
        watcher = ErrorLogWatcher([str(f) for f in files], **kwargs)
        watchers.append(watcher)
        return watcher

    try:
        yield make
    finally:
        for watcher in watchers:
            await watcher.aclose()


async def collect(watcher: ErrorLogWatcher) -> dict[str, Any]:
    return await asyncio.wait_for(watcher.collect(), 10)


# -- following files -------------------------------------------------------------------------


async def test_a_line_matching_several_patterns_counts_once_and_once_per_pattern(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    watcher = follow(log)
    assert (await collect(watcher))["matches"] == 0

    append(log, "ERROR CRITICAL Traceback: all three\ninfo: fine\nCRITICAL disk\nERROR x ERROR\n")
    data = await collect(watcher)
    assert data["matches"] == 3
    assert data["by_pattern"] == {"ERROR": 2, "CRITICAL": 2, "Traceback": 1}
    assert data["by_file"] == {str(log): 3}
    assert data["examples"] == ["ERROR CRITICAL Traceback: all three", "CRITICAL disk",
                                "ERROR x ERROR"]
    assert (await collect(watcher))["matches"] == 0  # nothing new: nothing counted again


async def test_lines_present_before_following_started_are_not_counted(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("ERROR old one\nTraceback old two\nERROR half-written old li")
    watcher = follow(log)
    assert (await collect(watcher))["matches"] == 0
    append(log, "ne\nERROR new\n")
    data = await collect(watcher)
    # the tail of the line that was being written is not a line of its own that matches
    assert (data["matches"], data["examples"]) == (1, ["ERROR new"])


async def test_a_partial_line_is_counted_once_it_is_finished(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    watcher = follow(log)
    await collect(watcher)
    append(log, "ERROR being wri")
    assert (await collect(watcher))["matches"] == 0
    append(log, "tten\n")
    data = await collect(watcher)
    assert (data["matches"], data["examples"]) == (1, ["ERROR being written"])


async def test_a_file_that_does_not_exist_yet_is_followed_from_its_first_line_once_it_appears(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "later.log"
    watcher = follow(log)
    assert (await collect(watcher))["by_file"] == {str(log): 0}
    assert (await collect(watcher))["matches"] == 0

    log.write_text("ERROR first\nok\nTraceback second\n")
    data = await collect(watcher)
    assert (data["matches"], data["examples"]) == (2, ["ERROR first", "Traceback second"])
    assert (await collect(watcher))["matches"] == 0


async def test_each_file_is_counted_on_its_own(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("")
    watcher = follow(a, b)
    await collect(watcher)
    append(a, "ERROR a1\nERROR a2\n")
    append(b, "CRITICAL b1\n")
    data = await collect(watcher)
    assert data["by_file"] == {str(a): 2, str(b): 1}
    assert data["matches"] == 3


async def test_rotation_counts_the_old_files_unread_lines_and_the_new_files_lines_none_twice(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("ERROR history\n")
    watcher = follow(log)
    await collect(watcher)
    append(log, "ERROR before-1\n")
    assert (await collect(watcher))["examples"] == ["ERROR before-1"]

    # the logger writes more, then rotates (rename) before we collect, then writes anew
    append(log, "ERROR before-2\ninfo\nERROR before-3 unterminated")
    log.rename(tmp_path / "app.log.1")
    log.write_text("ERROR after-1\nTraceback after-2\n")
    data = await collect(watcher)
    assert data["examples"] == ["ERROR before-2", "ERROR before-3 unterminated",
                                "ERROR after-1", "Traceback after-2"]
    assert data["matches"] == 4

    assert (await collect(watcher))["matches"] == 0
    append(log, "ERROR after-3\n")
    append(tmp_path / "app.log.1", "ERROR late write to the rotated file\n")
    data = await collect(watcher)
    assert (data["matches"], data["examples"]) == (1, ["ERROR after-3"])


async def test_a_file_deleted_and_created_again_is_followed_from_its_first_line(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    watcher = follow(log)
    await collect(watcher)
    log.unlink()
    assert (await collect(watcher))["matches"] == 0
    log.write_text("ERROR reborn\n")
    assert (await collect(watcher))["examples"] == ["ERROR reborn"]


async def test_truncation_counts_only_the_lines_written_after_it(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("".join(f"ERROR history {n}\n" for n in range(50)))
    watcher = follow(log)
    await collect(watcher)
    append(log, "ERROR one\nERROR two\nERROR three\n")
    assert (await collect(watcher))["matches"] == 3

    # truncated in place (copytruncate): the same inode, shorter than where we had read to.
    # (a truncation followed by more bytes than had been read before the next collect cannot
    # be told from an append by size; that is the limit of following by offset)
    inode = log.stat().st_ino
    os.truncate(log, 0)
    append(log, "ERROR after\ninfo\n")
    assert log.stat().st_ino == inode
    data = await collect(watcher)
    assert (data["matches"], data["examples"]) == (1, ["ERROR after"])
    assert (await collect(watcher))["matches"] == 0


async def test_a_5_mb_line_without_newline_is_counted_once_in_bounded_memory(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    watcher = follow(log)  # max_line_bytes: the default, 64 KiB
    await collect(watcher)
    huge = b"ERROR " * (5 * MB // 6)
    append(log, huge)
    del huge

    tracemalloc.start()
    try:
        data = await collect(watcher)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MB, f"collect held {peak / MB:.1f} MB for a 5 MB line"
    assert data["matches"] == 1  # one line, however long: not one per 64 KiB of it
    assert len(data["examples"]) == 1 and len(data["examples"][0]) <= 300

    # the rest of that line (up to its newline) is still the same line; then lines count again
    append(log, b"ERROR " * 20_000 + b"tail of the long line\nERROR next\n")
    data = await collect(watcher)
    assert (data["matches"], data["examples"]) == (1, ["ERROR next"])

    append(log, b"x" * (5 * MB) + b"\nCRITICAL after plain bytes\n")
    data = await collect(watcher)
    assert (data["matches"], data["examples"]) == (1, ["CRITICAL after plain bytes"])


# -- waking early: watchfiles ----------------------------------------------------------------


async def samples_of(vitals: VitalsStore, key: str = "error-log") -> list[Sample]:
    return await vitals.window(key, 0)


INTERVAL_S = 30.0
"""The watchers' (and the engine's tick) interval in the wake tests: a wake comes from the
file watch when it comes well before this."""


async def wait_for(predicate: Callable[[], Any], within: float) -> float:
    """Poll `predicate` (async) every 20 ms until it is truthy; seconds taken, or fail after
    `within` seconds."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await predicate():
        if loop.time() - started > within:
            raise AssertionError(f"not within {within:g} s")
        await asyncio.sleep(0.02)
    return loop.time() - started


async def watch_is_live(log: Path, vitals: VitalsStore) -> None:
    """Append harmless lines until one wakes a collect: the file watch the first collect
    starts is then set up (on a loaded machine that can take a while)."""
    for _ in range(int(scaled(60))):
        count = len(await samples_of(vitals))

        async def sampled(after: int = count) -> bool:
            return len(await samples_of(vitals)) > after

        append(log, "info: is the watch up?\n")
        try:
            await wait_for(sampled, 1.0)
            return
        except AssertionError:
            continue
    raise AssertionError(f"no append to {log} woke a collect in {scaled(60):g} s")


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-path", "relative-path"])
async def test_an_appended_line_wakes_a_collect_long_before_the_interval(
    tmp_path: Path, follow: Callable[..., ErrorLogWatcher], monkeypatch: pytest.MonkeyPatch,
    relative: bool,
) -> None:
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "app.log"
    log.write_text("")
    if relative:
        monkeypatch.chdir(tmp_path)
    watcher = follow(Path("logs/app.log") if relative else log, interval=INTERVAL_S)
    vitals = await VitalsStore.open(tmp_path / "vitals.db")
    woken: list[int] = []
    task = asyncio.create_task(watch_forever(watcher, vitals, lambda: woken.append(1)))
    try:
        await wait_for(lambda: samples_of(vitals), scaled(10))  # the first collect, at once
        assert len(await samples_of(vitals)) == 1 and not woken
        await watch_is_live(log, vitals)
        before = len(await samples_of(vitals))

        append(log, "ERROR wake up\n")

        async def matched() -> bool:
            return any(s.ok and s.data["matches"] for s in await samples_of(vitals))

        await wait_for(matched, INTERVAL_S / 2)  # woken by the append, not by the interval
        samples = await samples_of(vitals)
        assert len(samples) == before + 1 and samples[-1].data["examples"] == ["ERROR wake up"]

        async def asked_for_a_tick() -> bool:  # should_wake runs just after the sample lands
            return bool(woken)

        await wait_for(asked_for_a_tick, scaled(10))
        assert not task.done(), "the watcher loop failed"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await vitals.close()


async def test_a_running_engine_notifies_an_error_line_long_before_its_next_tick(
    tmp_path: Path
) -> None:
    log = tmp_path / "app.log"
    log.write_text("ERROR history\n")
    engine = Engine(tmp_path / "home", default_tick_ms=int(INTERVAL_S * 1000),
                    survival=SurvivalConfig(error_log=ErrorLogPolicy(files=(str(log),))))
    async with engine:
        async def followed() -> bool:
            return "error-log" in await engine.vitals.latest(["error-log"])

        await wait_for(followed, scaled(10))
        await watch_is_live(log, engine.vitals)
        append(log, "Traceback (most recent call last):\n")

        async def notified() -> bool:
            return bool([e for e in await engine.events.read(kinds=["notification"])
                         if e.key == "error-log"])

        await wait_for(notified, INTERVAL_S / 2)  # a tick woken by the line, not the 30 s one
        (notice,) = [e for e in await engine.events.read(kinds=["notification"])
                     if e.key == "error-log"]
        assert notice.data["level"] == "warning"
        assert notice.data["text"].startswith("1 error lines in the logs")
        assert [q["text"] for q in notice.data["quoted"]] == \
            ["Traceback (most recent call last):"]  # quoted, never in pulse's own text


# -- error_escalate through an engine --------------------------------------------------------


async def error_notices(engine: Engine) -> list[dict[str, Any]]:
    bodies = [e.data["effect"] for e in await engine.events.read(kinds=["effect"])]
    return [b for b in bodies if b["type"] == "notify" and b["topic"] == "error-log"]


def escalating_config(log: Path, digest_every_s: int = 10) -> SurvivalConfig:
    return SurvivalConfig(error_log=ErrorLogPolicy(files=(str(log),), patrol_tick_ms=500,
                                                   patrol_for_s=10,
                                                   digest_every_s=digest_every_s))


async def test_matches_are_notified_at_once_then_in_one_digest_an_interval_with_patrols(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("ERROR history\n")
    clock = ManualClock()
    engine: Engine = await open_engine(tmp_path / "home", clock=clock,
                                       survival=escalating_config(log))
    calm = (await engine.step()).tick_ms
    assert calm > 500
    assert await error_notices(engine) == []

    append(log, "ERROR one\ninfo\nCRITICAL two\n")
    clock.advance(1_000)
    assert (await engine.step()).tick_ms == 500
    (notice,) = await error_notices(engine)
    assert notice["level"] == "warning"
    assert notice["text"] == "2 error lines in the logs (CRITICAL 1, ERROR 1)"
    assert notice["quoted"] == [{"source": "error-log", "text": "ERROR one"},
                                {"source": "error-log", "text": "CRITICAL two"}]

    clock.advance(1_000)  # no new lines: no new notice, still patrolling
    assert (await engine.step()).tick_ms == 500
    append(log, "Traceback three\n")
    clock.advance(1_000)  # within digest_every_s of the notice: held for the next digest
    assert (await engine.step()).tick_ms == 500
    assert len(await error_notices(engine)) == 1

    clock.advance(8_000)  # 10 s after the notice: the digest of what was held back
    assert (await engine.step()).tick_ms == 500
    digest = (await error_notices(engine))[1]
    assert digest["text"] == "1 error lines in the logs (Traceback 1)"
    assert [q["text"] for q in digest["quoted"]] == ["Traceback three"]

    clock.advance(9_999)  # patrol_for_s after the digest...
    assert (await engine.step()).tick_ms == 500
    clock.advance(2)  # ...is over: the calm tick again
    assert (await engine.step()).tick_ms == calm
    assert len(await error_notices(engine)) == 2
    assert len([e for e in await engine.events.read(kinds=["notification"])
                if e.key == "error-log"]) == 2


async def test_a_sample_already_escalated_is_not_escalated_again_after_a_restart(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    clock = ManualClock()
    first: Engine = await open_engine(tmp_path / "home", clock=clock,
                                      survival=escalating_config(log))
    await first.step()
    append(log, "ERROR before the restart\n")
    clock.advance(1_000)
    await first.step()
    assert len(await error_notices(first)) == 1
    await first.close()

    clock.advance(1_000)
    second: Engine = await open_engine(tmp_path / "home", clock=clock,
                                       survival=escalating_config(log))
    # a started engine may tick before its watchers' first collect: the newest error-log
    # sample is then still the one the first engine already escalated
    assert (await second.tick()).tick_ms == 500  # still patrolling, by the ledger
    await second.executor_loop.run_until_idle()
    assert len(await error_notices(second)) == 1

    append(log, "ERROR after the restart\n")
    clock.advance(1_000)
    await second.step()  # the new watcher starts at the end of the file: history
    clock.advance(1_000)
    append(log, "ERROR and another\n")
    await second.step()  # counted by the new watcher, held until digest_every_s is over
    assert len(await error_notices(second)) == 1
    clock.advance(10_000)
    await second.step()
    assert [(n["text"], [q["text"] for q in n["quoted"]])
            for n in await error_notices(second)] == [
        ("1 error lines in the logs (ERROR 1)", ["ERROR before the restart"]),
        ("1 error lines in the logs (ERROR 1)", ["ERROR and another"])]


def test_the_error_log_interval_and_patterns_come_from_the_config(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "home", survival=SurvivalConfig(error_log=ErrorLogPolicy(
        files=(str(tmp_path / "a.log"),), patterns=("panic",), max_line_bytes=4096)))
    (watcher,) = [w for w in engine.watchers if isinstance(w, ErrorLogWatcher)]
    assert [str(f.path) for f in watcher.files] == [str(tmp_path / "a.log")]
    assert [p for p, _ in watcher.patterns] == ["panic"]
    assert watcher.max_line_bytes == 4096
    assert os.fspath(watcher.key) == "error-log"


async def test_a_file_watch_that_dies_is_reported_in_a_sample_and_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pulse_survival.watchers import errorlog

    log = tmp_path / "app.log"
    log.write_text("")
    starts = 0

    async def no_watches(*args: object, **kwargs: object) -> AsyncIterator[object]:
        nonlocal starts
        starts += 1
        raise OSError(28, "inotify watch limit reached")
        yield  # an async generator, like watchfiles.awatch

    monkeypatch.setattr(errorlog.watchfiles, "awatch", no_watches)
    watcher = errorlog.ErrorLogWatcher([str(log)], ["ERROR"])
    try:
        assert (await watcher.collect())["matches"] == 0
        # the watch starts after a hop to a thread: on a loaded machine, not at once
        await eventually(lambda: starts == 1, what="the watch's first start (and its death)")
        with pytest.raises(RuntimeError, match="inotify watch limit reached"):
            await watcher.collect()
        assert (await watcher.collect())["matches"] == 0
        await eventually(lambda: starts == 2,
                         what="the watch started again after its failure was reported")
    finally:
        await watcher.aclose()


async def test_a_close_cancelled_while_the_file_watch_ends_is_cancelled_not_finished(
        tmp_path: Path) -> None:
    """Closing cancels the file watch and waits for it; a cancel of the close itself meanwhile
    (an engine stop bounded by a timeout) ends the close with CancelledError, never lost, and
    the files are closed all the same."""
    log = tmp_path / "app.log"
    log.write_text("")
    watcher = ErrorLogWatcher([str(log)], ["ERROR"])
    await watcher.collect()  # starts the watch, and opens the file
    assert watcher._watch_task is not None and not watcher._watch_task.done()
    assert all(f.handle is not None for f in watcher.files)
    closing = asyncio.create_task(watcher.aclose())
    await asyncio.sleep(0)  # the close has cancelled the watch and waits for its end
    assert not watcher._watch_task.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    # closed all the same: what was read is handed over to a watcher built after it
    assert all(f.handle is None for f in watcher.files)


async def test_a_rebuilt_watcher_counts_lines_written_while_the_old_one_was_closed(
    tmp_path: Path,
) -> None:
    # A whole reload (promote, rollback, SIGHUP) closes the engine and builds a new watcher:
    # lines written in between are not history and must be counted.
    log = tmp_path / "app.log"
    log.write_text("ERROR old, before following began\n")
    first = ErrorLogWatcher([str(log)], ["ERROR"])
    assert (await first.collect())["matches"] == 0
    await first.aclose()
    with log.open("a") as out:
        out.write("ERROR during the reload\n")
    second = ErrorLogWatcher([str(log)], ["ERROR"])
    try:
        found = await second.collect()
        assert found["matches"] == 1 and found["examples"] == ["ERROR during the reload"]
    finally:
        await second.aclose()
