"""One heartbeat loop per worker: every held run beaten in one statement per interval.

`transitions.heartbeat_many` answers, per run, whether the worker still holds it and
whether a cancel is pending; that answer is the slow path of cancel delivery, so a
cancel lands within about one interval even when the control plane is down. A run the
worker no longer holds (retired, reaped, taken over) is marked lost and stopped; a run
past its deadline (its wall-clock budget) is asked to stop by its worker, through the watchdog's own rule
(`watchdog.stop_past_deadline`: the database clock decides, the note is the same).

The loop runs while some run is registered and ends with the last one (a Worker starts
it again with its next run). The periodic beat goes on the database pool's urgent lane:
one statement a second must not queue behind a wave of step commits. A starting run's
welcome beat goes on the regular lane, batched with the runs starting with it.
"""

import asyncio
import logging

from django.utils import timezone

from runs import transitions, watchdog
from runs.models import Run

log = logging.getLogger(__name__)


class Heartbeats:
    def __init__(self, *, worker_id, db, interval_s):
        self.worker_id, self.db, self.interval_s = worker_id, db, interval_s
        self._runs = {}  # run id -> (RunState, deadline or None)
        self._loop = None
        self._deadlines = set()  # run ids whose deadline cancel is in flight
        self._gathering = None  # (run ids, task) of the welcome beat being gathered
        self._welcoming = None  # the last welcome beat's task
        self.beats = 0  # statements sent; tests read it

    def add(self, state, deadline=None):
        self._runs[state.run_id] = (state, deadline)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.ensure_future(self._beat_forever())

    def remove(self, state):
        """After this no answer reaches `state` (its signal may be re-armed for another
        run right after)."""
        entry = self._runs.get(state.run_id)
        if entry is not None and entry[0] is state:
            del self._runs[state.run_id]

    async def welcome(self, state):
        """Beat a run that just started (and subscribed) without waiting an interval: a
        cancel asked between its claim and its subscription is heard here. Runs that
        start together share one statement: the batch gathers while the previous one
        is in flight, so 250 runs claimed in a burst cost a handful of statements."""
        ids, batch = self._gather()
        ids.append(state.run_id)
        await asyncio.shield(batch)

    def _gather(self):
        if self._gathering is None:
            ids = []
            batch = asyncio.ensure_future(self._welcome_batch(ids, self._welcoming))
            self._gathering, self._welcoming = (ids, batch), batch
        return self._gathering

    async def _welcome_batch(self, ids, before):
        if before is not None:  # one welcome batch in flight at a time; meanwhile this one gathers
            await asyncio.gather(before, return_exceptions=True)
        if self._gathering is not None and self._gathering[0] is ids:
            self._gathering = None  # closed: later runs gather into the next batch
        # The regular lane: runs start in bursts (a worker filling 250 slots), and the
        # urgent lane is for cancels' settles, which may be arriving at the same time.
        await self._beat(list(ids), lane=self.db.call)

    async def close(self):
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    async def _beat_forever(self):
        while self._runs:
            await asyncio.sleep(self.interval_s)  # the interval itself: a clock
            if self._runs:
                await self._beat(list(self._runs))

    async def _beat(self, run_ids, lane=None):
        try:
            answers = await (lane or self.db.urgent)(transitions.heartbeat_many, run_ids, worker=self.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a missed beat is retried next interval
            if not getattr(getattr(self.db, "outage", None), "active", False):  # the pool logs outages itself
                log.warning("worker %s: heartbeat of %d run(s) failed: %s", self.worker_id, len(run_ids), error)
            return
        self.beats += 1
        now = timezone.now()
        for run_id in run_ids:
            entry, beat = self._runs.get(run_id), answers.get(run_id)
            if entry is None or beat is None:  # ended while the beat was in flight
                continue
            state, deadline = entry
            if not beat.held and state.parking:
                continue  # released by its own engine to wait, not taken from it
            if not beat.held:  # retired, reaped or taken over: stop now, whatever it awaits
                state.lost = True
                state.fire("lost")
                state.hard_stop()
            elif beat.cancel_requested:
                state.fire("heartbeat")
            # Our clock only says when to ask; the database's decides (a skewed worker
            # asks again on the next beat).
            elif deadline is not None and now >= deadline and run_id not in self._deadlines:
                self._deadlines.add(run_id)
                asyncio.ensure_future(self._deadline_passed(state))

    async def _deadline_passed(self, state):
        try:
            asked = await self.db.call(
                watchdog.stop_past_deadline, [state.run_id], by=self.worker_id, source=Run.CancelSource.WORKER,
            )
        except Exception as error:  # noqa: BLE001 - retried on the next beat; the watchdog stops it too
            log.warning("run %s: deadline stop failed: %s", state.run_id, error)
            return
        finally:
            self._deadlines.discard(state.run_id)
        if asked and self._runs.get(state.run_id, (None,))[0] is state:
            state.fire("heartbeat")
