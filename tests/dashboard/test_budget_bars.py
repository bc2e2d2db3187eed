"""The run page's budget bars (live, accessible), its budgets form, the reason a
capped agent's queued run shows, and budget changes on the audit page."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from dashboard import budgetview
from runs import transitions
from runs.models import AgentPolicy, Run, RunEvent
from tests.conftest import claim_new_run
from tests.dashboard.test_consumers import TIMEOUT, connected, frame_with
from tests.runs.test_agent_caps import spent_run

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def no_memo(settings):
    settings.RUNWARDEN_AGENT_CAPS_MEMO_S = 0


def commit(run, index=0, *, tokens=0, cost="0", calls=0, worker="w1"):
    tool_calls = [{"id": f"c{index}-{n}", "name": "echo", "args": {}, "result": "ok"} for n in range(calls)]
    assert transitions.commit_step(run.id, worker=worker, index=index, kind="tool_calls" if calls else "message",
                                   text="x", tool_calls=tool_calls, tokens_in=tokens, cost=cost)


def bar(html, key):
    """The bar `key` of a rendered page: (state, aria-valuenow, aria-valuemax, visible text)."""
    found = re.search(rf'data-testid="budget-{key}" data-state="(\w+)".*?aria-valuemax="([\d.]+)" '
                      rf'aria-valuenow="([\d.]+)".*?<span class="budget-text">(.*?)</span>\s*</div>', html, re.S)
    assert found, f"no {key} bar"
    state, top, now, text = found.groups()
    return state, now, top, re.sub(r"<[^>]+>", "", text)


@pytest.mark.django_db
def test_each_set_limit_has_a_bar_with_spent_budget_and_percentage(op_client):
    run = claim_new_run(token_budget=1000, cost_budget=Decimal("2"), tool_call_budget=10,
                        deadline=timezone.now() + timedelta(hours=1))
    commit(run, tokens=150, cost="0.5", calls=2)
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    assert bar(html, "tokens") == ("ok", "150", "1000", "150 / 1,000 tokens · 15 %")
    assert bar(html, "cost") == ("ok", "0.5", "2", "$0.50 / $2.00 · 25 %")
    assert bar(html, "tool_calls") == ("ok", "2", "10", "2 / 10 tool calls · 20 %")
    assert "left" in bar(html, "wall_clock")[3]
    assert html.count('role="progressbar"') == 4
    assert "{#" not in html  # no template comment leaks onto the page (a multi-line {# #} did)


@pytest.mark.django_db
def test_a_run_without_limits_has_no_bars(op_client):
    run = claim_new_run()
    assert 'data-testid="budget-bars"' not in op_client.get(f"/runs/{run.id}/").content.decode()


@pytest.mark.django_db
def test_bars_turn_amber_near_the_limit_and_red_at_it_in_words_too(op_client):
    run = claim_new_run(token_budget=100, tool_call_budget=2)
    commit(run, tokens=80, calls=2)
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    state, *_, text = bar(html, "tokens")
    assert state == "near" and "near the limit" in text
    state, *_, text = bar(html, "tool_calls")
    assert state == "over" and "limit reached" in text


def test_bar_states_at_the_boundaries():
    assert budgetview.Bar("tokens", "tokens", 79, 100, "").state == "ok"
    assert budgetview.Bar("tokens", "tokens", 80, 100, "").state == "near"
    assert budgetview.Bar("tokens", "tokens", 100, 100, "").state == "over"
    over = budgetview.Bar("tokens", "tokens", 250, 100, "")
    assert (over.state, over.pct, over.width) == ("over", 250, 100)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_bars_move_live_as_steps_commit(operator):
    run = await database_sync_to_async(claim_new_run)(token_budget=1000)
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await database_sync_to_async(commit)(run, tokens=450)
    text = await frame_with(ws, "450 / 1,000 tokens", timeout=TIMEOUT)
    assert 'aria-valuenow="450"' in text and "45 %" in text
    await database_sync_to_async(commit)(run, 1, tokens=400)
    text = await frame_with(ws, "850 / 1,000 tokens", timeout=TIMEOUT)
    assert 'data-state="near"' in text
    await ws.disconnect()


@pytest.mark.django_db
def test_the_form_raises_a_budget_audited_and_answers_in_the_outcome_stack(op_client):
    run = claim_new_run(token_budget=100)
    shown = budgetview.form_values(Run.objects.get(pk=run.id))
    post = {**shown, **{f"shown_{k}": v for k, v in shown.items()}, "token_budget": "5000"}
    response = op_client.post(f"/runs/{run.id}/budgets", post, **HX)
    html = response.content.decode()
    assert response.status_code == 200 and "Budgets changed: tokens 5000." in html
    assert 'data-testid="outcome"' in html and 'id="budgets-form"' in html and "hx-swap-oob" in html
    event = RunEvent.objects.get(run=run, kind="budget_changed")
    assert (event.actor, event.source, event.data["changes"]) == ("operator", "dashboard", {"token_budget": [100, 5000]})
    assert Run.objects.get(pk=run.id).token_budget == 5000


@pytest.mark.django_db
def test_the_form_sends_only_the_fields_changed_so_another_edit_stands(op_client):
    run = claim_new_run(token_budget=100, cost_budget=Decimal("1"))
    shown = budgetview.form_values(Run.objects.get(pk=run.id))
    transitions_edit = {"token_budget": 700}
    from runs import budget_edits
    assert budget_edits.set_budgets(run.id, by="bob", source="api", **transitions_edit)
    post = {**shown, **{f"shown_{k}": v for k, v in shown.items()}, "cost_budget": "3"}
    assert op_client.post(f"/runs/{run.id}/budgets", post, **HX).status_code == 200
    run = Run.objects.get(pk=run.id)
    assert (run.token_budget, run.cost_budget) == (700, Decimal("3"))


@pytest.mark.django_db
def test_an_emptied_field_clears_the_limit(op_client):
    run = claim_new_run(token_budget=100)
    post = {"token_budget": "", "shown_token_budget": "100"}
    assert op_client.post(f"/runs/{run.id}/budgets", post, **HX).status_code == 200
    assert Run.objects.get(pk=run.id).token_budget is None


@pytest.mark.django_db
def test_bad_form_input_is_a_400_warning_and_writes_nothing(op_client):
    run = claim_new_run(token_budget=100)
    for post in ({"token_budget": "lots", "shown_token_budget": "100"},
                 {"token_budget": "0", "shown_token_budget": "100"},
                 {"cost_budget": "-1", "shown_cost_budget": ""},
                 {"deadline": "tomorrow", "shown_deadline": ""},
                 {"deadline": "2001-01-01T00:00Z", "shown_deadline": ""}):
        response = op_client.post(f"/runs/{run.id}/budgets", post, **HX)
        assert response.status_code == 400, post
        assert 'class="msg warning"' in response.content.decode()
    assert not RunEvent.objects.filter(run=run, kind="budget_changed").exists()
    assert Run.objects.get(pk=run.id).token_budget == 100


@pytest.mark.django_db
def test_the_form_needs_the_cancel_permission_and_an_unended_run(watcher_client, op_client):
    run = claim_new_run(token_budget=100)
    post = {"token_budget": "5", "shown_token_budget": "100"}
    assert watcher_client.post(f"/runs/{run.id}/budgets", post, **HX).status_code == 403
    assert 'data-testid="budgets-form"' not in watcher_client.get(f"/runs/{run.id}/").content.decode()
    assert transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    response = op_client.post(f"/runs/{run.id}/budgets", post, **HX)
    assert response.status_code == 409 and "the run has ended" in response.content.decode()
    missing = op_client.post("/runs/00000000-0000-0000-0000-000000000000/budgets", post, **HX)
    assert missing.status_code == 404


@pytest.mark.django_db
def test_a_capped_agents_queued_run_shows_why_on_its_page_and_in_the_list(op_client):
    AgentPolicy.objects.create(agent="alpha", cost_cap_24h=Decimal("5"))
    spent_run("alpha", cost="5")
    queued = transitions.create_run(agent="alpha", title="held back")
    reason = "queued: agent cost cap $5.00/24 h reached"
    assert reason in op_client.get(f"/runs/{queued.id}/").content.decode()
    listing = op_client.get("/").content.decode()
    row = listing[listing.index(f'id="run-{queued.id}"'):]
    assert reason in row[:row.index("</div>")]
    free = transitions.create_run(agent="beta")
    assert "queued: agent" not in op_client.get(f"/runs/{free.id}/").content.decode()


@pytest.mark.django_db
def test_the_audit_page_lists_budget_changes(op_client):
    run = claim_new_run(token_budget=100, title="audited")
    from runs import budget_edits
    assert budget_edits.set_budgets(run.id, by="operator", source="dashboard", token_budget=300)
    html = op_client.get("/audit/").content.decode()
    assert "change budgets" in html and "token_budget 100 → 300" in html


@pytest.mark.django_db
def test_a_pending_budget_stop_says_which_limit_instead_of_aborting(op_client):
    run = claim_new_run(token_budget=100)
    commit(run, tokens=100)  # reaches the budget: the server asks the run to stop
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    marker = re.search(r'data-testid="cancelling">([^<]*)<', html).group(1)
    assert marker == "Stopping: budget exhausted (tokens)…"
    assert bar(html, "tokens")[0] == "over"
    listing = op_client.get("/").content.decode()
    assert "Stopping: budget exhausted…" in listing and "Aborting…" not in listing
