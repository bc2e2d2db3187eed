"""One claimed run, start to finish: listen for cancels, heartbeat, run the engine,
and `finalize()` on every exit path.

Cancel delivery: the fast path is the run's control group on the channel layer
(`run.cancel` fires the signal at once); the slow path is each heartbeat's answer, so
a cancel lands even with the channel layer down. `finalize()` settles through the
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
from django.utils import timezone

from runs import events, groups, transitions
from runs.agent import outcomes, providers
from runs.agent.breaker import Breakers
from runs.agent.config import EngineConfig
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
    fastpath: object  # FastPath
    config: EngineConfig
    breakers: Breakers
    stats: Stats = field(default_factory=Stats)
    provider_for: object = providers.for_run  # (run) -> Provider
    tools: object = None  # () -> {name: Tool}; None for the built-ins
    policy: object = None  # (call) -> refusal or None


@dataclass
class RunState:
    run_id: object
    signal: object
    # How the cancel arrived: channel | heartbeat | commit refused (the database guard
    # saw it first) | shutdown | dispatch | lost.
    cancel_via: str = ""
    lost: bool = False
    fired_at: float = 0.0  # monotonic: when the cancel reached this worker

    def fire(self, via):
        if not self.signal.is_cancelled():
            self.cancel_via = self.cancel_via or via
            self.fired_at = time.monotonic()
            self.signal.cancel()


async def execute(run, *, signal, ctx, state=None):
    """Run `run` (claimed by `ctx.worker_id`) to its end and settle it. Returns the Outcome."""
    state = state or RunState(run.id, signal)
    progress = Progress(run.id, ctx.fastpath, hz=ctx.config.progress_hz, step=run.steps)
    listen = Listener(groups.control(run.id), _control_handler(state, progress, ctx), ctx.fastpath)
    await listen.ensure()
    await _beat(run, state, ctx)  # a cancel asked between claim and subscribe lands here
    beats = asyncio.ensure_future(_heartbeats(run, state, ctx, listen))
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
                fire=lambda: state.fire("commit refused"),
            )
            outcome = await engine.run()
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
        await finalize(run, outcome, state=state, ctx=ctx, totals=engine.totals if engine else None,
                       discarded=engine.discarded if engine else None,
                       tasks=[beats], closers=[listen, progress, provider])
    return outcome


async def finalize(run, outcome, *, state, ctx, totals=None, discarded=None, tasks=(), closers=()):
    """Runs on every exit path. Record the discarded step and settle (unless
    abandoned) in one transaction; the settle (or whichever transition ended the run
    first) resolves still-queued inputs as cancelled, failed or interrupted, exactly
    once. Then stop listening and beating, and re-arm the signal last."""
    try:
        if outcome.abandoned and discarded:
            await ctx.db.call(_record_discard, run.id, ctx.worker_id, discarded)
        elif not outcome.abandoned:
            # A cancelled run's settle is what the operator is waiting for: no queueing.
            call = ctx.db.urgent if outcome.status == Run.Status.CANCELLED else ctx.db.call
            won = await call(_discard_and_settle, run.id, ctx.worker_id, outcome, totals, discarded)
            via = ""
            if outcome.status == Run.Status.CANCELLED:
                took = f", settled {1000 * (time.monotonic() - state.fired_at):.1f} ms after it arrived" if state.fired_at else ""
                via = f" (cancel via {state.cancel_via or 'signal'}{took})"
            log.info("run %s settled %s/%s%s%s", run.id, outcome.status, outcome.reason, via, "" if won else " (late: ignored)")
    except Exception:  # noqa: BLE001 - the reaper settles what we could not
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
    def handle(message):
        kind = message.get("type")
        if kind == "run.cancel":
            state.fire("channel")
        elif kind == "run.resync" and message.get("reply_channel"):
            return ctx.fastpath.send(message["reply_channel"], progress.snapshot())
        return None

    return handle


class Listener:
    """The run's control-group subscription; retried on heartbeats while the fast
    path is down, so a run outlives a Redis restart with its fast path back."""

    def __init__(self, group, handler, fastpath):
        self.group, self.handler, self.fastpath = group, handler, fastpath
        self.subscription = None

    async def ensure(self):
        if self.subscription is None and self.fastpath.available:
            self.subscription = await self.fastpath.subscribe(self.group, self.handler)

    async def close(self):
        if self.subscription is not None:
            await self.subscription.close()


async def _heartbeats(run, state, ctx, listen):
    while True:
        await asyncio.sleep(ctx.config.heartbeat_s)
        await _beat(run, state, ctx)
        await listen.ensure()


async def _beat(run, state, ctx):
    try:
        beat = await ctx.db.call(transitions.heartbeat, run.id, worker=ctx.worker_id)
    except Exception as error:  # noqa: BLE001 - a missed beat is retried next interval
        log.warning("run %s: heartbeat failed: %s", run.id, error)
        return
    if not beat.held:
        state.lost = True
        state.fire("lost")
    elif beat.cancel_requested:
        state.fire("heartbeat")
    elif run.deadline is not None and timezone.now() >= run.deadline:
        await ctx.db.call(
            transitions.request_cancel, run.id, by="watchdog",
            source=Run.CancelSource.WATCHDOG, note="deadline passed",
        )
        state.fire("heartbeat")
