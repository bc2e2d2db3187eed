"""Holding work through a database outage.

The worker keeps what it reached (a finished step, an outcome) while PostgreSQL does
not answer, and writes it once it does: a 10 s outage pauses runs at their next write
instead of failing them or leaving them to the reaper. The pool (`runs.agent.db_pool`) says
which failures were the database being away (`DatabaseUnavailable`) and whether the
failed call can have committed anything; this module only waits and tries again.
"""

import asyncio
import logging

from runs.agent import racing
from runs.agent.db_pool import DatabaseUnavailable

log = logging.getLogger(__name__)

# Pauses between attempts: doubling, bounded, so a held write lands within about a
# second of the database's return while an outage costs one cheap connect per second.
FIRST_PAUSE_S, MAX_PAUSE_S = 0.1, 1.0


async def hold(attempt, *, what, signal=None, idempotent=False):
    """`await attempt(first)` until it does not raise DatabaseUnavailable; returns
    (result, attempts). `first` is False on retries, so the caller can first look for
    the effect of an attempt whose answer was lost. A failure that may have committed
    is retried only when `idempotent`; otherwise it is raised. With `signal`, the wait
    is cancel-aware (Cancelled is raised); without, nothing interrupts it (a settle is
    the end). `what` names the held write in the one log line per hold."""
    pause, attempts = FIRST_PAUSE_S, 0
    while True:
        attempts += 1
        try:
            return await attempt(attempts == 1), attempts
        except DatabaseUnavailable as error:
            if not (idempotent or error.changed_nothing):
                raise
            if attempts == 1:  # one line per held write; the pool logs the outage itself
                log.info("%s: database unreachable; holding it until the database answers", what)
        if signal is None:
            await asyncio.sleep(pause)
        else:
            await racing.sleep(signal, pause)
        pause = min(2 * pause, MAX_PAUSE_S)
