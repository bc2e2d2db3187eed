"""Holding a write through a database outage: what is retried, what is not, and that a
cancel still interrupts a held step (never a held settle). The database being away is
exercised for real in test_db_outage.py; here the policy, with attempts that fail as
the pool reports an outage."""

import asyncio

import pytest

from runs.agent import holding
from runs.agent.cancel import Cancelled, CancelSignal
from runs.agent.db_pool import DatabaseUnavailable

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(holding, "FIRST_PAUSE_S", 0.001)
    monkeypatch.setattr(holding, "MAX_PAUSE_S", 0.002)


def failing(times, *, changed_nothing=True):
    seen = []

    async def attempt(first):
        seen.append(first)
        if len(seen) <= times:
            raise DatabaseUnavailable("connection refused", changed_nothing=changed_nothing)
        return "written"

    return attempt, seen


async def test_a_write_that_changed_nothing_is_held_until_the_database_answers():
    attempt, seen = failing(5)
    assert await holding.hold(attempt, what="w") == ("written", 6)
    assert seen == [True, False, False, False, False, False]  # retries may look for a lost answer first


async def test_a_write_that_may_have_landed_is_retried_only_when_idempotent():
    attempt, seen = failing(1, changed_nothing=False)
    with pytest.raises(DatabaseUnavailable):
        await holding.hold(attempt, what="w")
    assert seen == [True]
    attempt, seen = failing(1, changed_nothing=False)
    assert await holding.hold(attempt, what="w", idempotent=True) == ("written", 2)


async def test_other_errors_are_not_held():
    async def attempt(first):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        await holding.hold(attempt, what="w", idempotent=True)


async def test_a_cancel_interrupts_a_held_step_but_not_a_held_settle():
    signal = CancelSignal()
    attempt, seen = failing(10**6)
    held = asyncio.ensure_future(holding.hold(attempt, what="step", signal=signal))
    while len(seen) < 3:
        await asyncio.sleep(0)
    signal.cancel()
    with pytest.raises(Cancelled):
        await asyncio.wait_for(held, 5)
    attempt, seen = failing(20)
    settle = asyncio.ensure_future(holding.hold(attempt, what="settle", idempotent=True))
    signal.cancel()  # fired, but a settle is given no signal: it goes on
    assert await asyncio.wait_for(settle, 5) == ("written", 21)
