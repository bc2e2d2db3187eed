"""The run page's timeline: what each entry says in words."""

import pytest

pytestmark = pytest.mark.django_db


def test_timeline_shows_a_discarded_step_with_its_interrupted_text(op_client, running_run):
    from runs import events

    run = running_run()
    events.append(run.id, "step_discarded", actor="w1", index=2, text="half a <b>thought",
                  interrupted=True, reason="cancelled", tool_calls=["search"])
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    item = html[html.index('class="event k-step_discarded"'):]
    item = item[: item.index("</li>")]
    assert "step 3" in item and "(cancelled)" in item and "<code>search</code>" in item
    assert "interrupted text (discarded)" in item and "half a &lt;b&gt;thought" in item


def test_timeline_shows_what_a_discarded_step_cost(op_client, running_run):
    from runs import events

    run = running_run()
    events.append(run.id, "step_discarded", actor="w1", index=0, text="half", interrupted=True,
                  reason="cancelled", tool_calls=[], tokens_in=12, tokens_out=53, cost="0.000130", estimated=True)
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    item = html[html.index('class="event k-step_discarded"'):]
    item = item[: item.index("</li>")]
    assert "spent though discarded: 12 / 53 tokens in/out, $0.000130 (estimated" in item
    assert "details" not in item  # every key is shown in words, none left raw


def timeline_item(op_client, run, kind):
    html = op_client.get(f"/runs/{run.id}/").content.decode()
    item = html[html.index(f'class="event k-{kind}"'):]
    return item[: item.index("</li>")]


def test_timeline_says_a_flag_and_its_evidence_in_words(op_client, running_run):
    from runs import events

    run = running_run()
    events.append(run.id, "flagged", actor="runwarden", source="guardrail", flag="repeated_tool", policy="stop",
                  evidence={"tool": "search", "args": {"q": "<x>"}, "times": 3, "steps": [3, 4, 5]})
    item = timeline_item(op_client, run, "flagged")
    assert "flagged" in item and "by <b>runwarden</b>" in item
    assert "repeated tool: called search(q=&#x27;&lt;x&gt;&#x27;) 3 times in a row (steps 4–6)" in item
    assert "the agent&#x27;s policy is stop" in item
    assert "<summary>details</summary>" in item  # the raw evidence, for the curious


def test_timeline_says_why_a_stop_was_asked(op_client, running_run):
    from runs import events

    run = running_run()
    events.append(run.id, "stop_requested", actor="guardrail", source="guardrail", reason="policy_denied",
                  limit="loop", note="repeated_tool: called echo() 3 times in a row (step 1)")
    item = timeline_item(op_client, run, "stop_requested")
    assert "asked to stop: policy denied (the agent&#x27;s loop policy)" in item
    assert "<q>repeated_tool: called echo() 3 times in a row (step 1)</q>" in item
    assert "→" not in item  # not read as a settle


def test_timeline_says_what_a_budget_change_changed(op_client, running_run):
    from runs import events

    run = running_run()
    events.append(run.id, "budget_changed", actor="operator", source="dashboard",
                  changes={"token_budget": [1000, 5000], "cost_budget": [None, "2.50"], "bad": "shape"})
    item = timeline_item(op_client, run, "budget_changed")
    assert "cost budget none → 2.50; token budget 1000 → 5000" in item  # by name: jsonb keeps no order
