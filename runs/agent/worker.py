"""The worker: claim queued runs, run them as asyncio tasks, heartbeat, settle.

`Worker(worker_id, concurrency=4, agents=None).serve(stop)` runs until `stop` is set,
inside any event loop (`run_agents` standalone, or the server's loop when embedded),
claiming runs of `agents`: by default those it has a provider for (`scripted`,
`openai`), so a run meant for an external agent (agent API) is never taken here.
Each of the `concurrency` slots owns a CancelSignal that its runs use in turn (the
runner re-arms it after each run). Whatever the concurrency, the worker holds a fixed
number of things: `worker_db_connections` database connections (RUNWARDEN_WORKER_DB_CONNECTIONS, half of
them the urgent lane's; runs' database calls queue for them), one control-plane
connection that hears every run's cancels, one data-plane connection that publishes
every run's deltas in batches, and one heartbeat statement per interval for all runs. A new queued run wakes an idle worker through the
channel layer when it is up; otherwise the worker polls every `claim_poll_s`.

Shutdown (stop set, e.g. on SIGTERM): claim nothing more, let running runs finish
within `shutdown_grace_s`, then stop the rest at their next checkpoint (their signal
fires; the in-flight step is discarded as for a cancel) and settle them failed /
`worker_shutdown`, retryable: a rolling deploy is not an operator cancelling runs. No
cancel is recorded for it (a pending cancel turns a failure into cancelled), so a run an
operator cancelled meanwhile still ends cancelled. A SIGKILL leaves the runs to the
reaper (failed / worker_lost, retryable).
A run waiting for an operator is not among them: the engine released it (no slot, no
heartbeat), and once answered it is queued again for whichever worker claims it first.
"""

import asyncio
import logging

from channels.layers import InMemoryChannelLayer

from runs import groups, transitions
from runs.agent import providers
from runs.agent.breaker import Breakers
from runs.agent.cancel import CancelSignal
from runs.agent.config import EngineConfig
from runs.agent.db_pool import DbPool
from runs.agent.fastpath import FastPath
from runs.agent.runner import RunState, WorkerContext, execute

log = logging.getLogger(__name__)

# After the grace and the shutdown signal, how long runs get to reach a checkpoint and settle.
CANCEL_WAIT_S = 5.0


def pool_lanes(size):
    """(regular, urgent) threads for a budget of `size` connections. Half go to the
    urgent lane (cancels' settles, the heartbeat): measured at 250 live runs, a burst
    of cancels is what queues, not the step commits (2 urgent threads: p50 1.3-1.8 s
    request -> cancelled; 4: 0.3 s, on this 2-core machine under load)."""
    urgent = max(1, size // 2)
    return max(1, size - urgent), urgent


class Worker:
    def __init__(self, worker_id, *, concurrency=4, agents=None, config=None, db=None, fastpath=None,
                 provider_for=None, tools=None, policy=None):
        self.worker_id = worker_id
        self.concurrency = max(1, int(concurrency))
        # Only agents this engine can run: a queued run of an external agent (one that
        # claims through the agent API) must never be taken and failed here.
        self.agents = list(agents) if agents else list(providers.AGENTS)
        self.config = config or EngineConfig.from_settings()
        self._db = db
        self._fastpath = fastpath
        self._extras = {k: v for k, v in {"provider_for": provider_for, "tools": tools, "policy": policy}.items() if v}
        self.active = {}  # task -> RunState
        self.ctx = None
        self.ready = asyncio.Event()  # set once serving: tests and the CLI wait on it

    async def serve(self, stop):
        fastpath = self._fastpath or FastPath()
        # The in-memory layer's queues belong to this loop, so broadcasts must come back
        # to it; with Redis, runs.broadcast sends from its own long-lived publisher loop.
        local = isinstance(fastpath.layer, InMemoryChannelLayer)
        regular, urgent = pool_lanes(self.config.worker_db_connections)
        db = self._db or DbPool(
            size=regular, urgent_size=urgent, name=f"rw-db-{self.worker_id}",
            broadcast_loop="caller" if local else None,
        )
        self.ctx = WorkerContext(
            worker_id=self.worker_id, db=db, fastpath=fastpath, config=self.config,
            breakers=Breakers(threshold=self.config.breaker_threshold, reset_s=self.config.breaker_reset_s),
            **self._extras,
        ).planes()
        idle = [CancelSignal() for _ in range(self.concurrency)]
        freed, wake = asyncio.Event(), asyncio.Event()
        listing = await self.ctx.fastpath.subscribe(
            # A new run, or an answered one queued again (`resume`): either may be ours.
            groups.LIST_GROUP, lambda m: wake.set() if m.get("status") == "queued" else None
        )
        log.info("worker %s serving (concurrency %d, agents %s)", self.worker_id, self.concurrency, ",".join(self.agents))
        self.ready.set()
        try:
            while not stop.is_set():
                if not idle:
                    freed.clear()
                    await _first(stop.wait(), freed.wait())
                    continue
                wake.clear()  # before the claim: a run created during it wakes us again
                try:
                    run = await db.call(transitions.claim_next, worker=self.worker_id, agents=self.agents)
                except Exception as error:  # noqa: BLE001 - the database is back soon, or never
                    outage = getattr(db, "outage", None)
                    if outage is None or not outage.active:  # an outage is logged once, by the pool
                        log.warning("worker %s: claim failed (%s); retrying", self.worker_id, error)
                    run = None
                if run is None:
                    await _first(stop.wait(), wake.wait(), timeout=self.config.claim_poll_s)
                    continue
                signal = idle.pop()
                state = RunState(run.id, signal)
                task = asyncio.ensure_future(execute(run, signal=signal, ctx=self.ctx, state=state))
                self.active[task] = state
                task.add_done_callback(lambda t, s=signal: (self.active.pop(t, None), idle.append(s), freed.set()))
        finally:
            await self._shutdown()
            if listing is not None:
                await listing.close()
            await self.ctx.aclose()
            if self._db is None:
                await db.aclose()
            log.info("worker %s stopped", self.worker_id)

    async def _shutdown(self):
        if not self.active:
            return
        grace = self.config.shutdown_grace_s
        log.info("worker %s stopping: %d run(s) get %.1fs to finish", self.worker_id, len(self.active), grace)
        _, pending = await asyncio.wait(set(self.active), timeout=grace)
        if not pending:
            return
        states = [self.active[t] for t in pending if t in self.active]
        log.info("worker %s: stopping %d run(s) still going; they end failed/worker_shutdown (retryable)",
                 self.worker_id, len(states))
        for state in states:
            state.fire("shutdown")  # a run already cancelled keeps its cancel (and its via)
        _, stubborn = await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
        if stubborn:
            log.warning("worker %s: %d run(s) neither stopped nor settled in %.0fs (no checkpoint reached, or "
                        "the database is away): left to the reaper", self.worker_id, len(stubborn), CANCEL_WAIT_S)
        for task in stubborn:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _first(*aws, timeout=None):
    """Wait for the first of `aws` (or the timeout); cancel the others."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
