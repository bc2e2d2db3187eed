"""Per-agent rolling 24 h caps: the spend, the capped set, claims that skip a capped
agent's queued runs, the reason an operator reads, and Retry-After."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from runs import agent_caps, transitions
from runs.models import AgentPolicy, Run
from tests.conftest import claim_new_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_memo(settings):
    """Each claim reads the caps from the database; the memo has its own test."""
    settings.RUNWARDEN_AGENT_CAPS_MEMO_S = 0


def spent_run(agent, *, tokens_in=0, tokens_out=0, cost="0", worker="w-spend", settle=True):
    """A run of `agent` that committed one step with this spend (ended completed unless
    `settle=False`, then left running)."""
    run = claim_new_run(worker=worker, agent=agent)
    assert transitions.commit_step(run.id, worker=worker, index=0, kind="message", text="x",
                                   tokens_in=tokens_in, tokens_out=tokens_out, cost=cost)
    if settle:
        assert transitions.settle(run.id, status="completed", reason="completed", worker=worker)
    return Run.objects.get(pk=run.id)


def age(run, hours):
    """Move the run's creation `hours` into the past (test set-up, not a status write)."""
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(hours=hours))


def test_spend_sums_tokens_and_cost_of_runs_created_in_the_last_24_hours():
    spent_run("alpha", tokens_in=100, tokens_out=50, cost="0.25")
    spent_run("alpha", tokens_in=10, tokens_out=5, cost="0.05")
    old = spent_run("alpha", tokens_in=1000, tokens_out=1000, cost="9")
    age(old, 25)
    spent_run("beta", tokens_in=7, cost="1")
    spend = agent_caps.spend_24h(["alpha", "beta", "gamma"])
    assert spend["alpha"] == agent_caps.Spend(165, Decimal("0.30"))
    assert spend["beta"] == agent_caps.Spend(7, Decimal("1"))
    assert "gamma" not in spend


def test_an_agent_is_capped_once_its_spend_reaches_a_cap():
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=200)
    AgentPolicy.objects.create(agent="beta", cost_cap_24h=Decimal("5"))
    AgentPolicy.objects.create(agent="gamma")  # a policy without caps is never capped
    spent_run("alpha", tokens_in=150, tokens_out=49)
    spent_run("beta", cost="4.99")
    spent_run("gamma", tokens_in=10**6, cost="1000")
    assert agent_caps.compute_capped() == {}
    spent_run("alpha", tokens_out=1)
    spent_run("beta", cost="0.01")
    capped = agent_caps.compute_capped()
    assert set(capped) == {"alpha", "beta"}
    assert capped["alpha"].limit == "agent_tokens_24h"
    assert str(capped["alpha"]) == "agent token cap 200/24 h reached"
    assert capped["beta"].limit == "agent_cost_24h"
    assert str(capped["beta"]) == "agent cost cap $5.00/24 h reached"


def test_claim_next_skips_a_capped_agents_queued_run_and_claims_another_agents():
    AgentPolicy.objects.create(agent="alpha", cost_cap_24h=Decimal("1"))
    spent_run("alpha", cost="1")
    held = transitions.create_run(agent="alpha", title="held back")
    other = transitions.create_run(agent="beta", title="free")
    claimed = transitions.claim_next(worker="w2")
    assert claimed is not None and claimed.pk == other.pk
    assert transitions.claim_next(worker="w2") is None
    assert transitions.claim_next(worker="w2", agents=["alpha"]) is None
    assert Run.objects.get(pk=held.pk).status == Run.Status.QUEUED


def test_claim_of_a_capped_agents_run_by_id_says_so_and_leaves_it_queued():
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=10)
    spent_run("alpha", tokens_in=10)
    run = transitions.create_run(agent="alpha")
    assert transitions.claim(run.pk, worker="w2") == transitions.ClaimOutcome.AGENT_CAPPED
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED


def test_raising_the_cap_lets_the_queued_run_be_claimed():
    policy = AgentPolicy.objects.create(agent="alpha", token_cap_24h=10)
    spent_run("alpha", tokens_in=10)
    run = transitions.create_run(agent="alpha")
    assert transitions.claim_next(worker="w2") is None
    policy.token_cap_24h = 11
    policy.save()  # forgets this process's memo
    assert transitions.claim_next(worker="w2").pk == run.pk


