"""set_budgets: a run's limits raised or lowered mid-run, audited, guarded, and a limit
lowered below what was spent asking the run to stop."""

import asyncio
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.db import connection, connections
from django.utils import timezone

from runs import budget_edits, groups, transitions
from runs.budget_edits import BudgetOutcome, set_budgets
from runs.models import Run, RunEvent
from tests.conftest import claim_new_run
from tests.runs.test_broadcast import listen

pytestmark = pytest.mark.django_db


def budget_events(run):
    return list(RunEvent.objects.filter(run_id=run.pk, kind="budget_changed").order_by("seq"))


def spend(run, *, tokens=0, cost="0", calls=0, index=0, worker="w1"):
    tool_calls = [{"id": f"c{index}-{n}", "name": "echo", "args": {}, "result": "ok"} for n in range(calls)]
    assert transitions.commit_step(run.id, worker=worker, index=index, kind="tool_calls" if calls else "message",
                                   text="x", tool_calls=tool_calls, tokens_in=tokens, cost=cost)


def test_raising_a_budget_changes_it_and_writes_one_audited_event():
    run = claim_new_run(token_budget=100)
    outcome = set_budgets(run.id, by="alice", source="dashboard", client="10.0.0.7", token_budget=250,
                          cost_budget="1.5")
    assert outcome == BudgetOutcome.CHANGED and outcome
    run = Run.objects.get(pk=run.id)
    assert (run.token_budget, run.cost_budget) == (250, Decimal("1.5"))
    [event] = budget_events(run)
    assert (event.actor, event.source, event.seq) == ("alice", "dashboard", run.event_seq)
    assert event.data == {"changes": {"token_budget": [100, 250], "cost_budget": [None, "1.5"]}, "client": "10.0.0.7"}


def test_none_clears_a_limit_and_an_unchanged_value_is_no_change():
    run = claim_new_run(token_budget=100, cost_budget=Decimal("2"))
    assert set_budgets(run.id, by="alice", source="cli", token_budget=100, cost_budget="2.000") == BudgetOutcome.UNCHANGED
    assert budget_events(run) == []
    assert set_budgets(run.id, by="alice", source="cli", token_budget=None)
    assert Run.objects.get(pk=run.id).token_budget is None
    assert budget_events(run)[0].data["changes"] == {"token_budget": [100, None]}


def test_a_queued_run_can_be_edited_an_ended_one_cannot():
    queued = transitions.create_run(agent="scripted")
    assert set_budgets(queued.id, by="a", source="api", tool_call_budget=4) == BudgetOutcome.CHANGED
    assert transitions.request_cancel(queued.id, by="a")  # queued: settled at once
    assert set_budgets(queued.id, by="a", source="api", tool_call_budget=9) == BudgetOutcome.ALREADY_TERMINAL
    assert Run.objects.get(pk=queued.id).tool_call_budget == 4
    assert set_budgets("no-such-run", by="a", source="api", token_budget=1) == BudgetOutcome.NOT_FOUND
    missing = "00000000-0000-0000-0000-000000000000"
    assert set_budgets(missing, by="a", source="api", token_budget=1) == BudgetOutcome.NOT_FOUND


@pytest.mark.parametrize("limits, says", [
    ({"token_budget": 0}, "token_budget must be a whole number"),
    ({"token_budget": True}, "token_budget must be a whole number"),
    ({"token_budget": "12"}, "token_budget must be a whole number"),
    ({"tool_call_budget": 2**31}, "tool_call_budget must be a whole number"),
    ({"cost_budget": "-1"}, "cost_budget must be more than 0"),
    ({"cost_budget": "NaN"}, "cost_budget must be more than 0"),
    ({"cost_budget": "lots"}, "cost_budget must be a number"),
    ({"cost_budget": "0.0000001"}, "at most 6 decimal places"),
    ({"deadline": "2030-01-01T00:00:00"}, "UTC offset"),
    ({"deadline": "soon"}, "ISO 8601"),
])
def test_bad_values_raise_one_sentence_and_write_nothing(limits, says):
    run = claim_new_run(token_budget=100)
    with pytest.raises(ValueError, match=says):
        set_budgets(run.id, by="a", source="api", **limits)
    assert budget_events(run) == [] and Run.objects.get(pk=run.id).token_budget == 100


