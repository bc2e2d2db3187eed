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