def test_spend_leaving_the_window_lifts_the_cap():
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=10)
    age(spent_run("alpha", tokens_in=10), 25)
    run = transitions.create_run(agent="alpha")
    assert transitions.claim_next(worker="w2").pk == run.pk


def test_the_memo_answers_without_the_database_until_forgotten(django_assert_num_queries, settings):
    settings.RUNWARDEN_AGENT_CAPS_MEMO_S = 3600
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=10)
    spent_run("alpha", tokens_in=10)
    agent_caps.forget()
    with django_assert_num_queries(2):  # the policies, then one aggregate of their spend
        assert set(agent_caps.capped_agents()) == {"alpha"}
    with django_assert_num_queries(0):
        assert set(agent_caps.capped_agents()) == {"alpha"}


def test_no_capped_agent_costs_claim_next_one_cheap_query(django_assert_num_queries):
    AgentPolicy.objects.create(agent="alpha")  # no caps: no spend to add up
    agent_caps.forget()
    with django_assert_num_queries(1):
        assert agent_caps.capped_agents() == {}


def test_held_back_gives_the_reason_for_a_queued_run_only():
    AgentPolicy.objects.create(agent="alpha", cost_cap_24h=Decimal("2.5"))
    live = spent_run("alpha", cost="3", settle=False)
    queued = transitions.create_run(agent="alpha")
    assert agent_caps.held_back(queued) == "queued: agent cost cap $2.50/24 h reached"
    assert agent_caps.held_back(live) == ""
    assert agent_caps.held_back(transitions.create_run(agent="beta")) == ""


def test_retry_after_is_when_the_oldest_runs_leave_the_window():
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=100)
    first = spent_run("alpha", tokens_in=60)
    age(first, 20)  # leaves the window in 4 h
    second = spent_run("alpha", tokens_in=60)
    age(second, 2)  # leaves it in 22 h
    after = agent_caps.retry_after("alpha")
    assert 4 * 3600 - 60 <= after <= 4 * 3600 + 60  # once the first has gone, 60 < 100
    assert agent_caps.retry_after("beta") is None  # no policy
    AgentPolicy.objects.filter(agent="alpha").update(token_cap_24h=1000)
    assert agent_caps.retry_after("alpha") is None  # not capped


def test_report_lists_every_policy_with_its_spend():
    AgentPolicy.objects.create(agent="beta", cost_cap_24h=Decimal("1"))
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=5)
    spent_run("alpha", tokens_in=3)
    rows = agent_caps.report()
    assert [(p.agent, s.tokens, c) for p, s, c in rows] == [("alpha", 3, None), ("beta", 0, None)]


def test_the_watchdog_asks_live_runs_of_a_capped_agent_to_stop_once():
    from runs import watchdog

    AgentPolicy.objects.create(agent="alpha", cost_cap_24h=Decimal("1"))
    live = claim_new_run(worker="w2", agent="alpha")  # spent nothing itself: no commit of its own stops it
    spent_run("alpha", cost="1")  # another run of the agent reaches the cap, and ends
    other = claim_new_run(worker="w3", agent="beta")
    queued = transitions.create_run(agent="alpha")
    report = watchdog.sweep()
    assert report.agent_capped == [live.pk] and report.acted
    live = Run.objects.get(pk=live.pk)
    assert (live.status, live.stop_reason, live.cancel_source) == ("running", "budget_exhausted", "guardrail")
    stop = live.events.get(kind="stop_requested")
    assert stop.data["limit"] == "agent_cost_24h" and stop.data["reason"] == "budget_exhausted"
    assert stop.data["note"] == "agent cost cap $1.00/24 h reached" and stop.data["agent"] == "alpha"
    assert Run.objects.get(pk=other.pk).cancel_requested_at is None
    assert Run.objects.get(pk=queued.pk).status == "queued"  # held back, not ended
    assert watchdog.sweep().agent_capped == []  # asked once


def test_a_commit_that_reaches_the_agent_cap_asks_its_run_to_stop():
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=100)
    run = claim_new_run(worker="w1", agent="alpha")
    assert transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="x", tokens_in=99)
    assert Run.objects.get(pk=run.id).cancel_requested_at is None
    assert transitions.commit_step(run.id, worker="w1", index=1, kind="message", text="y", tokens_out=1)
    run = Run.objects.get(pk=run.id)
    assert run.stop_reason == "budget_exhausted"
    assert run.events.get(kind="stop_requested").data["limit"] == "agent_tokens_24h"
