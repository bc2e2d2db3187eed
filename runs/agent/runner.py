"""One claimed run, start to finish: listen for cancels, heartbeat, run the engine,
and `finalize()` on every exit path.

Cancel delivery: the fast path is the run's control group, heard on the worker's
control plane (`runs.agent.control`: a connection of its own, apart from the deltas),
where `run.cancel` fires the signal at once; the slow path is the worker's batched
heartbeat (`runs.agent.heartbeats`), whose answer carries pending cancels, so a cancel
lands even with the channel layer down. `finalize()` settles through the
transitions (which resolve still-queued inputs as cancelled, exactly once), releases
the listener and the heartbeat, and re-arms the signal last: a cancel that fired
before the run started ends that run cancelled (checkpoint 10), and the next run on the
same slot starts clean.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field

from django.db import transaction

from runs import events, messages, transitions
from runs.agent import outcomes, providers
from runs.agent.breaker import Breakers
from runs.agent.config import EngineConfig
from runs.agent.control import control_for
from runs.agent.db_pool import retry_safe
from runs.agent.deltas import DeltaPublisher
from runs.agent.heartbeats import Heartbeats
from runs.agent.holding import hold
from runs.agent.loop import Engine, Stats
from runs.agent.progress import Progress
from runs.agent.providers.base import SimulatedDeath
from runs.models import Run, RunEvent

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    """What every run of one worker shares."""

    worker_id: str
    db: object  # DbPool
    fastpath: object  # FastPath: the layer, and the worker's own subscriptions
    config: EngineConfig
    breakers: Breakers
    stats: Stats = field(default_factory=Stats)
    provider_for: object = providers.for_run  # (run) -> Provider
    tools: object = None  # () -> {name: Tool}; None for the built-ins
    policy: object = None  # (call) -> refusal or None
    # The two planes and the heartbeat, one each per worker. Built from `fastpath` on
    # first use when not given (a test may swap `fastpath` before its first run).
    control: object = None  # RedisControl | LayerControl
    deltas: object = None  # DeltaPublisher
    beats: object = None  # Heartbeats

    def planes(self):
        layer = self.fastpath.layer if self.fastpath is not None else None
        if self.control is None:
            self.control = control_for(layer, worker_id=self.worker_id)
        if self.deltas is None:
            self.deltas = DeltaPublisher(layer, hz=self.config.progress_hz)
        if self.beats is None:
            self.beats = Heartbeats(worker_id=self.worker_id, db=self.db, interval_s=self.config.heartbeat_s)
        return self

    async def aclose(self):
        for part in (self.beats, self.deltas, self.control):
            if part is not None:
                await part.close()


@dataclass
class RunState:
    run_id: object
    signal: object
    # How the cancel arrived: channel | heartbeat | commit refused (the database guard
    # saw it first) | shutdown | dispatch | lost.
    cancel_via: str = ""
    lost: bool = False
    fired_at: float = 0.0  # monotonic: when the cancel reached this worker
    engine_task: object = None  # the engine's run, dropped by a hard stop
    hard_stopped: bool = False
    # The engine is releasing the run to wait (suspend with release): from its commit on,
    # a heartbeat answers "not held" because of that release, not because it was taken.
    parking: bool = False

    def fire(self, via):
        if not self.signal.is_cancelled():
            self.cancel_via = self.cancel_via or via
            self.fired_at = time.monotonic()
            self.signal.cancel()

    def hard_stop(self):
        """Drop the engine's task at its current await, whatever it waits on (the
        cooperative cancel was not honoured, or the run is not ours any more): no
        further provider or tool call starts. The run still settles through finalize()."""
        self.fire("hard stop")
        if self.engine_task is not None and not self.engine_task.done() and not self.hard_stopped:
            self.hard_stopped = True
            self.engine_task.cancel()


async def execute(run, *, signal, ctx, state=None):
    """Run `run` (claimed by `ctx.worker_id`) to its end and settle it. Returns the Outcome."""
    state = state or RunState(run.id, signal)
    ctx.planes()
    progress = Progress(run.id, ctx.deltas, step=run.steps)
    link = Link(run.id, state, ctx)
    try:
        await ctx.control.listen(run.id, _control_handler(state, progress, ctx))
        # Subscribed (or the layer is down): a cancel asked between claim and subscribe
        # is in the row, and heard here rather than one interval later.
        ctx.beats.add(state, run.deadline)
        await ctx.beats.welcome(state)
    except BaseException:  # cancelled before it began: nothing may fire this slot's signal later
        await link.close()
        await progress.close()
        raise
    provider = engine = None
    outcome = outcomes.CANCELLED
    try:
        if signal.is_cancelled():  # checkpoint 10: the provider is never built nor called
            state.cancel_via = state.cancel_via or "dispatch"
        else:
            provider = ctx.provider_for(run)
            engine = Engine(
                run, worker_id=ctx.worker_id, signal=signal, provider=provider, db=ctx.db,
                progress=progress, config=ctx.config, breaker=ctx.breakers.get(provider.name),
                stats=ctx.stats, tools=ctx.tools() if ctx.tools else None, policy=ctx.policy,
                fire=state.fire,
                parking=lambda: setattr(state, "parking", True),
            )
            state.engine_task = asyncio.ensure_future(engine.run())
            try:
                outcome = await state.engine_task
            except asyncio.CancelledError:
                if not state.hard_stopped:
                    raise  # the worker itself is being cancelled
                outcome = await _hard_stopped(run, engine, ctx, state)
    except SimulatedDeath:
        log.warning("run %s: simulated worker death; the run is left for the reaper", run.id)
        outcome = outcomes.LOST
    except Exception as error:  # noqa: BLE001 - no provider for it, bad input: it cannot start
        log.exception("run %s could not start", run.id)
        outcome = outcomes.failed(Run.TerminationReason.PROVIDER_FAILED, error)
        if signal.is_cancelled():
            outcome = outcomes.CANCELLED
    finally:
        if state.lost and not outcome.abandoned:  # a released (parked) run stays released
            outcome = outcomes.LOST
        elif outcome == outcomes.CANCELLED and state.cancel_via == "shutdown":
            outcome = outcomes.SHUTDOWN  # stopped like a cancel, settled as a retryable failure
        discarded = engine.discarded if engine else None
        if discarded and outcome == outcomes.SHUTDOWN:
            discarded = {**discarded, "reason": "worker shutdown"}
        await finalize(run, outcome, state=state, ctx=ctx, totals=engine.totals if engine else None,
                       discarded=discarded, closers=[link, progress, provider])
    return outcome


async def _hard_stopped(run, engine, ctx, state):
    """The engine's task was dropped: discard its step in flight as a cancel would
    (nothing half-done is committed: a step is written whole or not) and, if the run is
    still ours, trace it on the timeline."""
    await engine.discard("hard stop")
    if state.lost:  # retired or reaped meanwhile: not ours to write on
        log.info("run %s: no longer held; its task was dropped", run.id)
        return outcomes.LOST
    log.warning("run %s: cancel not honoured; its task was dropped (hard stop)", run.id)
    try:
        await ctx.db.call(events.append, run.id, RunEvent.Kind.HARD_STOPPED, actor=ctx.worker_id)
    except Exception as error:  # noqa: BLE001 - the settle that follows is what matters
        log.warning("run %s: could not record the hard stop: %s", run.id, error)
    return outcomes.CANCELLED


async def finalize(run, outcome, *, state, ctx, totals=None, discarded=None, tasks=(), closers=()):
    """Runs on every exit path. Record the discarded step and settle (unless
    abandoned) in one transaction; the settle (or whichever transition ended the run
    first) resolves still-queued inputs as cancelled, failed or interrupted, exactly
    once. A database outage does not lose the outcome: the settle is held and retried
    until the database answers (heartbeats go on meanwhile, so the reaper leaves the
    run alone). Then stop listening and beating, and re-arm the signal last."""
    try:
        if outcome.abandoned and discarded:
            await ctx.db.call(_record_discard, run.id, ctx.worker_id, discarded)
        elif not outcome.abandoned:
            won, attempts = await _settle_held(run, outcome, ctx, totals, discarded)
            via = ""
            if outcome.status == Run.Status.CANCELLED:
                took = f", settled {1000 * (time.monotonic() - state.fired_at):.1f} ms after it arrived" if state.fired_at else ""
                via = f" (cancel via {state.cancel_via or 'signal'}{took})"
            held = f" (held through a database outage: {attempts} attempts)" if attempts > 1 else ""
            # A guardrail's stop honoured as a cancel is recorded as that stop's ending.
            ended = f"{outcome.status}/{outcome.reason}"
            if won == transitions.SettleOutcome.STOPPED:
                ended = "as its guardrail's stop says"
            log.info("run %s settled %s%s%s%s", run.id, ended, via, held, "" if won else " (late: ignored)")
    except Exception:  # noqa: BLE001 - not the database being away: a bug; the reaper settles it
        log.exception("run %s: settle failed", run.id)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for closer in closers:
            if closer is not None:
                try:
                    await closer.close() if hasattr(closer, "close") else await closer.aclose()
                except Exception:  # noqa: BLE001 - cleanup must reach the reset below
                    log.exception("run %s: cleanup failed", run.id)
        # Last: no listener of this run can fire the fresh token any more.
        state.signal.reset()


async def _settle_held(run, outcome, ctx, totals, discarded):
    """Settle, held through a database outage (see runs.agent.holding): no cancel
    interrupts it, a settle is the end. Returns (won, attempts). Guarded as always: if
    the reaper or a retire won meanwhile, this settle loses and is traced as late."""
    # A cancelled run's settle is what the operator is waiting for: no queueing.
    call = ctx.db.urgent if outcome.status == Run.Status.CANCELLED else ctx.db.call

    def attempt(first):
        return call(_discard_and_settle if first else _settle_again, run.id, ctx.worker_id, outcome, totals, discarded)

    return await hold(attempt, what=f"run {run.id}: settling {outcome.status}/{outcome.reason}", idempotent=True)


@retry_safe  # a read, then the guarded settle
def _settle_again(run_id, worker_id, outcome, totals, discarded):
    # The attempt before may have committed and only its answer been lost: then the
    # settled event is ours, and settling again would trace a "late settle" of our own.
    if RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SETTLED, actor=worker_id).exists():
        return True
    return _discard_and_settle(run_id, worker_id, outcome, totals, discarded)


def _record_discard(run_id, worker_id, discarded):
    events.append(run_id, RunEvent.Kind.STEP_DISCARDED, actor=worker_id, **discarded)


def _discard_and_settle(run_id, worker_id, outcome, totals, discarded):
    # One transaction, settle first: its UPDATE is the transaction's first statement,
    # so `finished_at` (the statement's clock) is not pushed back by the event insert.
    # Both events commit together; the timeline orders them by seq.
    with transaction.atomic():
        won = transitions.settle(
            run_id, status=outcome.status, reason=outcome.reason, worker=worker_id,
            truncated=outcome.truncated, totals=totals,
            error_class=outcome.error_class, error_message=outcome.error_message,
        )
        if discarded:
            _record_discard(run_id, worker_id, discarded)
    return won


def _control_handler(state, progress, ctx):
    # Runs on the control plane's reader: nothing here may wait.
    def handle(message):
        kind = message.get("type")
        if kind == messages.CANCEL:
            state.fire("channel")
            if message.get("hard"):  # the watchdog's escalation of a cancel not honoured
                state.hard_stop()
        elif kind == messages.RESYNC and message.get("reply_channel"):
            ctx.deltas.send(message["reply_channel"], progress.snapshot())

    return handle


class Link:
    """The run's place on the worker's control plane and heartbeat; closed by
    finalize() before the signal is re-armed, so neither can fire the next run's."""

    def __init__(self, run_id, state, ctx):
        self.run_id, self.state, self.ctx = run_id, state, ctx

    async def close(self):
        self.ctx.control.forget(self.run_id)
        self.ctx.beats.remove(self.state)