def test_a_deadline_must_be_in_the_future():
    run = claim_new_run()
    with pytest.raises(ValueError, match="in the future"):
        set_budgets(run.id, by="a", source="api", deadline=timezone.now() - timedelta(seconds=1))
    later = timezone.now() + timedelta(minutes=5)
    assert set_budgets(run.id, by="a", source="api", deadline=later)
    assert Run.objects.get(pk=run.id).deadline == later


def test_an_unknown_limit_is_a_type_error():
    with pytest.raises(TypeError, match="max_iterations"):
        set_budgets(claim_new_run().id, by="a", source="api", max_iterations=3)


@pytest.mark.parametrize("limit, lowered, spent", [
    ("tokens", {"token_budget": 50}, {"tokens": 60}),
    ("cost", {"cost_budget": "0.10"}, {"cost": "0.25"}),
    ("tool_calls", {"tool_call_budget": 2}, {"calls": 2}),
])
def test_lowering_below_what_was_spent_asks_the_run_to_stop(limit, lowered, spent):
    run = claim_new_run()
    spend(run, **spent)
    assert set_budgets(run.id, by="alice", source="dashboard", **lowered) == BudgetOutcome.CHANGED
    run = Run.objects.get(pk=run.id)
    assert run.cancel_requested_at is not None and run.stop_reason == "budget_exhausted"
    assert run.status == "running"  # the worker stops at its next checkpoint
    stop = RunEvent.objects.get(run=run, kind="stop_requested")
    assert stop.data["limit"] == limit and stop.data["reason"] == "budget_exhausted"
    kinds = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert kinds[-2:] == ["budget_changed", "stop_requested"]  # the change first, then the stop it caused


def test_raising_above_what_was_spent_asks_no_stop():
    run = claim_new_run(token_budget=1000)
    spend(run, tokens=60)
    assert set_budgets(run.id, by="alice", source="dashboard", token_budget=61)
    assert Run.objects.get(pk=run.id).cancel_requested_at is None


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_change_is_announced_to_the_runs_viewers_after_commit():
    run = await database_sync_to_async(claim_new_run)(token_budget=10)
    layer, viewer = await listen(groups.viewers(run.id))
    assert await database_sync_to_async(set_budgets)(run.id, by="a", source="api", token_budget=20)
    changed = await asyncio.wait_for(layer.receive(viewer), 2)
    assert (changed["type"], changed["event"], changed["run_id"]) == ("run.changed", "budget_changed", str(run.id))


@pytest.mark.django_db(transaction=True)
def test_two_edits_racing_chain_their_old_and_new_values(postgres):
    run = claim_new_run(token_budget=100)
    barrier, outcomes = threading.Barrier(2), []

    def edit(value):
        try:
            barrier.wait()
            outcomes.append(set_budgets(run.id, by=f"op{value}", source="api", token_budget=value))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=edit, args=(value,)) for value in (200, 300)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == [BudgetOutcome.CHANGED, BudgetOutcome.CHANGED]
    first, second = (event.data["changes"]["token_budget"] for event in budget_events(run))
    assert first[0] == 100 and second[0] == first[1]  # the second saw the first's value, not the stale 100
    assert Run.objects.get(pk=run.id).token_budget == second[1]
    assert connection.vendor == "postgresql"


def test_clean_is_what_the_form_and_the_api_share():
    assert budget_edits.clean(token_budget=5, cost_budget="0.5") == {"token_budget": 5, "cost_budget": Decimal("0.5")}
    assert budget_edits.clean() == {}
