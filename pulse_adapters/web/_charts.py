"""Charts of vitals as server-rendered SVG: what a chart draws (points, failures, units), its
axes (time ticks, value ticks with units) and the two renderings, a full chart and a
sparkline. Fully offline and CSP-safe: presentation attributes only, no style, no script.

A chart marks each point it draws with a `<circle class="point">` and says how many on its
root (`data-points`); each failed sample (or bucket of them) is a `class="failed"` mark
(`data-failures`); the line breaks where samples failed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple
from xml.sax.saxutils import escape, quoteattr

import msgspec

UNIT_WORDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("percent", frozenset({"percent", "pct"})),
    ("bytes", frozenset({"bytes"})),
    ("ms", frozenset({"ms"})),
    ("s", frozenset({"s", "seconds", "secs"})),
)
"""A field's unit by the last word of its name (words split at `_` and `-`): `cpu_pct` is
percent, `rss_bytes` bytes, `latency_ms` ms, `uptime_s` s; anything else is a plain number."""

COLOURS = {"line": "#2764c5", "band": "#2764c5", "failed": "#b3261e", "axis": "#6b6f73",
           "grid": "#e6e7e8", "text": "#1d2021", "back": "#ffffff"}
FONT = "system-ui, sans-serif"
TIME_STEPS_MS = (60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000,
                 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000, 172_800_000)
"""The spacings time ticks may have (1 min up to 2 days): the smallest giving at most
TIME_TICKS_MAX ticks is used."""
TIME_TICKS_MAX = 8
DAY_MS = 86_400_000


class Point(msgspec.Struct, frozen=True, gc=False):
    """One point of a field's series: a sample, or a bucket of samples (their mean time, the
    smallest, largest and mean value, and how many); `gap` says the line breaks before it
    (a sample failed, or lacked the field, since the previous point)."""

    t: int
    min: float
    max: float
    mean: float
    n: int = 1
    gap: bool = False


class Failure(msgspec.Struct, frozen=True, gc=False):
    """A failed sample, or a bucket of them: the first one's time and error, and how many."""

    t: int
    error: str
    n: int = 1


class FieldSeries(msgspec.Struct, frozen=True):
    """A numeric field's points over a window, oldest first, with its unit."""

    unit: str
    points: list[Point]


def unit_of(field: str) -> str:
    """The unit of a (dotted) field name: its last part's, else its parent's (`disk_pct./`),
    as one of "percent", "bytes", "ms", "s", or "" (a plain number)."""
    for part in reversed(field.split(".")[-2:]):
        word = part.replace("-", "_").rsplit("_", 1)[-1].lower()
        for unit, words in UNIT_WORDS:
            if word in words:
                return unit
    return ""


class Scale(NamedTuple):
    """How values are shown on an axis: divided by `divisor`, followed by `suffix`."""

    divisor: float
    suffix: str


def scale_for(unit: str, magnitude: float) -> Scale:
    """The scale that shows values up to `magnitude` of `unit` readably (bytes as KiB, MiB,
    GiB; ms as s from 2 s; s as min or h; large plain numbers as k, M, G)."""
    if unit == "percent":
        return Scale(1.0, "%")
    if unit == "bytes":
        names = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
        power = min(len(names) - 1, int(math.log(magnitude, 1024)) if magnitude >= 1 else 0)
        return Scale(1024.0 ** power, f" {names[power]}")
    if unit == "ms":
        return Scale(1000.0, " s") if magnitude >= 2_000 else Scale(1.0, " ms")
    if unit == "s":
        if magnitude >= 7_200:
            return Scale(3600.0, " h")
        return Scale(60.0, " min") if magnitude >= 120 else Scale(1.0, " s")
    for threshold, divisor, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if magnitude >= threshold:
            return Scale(divisor, suffix)
    return Scale(1.0, "")


class Ticks(NamedTuple):
    """Value ticks: the values (in the field's own unit), their labels, and the axis range."""

    values: list[float]
    labels: list[str]
    low: float
    high: float


