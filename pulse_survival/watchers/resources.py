"""system-resource: CPU, memory, swap and disk use, from psutil."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psutil

from pulse_core import Sample, Watcher


class SystemResourceWatcher(Watcher):
    """CPU %, memory %, swap % and disk % of each path; wakes the tick under pressure."""

    name = "system-resource"

    def __init__(self, disk_paths: Sequence[str], memory_pct: float, disk_pct: float,
                 interval: float = 5.0) -> None:
        super().__init__()
        self.disk_paths = tuple(disk_paths)
        self.memory_pct = memory_pct
        self.disk_pct = disk_pct
        self.interval = interval
        psutil.cpu_percent(interval=None)  # the first call only primes the counter

    def _read(self) -> dict[str, Any]:
        disks: dict[str, float | None] = {}
        for path in self.disk_paths:
            try:
                disks[path] = psutil.disk_usage(path).percent
            except OSError:
                disks[path] = None
        return {
            "cpu_pct": psutil.cpu_percent(interval=None),
            "memory_pct": psutil.virtual_memory().percent,
            "swap_pct": psutil.swap_memory().percent,
            "disk_pct": disks,
        }

    async def collect(self) -> dict[str, Any]:
        return await self.in_thread(self._read)

    def should_wake(self, window: Sequence[Sample]) -> bool:
        if not window or not window[-1].ok:
            return False
        return under_pressure(window[-1].data, self.memory_pct, self.disk_pct)


def under_pressure(data: Any, memory_pct: float, disk_pct: float) -> bool:
    """Whether one system-resource sample shows memory or any disk over its threshold."""
    if not isinstance(data, dict):
        return False
    disks = data.get("disk_pct") or {}
    return float(data.get("memory_pct") or 0) > memory_pct or any(
        v is not None and v > disk_pct for v in disks.values())
