"""`manage.py budgets …`: per-agent 24 h caps from the command line; and the admin."""

import os
import subprocess
import sys
from decimal import Decimal
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from runs import transitions
from runs.models import AgentPolicy, Run
from tests.runs.test_agent_caps import spent_run
from tests.runs.test_cli import _database_url

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_memo(settings):
    settings.RUNWARDEN_AGENT_CAPS_MEMO_S = 0


def budgets(*args):
    out = StringIO()
    call_command("budgets", *args, stdout=out)
    return out.getvalue()


def failure(*args):
    with pytest.raises(CommandError) as caught:
        budgets(*args)
    return caught.value.returncode, str(caught.value)


def test_set_creates_the_policy_and_list_shows_spend_against_caps():
    assert "alpha: tokens cap 1,000, cost cap $2.50 per 24 h" in budgets("set", "alpha", "--tokens", "1000",
                                                                         "--cost", "2.5")
    policy = AgentPolicy.objects.get(agent="alpha")
    assert (policy.token_cap_24h, policy.cost_cap_24h, policy.updated_by != "") == (1000, Decimal("2.5"), True)
    spent_run("alpha", tokens_in=300, tokens_out=20, cost="0.5")
    line = next(line for line in budgets("list").splitlines() if line.startswith("alpha"))
    assert "320 / 1,000" in line and "$0.50 / $2.50" in line and line.endswith("ok")


def test_list_says_which_agent_is_capped_and_why():
    budgets("set", "alpha", "--cost", "1")
    spent_run("alpha", cost="1")
    line = next(line for line in budgets("list").splitlines() if line.startswith("alpha"))
    assert line.endswith("agent cost cap $1.00/24 h reached")


def test_set_clears_one_cap_and_clear_drops_both_keeping_the_loop_policy():
    budgets("set", "alpha", "--tokens", "10", "--cost", "1")
    AgentPolicy.objects.filter(agent="alpha").update(loop_policy="stop")
    budgets("set", "alpha", "--clear-tokens")
    assert AgentPolicy.objects.get(agent="alpha").token_cap_24h is None
    assert "alpha: caps cleared" in budgets("clear", "alpha")
    policy = AgentPolicy.objects.get(agent="alpha")
    assert (policy.token_cap_24h, policy.cost_cap_24h, policy.loop_policy) == (None, None, "stop")
    assert "nothing to clear" in budgets("clear", "nobody")


@pytest.mark.parametrize("args, says", [
    (("set", "alpha"), "nothing to set"),
    (("set", "alpha", "--tokens", "0"), "--tokens must be a whole number"),
    (("set", "alpha", "--tokens", "ten"), "--tokens must be a whole number"),
    (("set", "alpha", "--cost", "-1"), "--cost must be more than 0"),
    (("set", "alpha", "--cost", "abc"), "--cost must be a number"),
    (("set", "alpha", "--cost", "0.0000001"), "at most 6 decimal places"),
    (("set", "alpha", "--tokens", "5", "--clear-tokens"), "contradict"),
    (("set", " ", "--tokens", "5"), "AGENT must be a non-empty name"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, says):
    code, message = failure(*args)
    assert code == 2 and says in message and "\n" not in message
    assert not AgentPolicy.objects.exists()


def test_setting_a_cap_already_reached_keeps_new_runs_queued():
    spent_run("alpha", tokens_in=50)
    budgets("set", "alpha", "--tokens", "50")
    queued = transitions.create_run(agent="alpha")
    assert transitions.claim_next(worker="w9") is None
    assert Run.objects.get(pk=queued.pk).status == "queued"


@pytest.mark.django_db(transaction=True)
def test_a_real_process_exits_2_on_bad_input():
    env = {**os.environ, "DATABASE_URL": _database_url(), "SECRET_KEY": "x"}
    manage = [sys.executable, str(settings.BASE_DIR / "manage.py"), "budgets", "set", "alpha", "--tokens", "-5"]
    done = subprocess.run(manage, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "--tokens must be a whole number" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_admin_lists_policies_with_caps_and_loop_policy(admin_client):
    AgentPolicy.objects.create(agent="alpha", token_cap_24h=1000, cost_cap_24h=Decimal("3"), loop_policy="stop")
    html = admin_client.get("/admin/runs/agentpolicy/").content.decode()
    assert "alpha" in html and "1000" in html and "stop" in html
    assert "Token cap 24h" in html or "token cap 24h" in html.lower()


def runs(*args):
    out = StringIO()
    call_command("runs", *args, stdout=out)
    return out.getvalue()


def test_runs_budget_raises_and_clears_a_runs_limits_audited_via_cli(running_run):
    run = running_run(token_budget=100, cost_budget=Decimal("1"))
    assert "Budgets changed." in runs("budget", str(run.id), "--tokens", "500", "--cost", "none",
                                      "--tool-calls", "20", "--deadline", "2h")
    run = Run.objects.get(pk=run.id)
    assert (run.token_budget, run.cost_budget, run.tool_call_budget) == (500, None, 20)
    event = run.events.get(kind="budget_changed")
    assert event.source == "cli" and event.data["changes"]["token_budget"] == [100, 500]
    assert "500 tokens" in runs("show", str(run.id))
    assert "Nothing to change" in runs("budget", str(run.id), "--tokens", "500")


@pytest.mark.parametrize("args, code, says", [
    (("--tokens", "lots"), 2, "--tokens must be a whole number"),
    (("--tokens", "0"), 2, "token_budget must be a whole number"),
    (("--cost", "-3"), 2, "cost_budget must be more than 0"),
    (("--deadline", "yesterday"), 2, "deadline must be an ISO 8601 time"),
    ((), 2, "nothing to change"),
])
def test_runs_budget_bad_input_exits_2_and_writes_nothing(running_run, args, code, says):
    run = running_run(token_budget=100)
    with pytest.raises(CommandError) as caught:
        runs("budget", str(run.id), *args)
    assert caught.value.returncode == code and says in str(caught.value)
    assert not run.events.filter(kind="budget_changed").exists()


def test_runs_budget_of_an_ended_run_exits_1_and_of_no_run_2(running_run):
    run = running_run()
    assert transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    with pytest.raises(CommandError) as ended:
        runs("budget", str(run.id), "--tokens", "5")
    with pytest.raises(CommandError) as missing:
        runs("budget", "not-a-run", "--tokens", "5")
    assert (ended.value.returncode, missing.value.returncode) == (1, 2)
    assert "completed / completed" in str(ended.value)