def value_ticks(low: float, high: float, unit: str, most: int = 6) -> Ticks:
    """Round ticks covering [low, high], labelled with `unit` scaled readably."""
    if high <= low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    scale = scale_for(unit, max(abs(low), abs(high)))
    lo, hi = low / scale.divisor, high / scale.divisor
    raw = (hi - lo) / (most - 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    factor = next(f for f in (1.0, 2.0, 2.5, 5.0, 10.0) if f * magnitude >= raw * 0.999)
    step = factor * magnitude
    first, last = math.floor(lo / step) * step, math.ceil(hi / step) * step
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if factor == 2.5 else 0)
    scaled = [round(first + i * step, 12) for i in range(round((last - first) / step) + 1)]
    labels = [f"{v:.{decimals}f}{scale.suffix}" for v in scaled]
    values = [v * scale.divisor for v in scaled]
    return Ticks(values, labels, values[0], values[-1])


def time_ticks(since: int, until: int) -> list[tuple[int, str]]:
    """Ticks over [since, until] (ms) on round local times, labelled HH:MM, or with the day
    (`Tue 14:00`) when the span is longer than a day."""
    span = max(until - since, 1)
    step = next((s for s in TIME_STEPS_MS if span / s <= TIME_TICKS_MAX), TIME_STEPS_MS[-1])
    offset = time.localtime(until / 1000).tm_gmtoff * 1000
    pattern = "%a %H:%M" if span > DAY_MS else "%H:%M"
    first = -(-(since + offset) // step) * step - offset
    return [(t, time.strftime(pattern, time.localtime(t / 1000)))
            for t in range(first, until + 1, step)]


def _number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _runs(points: Sequence[Point]) -> Iterator[list[Point]]:
    """The points split where the line breaks."""
    run: list[Point] = []
    for point in points:
        if point.gap and run:
            yield run
            run = []
        run.append(point)
    if run:
        yield run


class _Frame(NamedTuple):
    """Where the plot sits in the SVG and what it spans: time across, values up."""

    left: float
    top: float
    width: float
    height: float
    since: int
    until: int
    low: float
    high: float

    def x(self, t: int) -> str:
        share = (t - self.since) / max(self.until - self.since, 1)
        return _number(self.left + min(max(share, 0.0), 1.0) * self.width)

    def y(self, value: float) -> str:
        share = (value - self.low) / ((self.high - self.low) or 1.0)
        return _number(self.top + (1.0 - share) * self.height)


def _series_marks(frame: _Frame, points: Sequence[Point], radius: float | None) -> list[str]:
    """The min-max band, the line of means and one circle per point (only the last one's
    when `radius` is None, as a sparkline has it)."""
    line, back = COLOURS["line"], COLOURS["band"]
    marks: list[str] = []
    for run in _runs(points):
        if any(p.min < p.max for p in run):
            upper = [f"{frame.x(p.t)},{frame.y(p.max)}" for p in run]
            lower = [f"{frame.x(p.t)},{frame.y(p.min)}" for p in reversed(run)]
            if len(run) > 1:
                marks.append(f'<polygon class="band" points="{" ".join(upper + lower)}" '
                             f'fill="{back}" fill-opacity="0.18" stroke="{back}" '
                             f'stroke-opacity="0.35" stroke-linejoin="round"/>')
            else:
                marks.append(f'<line class="band" x1="{frame.x(run[0].t)}" '
                             f'x2="{frame.x(run[0].t)}" y1="{frame.y(run[0].max)}" '
                             f'y2="{frame.y(run[0].min)}" stroke="{back}" stroke-opacity="0.4"/>')
        if len(run) > 1:
            coords = " ".join(f"{frame.x(p.t)},{frame.y(p.mean)}" for p in run)
            marks.append(f'<polyline class="line" points="{coords}" fill="none" '
                         f'stroke="{line}" stroke-width="1.5" stroke-linejoin="round"/>')
    if radius is None:
        last = points[-1]
        marks.append(f'<circle class="last" cx="{frame.x(last.t)}" cy="{frame.y(last.mean)}" '
                     f'r="1.8" fill="{line}"/>')
    else:
        marks.extend(f'<circle class="point" cx="{frame.x(p.t)}" cy="{frame.y(p.mean)}" '
                     f'r="{radius:g}" fill="{line}"/>' for p in points)
    return marks


def _failure_marks(frame: _Frame, failures: Sequence[Failure], tall: float) -> list[str]:
    colour = COLOURS["failed"]
    bottom = frame.top + frame.height
    return [f'<line class="failed" x1="{frame.x(f.t)}" x2="{frame.x(f.t)}" '
            f'y1="{_number(bottom - tall)}" y2="{_number(bottom)}" stroke="{colour}" '
            f'stroke-width="2"><title>{escape(_failed_text(f))}</title></line>'
            for f in failures]


def _failed_text(failure: Failure) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(failure.t / 1000))
    many = f"{failure.n} samples failed from {stamp}" if failure.n > 1 else f"failed at {stamp}"
    return f"{many}: {failure.error}"


