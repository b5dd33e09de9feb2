"""The AwarenessExecutor: evidence, inference, one repair, the gate, and atomic settlement.

The model proposes; this code decides. Nothing is written unless the gate accepts it, the
source human exchange still stands, and the changes, the cycle record and any journal entry
go into the log in one transaction. Each identity's whole review runs under the log's
exclusive lock `awareness:<identity>`, so among every engine sharing the log (a fleet on one
PostgreSQL database) at most one reviews an identity at a time, and a review whose world was
already reviewed by another makes no model call. A settlement the store cannot take is sent
again unchanged (stored once) through an outage of SETTLE_PATIENCE_S, and one that may be
stored (AppendOutcomeUnknown) is never recorded over by a failed cycle.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import msgspec

from pulse_adapters.awareness.config import AwarenessConfig
from pulse_adapters.awareness.contract import (
    REPLY_CHARS,
    Envelope,
    InvalidEnvelope,
    envelope_schema,
    parse_envelope,
    system_prompt,
)
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.evidence import Evidence, build_evidence
from pulse_adapters.awareness.fingerprint import fingerprint
from pulse_adapters.awareness.foreground import Foreground
from pulse_adapters.awareness.gate import WRITER, GateResult, Verb, gate
from pulse_adapters.awareness.ledger import REVIEWED, CycleRecord
from pulse_adapters.llm import (
    ChatClient,
    InferenceTimeout,
    LlmError,
    Preempted,
    RouteHealth,
    Usage,
    excerpt,
    json_schema_format,
)
from pulse_core import (
    AppendOutcomeUnknown,
    Event,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    LockLost,
    StoreError,
    VersionConflict,
    error_draft,
    write_through_outage,
)
from pulse_core.memory import (
    IdentityMemory,
    identity_key,
    recallable_from_events,
    remember,
    reveal_memory,
)

log = logging.getLogger("pulse.awareness")

ORIGIN = WRITER
ERROR_CHARS = 500
"""The longest error text a cycle record keeps."""
SETTLE_PATIENCE_S = 30.0
"""How long a settlement is sent again while the store is unavailable; then the attempt
fails (a settlement that may be stored is not recorded over by a failed cycle) and the rule
asks again."""
ALREADY_REVIEWED = "already-reviewed"
"""The outcome (in `effect-acked`, not a cycle) of a review whose world another review settled
after this one was asked for: no model call, nothing written."""


class _Failed(Exception):
    def __init__(self, outcome: str, error: str) -> None:
        super().__init__(error)
        self.outcome, self.error = outcome, error


class _Cycle:
    """One review in progress: its record so far, the model calls it has made and the tokens
    they used."""

    def __init__(self, record: CycleRecord) -> None:
        self.record = record
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def used(self, usage: Usage | None) -> None:
        """Count the tokens a model call used, as its server reported them."""
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens


def _verb_draft(verb: Verb, memory: IdentityMemory, cause: int) -> EventDraft:
    record = verb.target.partition(":")[2]
    key = identity_key(memory.identity)
    if verb.verb == "adjust_confidence":
        old = memory.state[record].confidence
        new = min(1.0, max(0.0, old + (verb.delta or 0.0)))
        data: dict[str, Any] = {"record": record, "confidence": round(new, 6),
                                "reason": verb.reason}
        return EventDraft("state-revised", key, data, origin=ORIGIN, cause=cause)
    if verb.verb == "revise_value":
        data = {"record": record, "value": verb.value, "value_changed": True,
                "reason": verb.reason}
        return EventDraft("state-revised", key, data, origin=ORIGIN, cause=cause)
    kind_name = "state-retracted" if verb.verb == "retract" else "unresolved-resolved"
    return EventDraft(kind_name, key, {"record": record, "reason": verb.reason},
                      origin=ORIGIN, cause=cause)


class AwarenessExecutor(Executor):
    """Runs `awareness-review` effects against an OpenAI-compatible model."""

    handles = (AwarenessReview,)
    max_attempts = 1  # a failed cycle is recorded and backs off; it is not retried blindly

    def __init__(self, client: ChatClient, config: AwarenessConfig | None = None, *,
                 route: RouteHealth | None = None, foreground: Foreground | None = None) -> None:
        self.client = client
        self.config = config or AwarenessConfig()
        self.route = route
        self.foreground = foreground
        self.timeout = client.max_wall_s * 2 + 30 + self.config.foreground_wait_s

    async def _memory(self, events: EventStore, identity: str, after: IdentityMemory | None,
                      after_seq: int, head: int = 0, *, cycles: list[Event] | None = None,
                      read: list[Event] | None = None) -> tuple[IdentityMemory | None, int, int]:
        """The identity's memory folded on from `after_seq`, the last seq read, and the
        key's version (which also counts the reviewer's own ledger events); the cycle
        records read are added to `cycles`, and every event read to `read`."""
        memory = after
        seq = after_seq
        found = await events.read(after_seq, key=identity_key(identity))
        if read is not None:
            read += found
        for event in found:
            if event.kind == "awareness-cycle":
                if cycles is not None:
                    cycles.append(event)
            elif event.kind != "awareness-journal":
                memory = remember(memory, event)
            seq, head = event.seq, event.version
        return memory, seq, head

    @staticmethod
    def _reviewed_since(effect: AwarenessReview, asked_at: int, cycles: list[Event]
                        ) -> Event | None:
        """The identity's last successful cycle, when it reviewed the world this effect asks
        about (same source and fingerprint): reviewed already, by another engine whose
        review settled before or after this one was asked for (another engine's tick may
        not have seen it yet). A review the quiet ceiling asks for is redone unless that
        cycle settled after it was asked (seq `asked_at`)."""
        for event in reversed(cycles):
            data = event.data if isinstance(event.data, dict) else {}
            if data.get("outcome") != REVIEWED:
                continue
            same = (data.get("source") == effect.source
                    and data.get("fingerprint") == effect.fingerprint)
            fresh = effect.reason != "ceiling" or event.seq > asked_at
            return event if same and fresh else None
        return None

    async def _ask(self, evidence: Evidence, review: AwarenessReview, cycle: _Cycle
                   ) -> tuple[Envelope, int]:
        """The model's envelope and the inference time (calls counted in `cycle`); `_Failed`
        otherwise."""
        foreground = self.foreground
        shared = review.route == "fallback" or self.config.shared_route
        cancel = foreground.active if foreground is not None and shared else None
        if foreground is not None and cancel is not None:
            wait_s = self.config.foreground_wait_s
            if not await foreground.wait_free(wait_s):
                raise _Failed("preempted", f"foreground work ({', '.join(foreground.holders)}) "
                                           f"held the shared model route for {wait_s:g} s")
        fmt = json_schema_format("awareness_review", envelope_schema(self.config))
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system_prompt(self.config)},
            {"role": "user", "content": evidence.text}]
        started = time.perf_counter()
        try:
            cycle.calls = 1
            reply = await self.client.complete(messages, response_format=fmt, cancel=cancel,
                                               max_tokens=self.config.max_tokens,
                                               max_chars=REPLY_CHARS)
            cycle.used(reply.usage)
            try:
                envelope = parse_envelope(reply.text, self.config)
            except InvalidEnvelope as bad:
                cycle.calls = 2
                repair = [*messages, {"role": "assistant", "content": reply.text[:4000]},
                          {"role": "user", "content": (
                              f"That reply was invalid ({bad}). Reply again with only the JSON "
                              "object the schema describes.")}]
                reply = await self.client.complete(repair, response_format=fmt, cancel=cancel,
                                                   max_tokens=self.config.max_tokens,
                                                   max_chars=REPLY_CHARS)
                cycle.used(reply.usage)
                envelope = parse_envelope(reply.text, self.config)
        except Preempted as exc:
            raise _Failed("preempted", str(exc)) from None
        except LlmError as exc:
            if self.route is not None and exc.route_failure:
                self.route.poison(f"{type(exc).__name__}: {exc}")  # a mid-stream failure
            outcome = "timed-out" if isinstance(exc, InferenceTimeout) else "failed"
            raise _Failed(outcome, f"{type(exc).__name__}: {exc}") from None
        except InvalidEnvelope as exc:
            raise _Failed("failed", f"invalid reply after one repair: {exc}") from None
        return envelope, int((time.perf_counter() - started) * 1000)

    async def execute(self, effect: AwarenessReview, ctx: ExecutionContext) -> dict[str, Any]:
        """One review cycle under the identity's exclusive lock, always recorded: whatever
        fails inside it (the model, its reply, the gate, the settlement) is settled as a
        `failed` cycle with the calls made. A world already reviewed since the effect was
        asked for is left as it is (outcome `already-reviewed`, no cycle); a lock that cannot
        be taken (the database is down), or is lost before the settlement (the log refuses
        appends under a lost lock: LockLost, never tried again), fails the attempt itself at
        once, and the rule asks again. A lock lost once the settlement is stored does not
        undo it: the outcome is returned with `lock_lost` saying so, and an `error` event
        records it."""
        cycle = _Cycle(CycleRecord(
            identity=effect.identity, outcome="failed", reason=effect.reason,
            route=effect.route, model=self.client.model, quiet_skips=effect.quiet_skips,
            fingerprint=effect.fingerprint, source=effect.source,
            narration_only=effect.narration_only))
        settled: dict[str, Any] | None = None
        try:
            async with ctx.events.exclusive(f"awareness:{effect.identity}"):
                try:
                    settled = await self._review(effect, ctx, cycle)
                except AppendOutcomeUnknown:  # its settlement may be stored: not recorded over
                    raise
                except LockLost:  # nothing more can be written under it: the rule asks again
                    raise
                except Exception as exc:  # every failure, foreseen or not, becomes the record
                    settled = await self._settle(ctx, cycle, msgspec.structs.replace(
                        cycle.record, outcome="failed", model_calls=cycle.calls,
                        error=excerpt(f"unexpected {type(exc).__name__}: {exc}", ERROR_CHARS)),
                        [], None)
        except Exception as exc:
            if settled is None:
                raise
            return await self._lock_lost(ctx, settled, exc)
        return settled

    @staticmethod
    async def _lock_lost(ctx: ExecutionContext, settled: dict[str, Any], exc: Exception
                         ) -> dict[str, Any]:
        """`settled` saying that leaving the lock failed after the settlement was stored
        (`exc`); recorded as an `error` event too, unless the log cannot take it now."""
        text = f"{type(exc).__name__}: {exc}"
        try:
            await ctx.events.append([error_draft(ORIGIN, exc, {"effect": ctx.effect_id})])
        except StoreError as failed:  # the log is down too: say so where it can be seen
            log.warning("pulse: %s: effect %s settled, then %s (recording it failed: %s)",
                        ORIGIN, ctx.effect_id, text, failed)
        return {**settled, "lock_lost": excerpt(text, ERROR_CHARS)}

    async def _review(self, effect: AwarenessReview, ctx: ExecutionContext,
                      cycle: _Cycle) -> dict[str, Any]:
        identity = effect.identity
        cycles: list[Event] = []
        history: list[Event] = []  # the key's whole history: what recall folds its stages from
        memory, seen, head = await self._memory(ctx.events, identity, None, 0, cycles=cycles,
                                                read=history)
        done = self._reviewed_since(effect, ctx.seq, cycles)
        if done is not None:
            return {"outcome": ALREADY_REVIEWED, "accepted": 0, "rejected": 0, "error": None,
                    "cycle": done.seq}
        base = cycle.record
        human = memory.last_human if memory else None
        if memory is None or human is None or effect.source in memory.removed:
            return await self._settle(ctx, cycle, msgspec.structs.replace(
                base, outcome="source-gone", error="the source exchange is gone"), [], None)
        if human.record != effect.source:  # a newer exchange came: review the world as it is
            base = msgspec.structs.replace(base, source=human.record,
                                           fingerprint=fingerprint(memory))
        keys = ctx.events.keys  # sealed element text is opened only to be shown and gated
        shown = recallable_from_events(memory, history)  # archived, tombstoned: not evidence
        evidence = build_evidence(await asyncio.to_thread(reveal_memory, shown, keys),
                                  self.config)
        base = cycle.record = msgspec.structs.replace(
            base, counts=evidence.counts, available=evidence.available,
            observation_ids=evidence.observation_ids)
        try:
            envelope, took = await self._ask(evidence, effect, cycle)
        except _Failed as failed:
            return await self._settle(ctx, cycle, msgspec.structs.replace(
                base, outcome=failed.outcome, error=failed.error, model_calls=cycle.calls),
                [], None)
        calls = cycle.calls
        for _ in range(5):
            memory, seen, head = await self._memory(ctx.events, identity, memory, seen, head)
            assert memory is not None
            if base.source in memory.removed or memory.last_human is None:
                record = msgspec.structs.replace(
                    base, outcome="source-gone", model_calls=calls, inference_ms=took,
                    narration=envelope.narration,
                    error="the source exchange was forgotten or quarantined during review")
                return await self._settle(ctx, cycle, record, [], None)
            basis = human.ts  # the newest human exchange the evidence showed
            opened = await asyncio.to_thread(reveal_memory, memory, keys)
            measured = gate(envelope.verbs, evidence.allowlist, opened, self.config,
                            writer=ORIGIN, reviewed_at=basis)
            result = (gate(envelope.verbs, evidence.allowlist, opened, self.config,
                           narration_only=True, writer=ORIGIN, reviewed_at=basis)
                      if effect.narration_only else measured)
            record = self._record(base, envelope, result, measured=measured, calls=calls,
                                  took=took)
            drafts = [_verb_draft(v, memory, ctx.seq) for v in result.accepted]
            try:
                return await self._settle(ctx, cycle, record, drafts, head,
                                          journal=envelope.meaningful_change)
            except VersionConflict:
                continue  # the identity's memory changed meanwhile (a writer outside the lock)
        return await self._settle(ctx, cycle, msgspec.structs.replace(
            base, outcome="failed", model_calls=calls, inference_ms=took,
            error="identity kept changing during settlement"), [], None)

    @staticmethod
    def _record(base: CycleRecord, envelope: Envelope, result: GateResult, *,
                measured: GateResult, calls: int, took: int) -> CycleRecord:
        return msgspec.structs.replace(
            base, outcome=REVIEWED, model_calls=calls, inference_ms=took,
            meaningful_change=envelope.meaningful_change, narration=envelope.narration,
            accepted=[msgspec.to_builtins(v) for v in result.accepted],
            rejected=[msgspec.to_builtins(r) for r in result.rejected],
            proposed=len(envelope.verbs), would_reject=len(measured.rejected))

    async def _settle(self, ctx: ExecutionContext, cycle: _Cycle, record: CycleRecord,
                      drafts: list[EventDraft], version: int | None, *,
                      journal: bool = False) -> dict[str, Any]:
        record = msgspec.structs.replace(record, prompt_tokens=cycle.prompt_tokens,
                                         completion_tokens=cycle.completion_tokens)
        key = identity_key(record.identity)
        all_drafts = [*drafts, EventDraft("awareness-cycle", key, msgspec.to_builtins(record),
                                          origin=ORIGIN, cause=ctx.seq)]
        if journal and record.outcome == REVIEWED and record.narration:
            all_drafts.append(EventDraft("awareness-journal", key,
                                         {"narration": record.narration}, origin=ORIGIN,
                                         cause=ctx.seq))
        expect = {key: version} if version is not None else None
        token = uuid.uuid4().hex  # one settlement: sent again as it is, stored once
        settlement = [
            d if d.idem is not None else msgspec.structs.replace(d, idem=f"awareness:{token}:{i}")
            for i, d in enumerate(all_drafts)]
        await write_through_outage(lambda: ctx.events.append(settlement, expect=expect),
                                   patience_s=SETTLE_PATIENCE_S,
                                   what=f"awareness: the review of {record.identity}")
        return {"outcome": record.outcome, "accepted": len(record.accepted),
                "rejected": len(record.rejected), "error": record.error}

