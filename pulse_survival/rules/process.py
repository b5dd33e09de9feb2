"""process_watchdog and llm_watchdog: restart what died, with backoff and a budget."""

from __future__ import annotations

from pulse_core import Decision, Effect, Inner, Snapshot
from pulse_survival.config import Essential, LlmPolicy, ProcessPolicy
from pulse_survival.effects import Notify, RestartProcess
from pulse_survival.rules.base import Streak, SurvivalRule, latest, ledger

HOUR_MS = 3_600_000


def restart_of(spec: Essential, reason: str) -> RestartProcess:
    """The restart effect for an essential process."""
    return RestartProcess(name=spec.name, argv=spec.argv, cwd=spec.cwd, env=dict(spec.env),
                          pidfile=spec.pidfile, log=spec.log, reason=reason)


class ProcessWatchdog(SurvivalRule):
    """An essential process is dead: restart it, with exponential backoff between restarts.

    As in supervisord, a restart that does not stay up `startsecs` is a failed start, and
    `startretries` failed starts in a row give up; so does spending `budget_per_hour`
    restarts within an hour. Giving up (and recovering later) is announced once.
    """

    name = "process_watchdog"

    def __init__(self, processes: tuple[Essential, ...], policy: ProcessPolicy) -> None:
        self.processes = processes
        self.policy = policy
        self._failed_starts: dict[str, int] = {}
        self._judged: dict[str, int] = {}

    def _backoff_ms(self, name: str) -> int:
        failed = self._failed_starts.get(name, 0)
        delay = self.policy.backoff_initial_s * 2 ** failed
        return int(min(delay, self.policy.backoff_max_s) * 1000)

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        sample = latest(curr, "process-alive")
        if sample is None or not sample.ok or not isinstance(sample.data, dict):
            return Decision(effects, tick_ms)
        state = ledger(curr)
        added: list[Effect] = []
        for spec in self.processes:
            seen = sample.data.get(spec.name) or {}
            restarts = state.restarts.get(spec.name, ())
            last_restart = restarts[-1] if restarts else None
            if seen.get("alive"):
                if seen.get("uptime_s", 0) >= self.policy.startsecs:
                    self._failed_starts[spec.name] = 0
                    if last_restart is not None:
                        self._judged[spec.name] = last_restart
                if spec.name in state.given_up:
                    added.append(Notify(topic=f"process:{spec.name}", level="recovered",
                                        text=f"{spec.name} is alive again (pid {seen['pid']})"))
                continue
            if spec.name in state.given_up or not spec.argv:
                continue
            if last_restart is not None and sample.ts <= last_restart:
                continue  # the sample predates the last restart: wait for a fresh one
            if (last_restart is not None and sample.ts > last_restart
                    and self._judged.get(spec.name) != last_restart):
                # dead again without having been seen up for startsecs: a failed start
                self._judged[spec.name] = last_restart
                self._failed_starts[spec.name] = self._failed_starts.get(spec.name, 0) + 1
            in_hour = sum(1 for ts in restarts if curr.at - ts < HOUR_MS)
            failed = self._failed_starts.get(spec.name, 0)
            if in_hour >= self.policy.budget_per_hour or failed >= self.policy.startretries:
                why = (f"{in_hour} restarts in the last hour" if in_hour >=
                       self.policy.budget_per_hour else f"{failed} failed starts in a row")
                added.append(Notify(topic=f"process:{spec.name}", level="given-up",
                                    text=f"gave up restarting {spec.name}: {why}"))
                continue
            wait = (restarts[-1] + self._backoff_ms(spec.name) - curr.at) if restarts else 0
            if wait > 0:
                tick_ms = min(tick_ms, max(wait, 100))
                continue
            added.append(restart_of(spec, "not running"))
            tick_ms = min(tick_ms, self._backoff_ms(spec.name))
        return Decision([*effects, *added], tick_ms)


class LlmWatchdog(SurvivalRule):
    """The LLM route probe failing `failures` times in a row: restart the model proxy.

    Reads the vitals key the adapters' route probe writes (data `{"ok": bool}`); restarts
    back off exponentially until the route is healthy again. Without a configured proxy it
    notifies instead.
    """

    name = "llm_watchdog"

    def __init__(self, policy: LlmPolicy) -> None:
        self.policy = policy
        self._streak = Streak()
        self._restarts = 0
        self._next_allowed = 0

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        sample = latest(curr, self.policy.vitals_key)
        if sample is None:
            return Decision(effects, tick_ms)
        healthy = sample.ok and isinstance(sample.data, dict) and bool(sample.data.get("ok"))
        if healthy:
            self._restarts = 0
        count = self._streak.feed(sample, not healthy)
        if count < self.policy.failures or curr.at < self._next_allowed:
            return Decision(effects, tick_ms)
        self._streak.fired()
        delay = min(self.policy.backoff_initial_s * 2 ** self._restarts,
                    self.policy.backoff_max_s)
        self._restarts += 1
        self._next_allowed = curr.at + int(delay * 1000)
        text = f"LLM route failed {count} probes in a row"
        if self.policy.restart is None:
            return Decision([*effects, Notify(topic="llm", level="warning",
                                              text=f"{text}; no proxy configured to restart")],
                            tick_ms)
        return Decision([*effects, restart_of(self.policy.restart, text)], tick_ms)