def _open(width: int, height: int, points: int, failures: int, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="{FONT}" font-size="12" '
            f'role="img" aria-label={quoteattr(label)} data-points="{points}" '
            f'data-failures="{failures}"><title>{escape(label)}</title>')


def chart_svg(title: str, series: FieldSeries, failures: Sequence[Failure], since: int,
              until: int, *, width: int = 900, height: int = 280) -> str:
    """A full chart of one field over [since, until]: title, time and value axes with units,
    the min-max band, the line of means (broken where samples failed), one circle per point,
    and a red mark per failure."""
    points = series.points
    ticks = value_ticks(min((p.min for p in points), default=0.0),
                        max((p.max for p in points), default=0.0), series.unit)
    frame = _Frame(72.0, 36.0, width - 72.0 - 20.0, height - 36.0 - 32.0, since, until,
                   ticks.low, ticks.high)
    right, bottom = frame.left + frame.width, frame.top + frame.height
    axis, grid, text = COLOURS["axis"], COLOURS["grid"], COLOURS["text"]
    parts = [_open(width, height, len(points), len(failures), title),
             f'<rect width="{width}" height="{height}" fill="{COLOURS["back"]}"/>',
             f'<text class="title" x="{frame.left:g}" y="22" font-size="14" font-weight="600" '
             f'fill="{text}">{escape(title)}</text>', '<g class="y-axis">']
    labelled = list(zip(ticks.values, ticks.labels, strict=True)) if points else []
    for value, label in labelled:
        y = frame.y(value)
        parts.append(f'<line x1="{frame.left:g}" x2="{right:g}" y1="{y}" y2="{y}" '
                     f'stroke="{grid}"/><text class="tick" x="{frame.left - 6:g}" y="{y}" '
                     f'dy="4" text-anchor="end" fill="{axis}">{escape(label)}</text>')
    parts.append('</g><g class="x-axis">')
    for t, label in time_ticks(since, until):
        x = frame.x(t)
        parts.append(f'<line x1="{x}" x2="{x}" y1="{frame.top:g}" y2="{bottom:g}" '
                     f'stroke="{grid}"/><text class="tick" x="{x}" y="{bottom + 18:g}" '
                     f'text-anchor="middle" fill="{axis}">{escape(label)}</text>')
    parts.append(f'</g><path d="M{frame.left:g},{frame.top:g}V{bottom:g}H{right:g}" '
                 f'fill="none" stroke="{axis}"/>')
    if not points:
        parts.append(f'<text class="empty" x="{frame.left + frame.width / 2:g}" '
                     f'y="{frame.top + frame.height / 2:g}" text-anchor="middle" '
                     f'fill="{axis}">no samples in this window</text>')
    parts.extend(_series_marks(frame, points, 3.0 if len(points) <= 120 else 1.6))
    parts.extend(_failure_marks(frame, failures, 10.0))
    parts.append("</svg>")
    return "".join(parts)


def spark_svg(label: str, series: FieldSeries | None, failures: Sequence[Failure],
              since: int, until: int, *, width: int = 160, height: int = 28) -> str:
    """A sparkline: the line of means of one field over [since, until], its last point, and a
    red mark per failure; no axes. With no series (no numbers), an empty but valid SVG."""
    points = series.points if series is not None else []
    if not points:
        return _open(width, height, 0, len(failures), f"{label}: no numbers") + "</svg>"
    low = min(p.min for p in points)
    high = max(p.max for p in points)
    frame = _Frame(2.0, 3.0, width - 4.0, height - 6.0, since, until, low,
                   high if high > low else low + 1.0)
    parts = [_open(width, height, len(points), len(failures), label)]
    parts.extend(_series_marks(frame, points, None))
    parts.extend(_failure_marks(frame, failures, 6.0))
    parts.append("</svg>")
    return "".join(parts)
