"""The end of a process's output log, and its new lines as they are written."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulse_survival import Essential, NoProcessLog, follow, log_of, output_log, tail


def test_tail_gives_the_last_lines_of_a_log_longer_than_one_read(tmp_path: Path) -> None:
    log = tmp_path / "bot.log"
    log.write_text("".join(f"line {n:05d} {'x' * 60}\n" for n in range(3_000)))  # ~200 KB
    assert tail(log, 3) == [f"line {n:05d} {'x' * 60}" for n in (2_997, 2_998, 2_999)]
    assert len(tail(log, 2_500)) == 2_500 and tail(log, 2_500)[0].startswith("line 00500")
    assert tail(log, 0) == []
    log.write_text("no newline at the end")
    assert tail(log, 5) == ["no newline at the end"]


def test_follow_gives_whole_lines_as_they_come_and_starts_over_on_truncation(
        tmp_path: Path) -> None:
    log = tmp_path / "bot.log"
    log.write_text("before\n")
    lines = follow(log, poll_s=0.01)
    with log.open("a") as out:
        out.write("one\ntw")
    assert next(lines) == "one"
    with log.open("a") as out:
        out.write("o\n")
    assert next(lines) == "two"  # a line cut by a read waits for its end
    log.write_text("cut\n")  # shorter than what was read: truncated, read from its start
    assert next(lines) == "cut"


def test_where_the_log_is_and_why_there_is_none(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    started = Essential(name="bot", argv=("bot",), pidfile="/run/bot.pid")
    assert output_log(started, logs) == logs / "bot.log"
    own = Essential(name="bot", pidfile="/run/bot.pid", log=str(tmp_path / "own.log"))
    assert output_log(own, logs) == tmp_path / "own.log"
    with pytest.raises(NoProcessLog, match="bot has no output log: no `log` is configured"):
        log_of(Essential(name="bot", match_name="bot"), logs)
    with pytest.raises(NoProcessLog, match=r"bot's output log .*bot.log does not exist yet"):
        log_of(started, logs)
