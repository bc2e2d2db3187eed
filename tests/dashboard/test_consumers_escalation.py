"""The run page follows an abort that is ignored, step by step, without a reload:
asked → not honoured (hard stop asked) → retired; Retire is offered as soon as it
applies, by event or by the clock; a discarded step shows its text and spend."""

import pytest
from channels.db import database_sync_to_async
from django.test import override_settings

from dashboard import consumers, runview
from runs import transitions
from tests.dashboard.test_consumers import connected, frame_with, request_cancel, running_run

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
RETIRE = 'data-testid="retire-button"'
retire = database_sync_to_async(transitions.retire)
escalate_cancel = database_sync_to_async(transitions.escalate_cancel)
record_discard = database_sync_to_async(transitions.record_discard)


@pytest.fixture(autouse=True)
def quiet_heartbeats(monkeypatch):
    monkeypatch.setattr(consumers, "HEARTBEAT_REFRESH_S", 60)
    runview._heartbeats["at"] = 0.0


async def test_each_escalation_step_shows_live_and_retire_is_offered_when_not_honoured(operator):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await request_cancel(run.id, by="op")
    text = await frame_with(ws, 'data-testid="escalation"')
    assert 'data-step="asked"' in text and "via dashboard" in text and "Aborting…" in text
    assert RETIRE not in text  # within the grace: the worker may still stop by itself

    assert await escalate_cancel(run.id)
    text = await frame_with(ws, 'data-step="not-honoured"')
    assert "a hard stop was asked" in text and "k-cancel_not_honoured" in text
    assert RETIRE in text  # offered at once, not after a reload

    assert await retire(run.id, by="op")
    text = await frame_with(ws, 'data-step="ended"')
    assert 'data-testid="run-status">cancelled<' in text and "k-retired" in text and RETIRE not in text
    await ws.disconnect()


@override_settings(RUNWARDEN_CANCEL_GRACE_S=0.5)
async def test_retire_is_offered_when_the_grace_runs_out_without_any_event(operator):
    run = await running_run()
    await request_cancel(run.id, by="op")
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    # No event follows the request: only the clock says the abort was not honoured.
    text = await frame_with(ws, RETIRE, timeout=5)
    assert 'data-step="not-honoured"' in text and "The abort has not been honoured" in text
    await ws.disconnect()


async def test_watchers_get_no_clock_driven_retire(watcher):
    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", watcher)
    assert await request_cancel(run.id, by="op")
    assert await escalate_cancel(run.id)
    text = await frame_with(ws, 'data-step="not-honoured"')
    assert RETIRE not in text
    await ws.disconnect()


# --- a discarded step --------------------------------------------------------------------------


async def discard(run):
    event = await record_discard(run.id, worker="w1", index=0, text="half a <b>thought</b>", tool_calls=["search"],
                                 tokens_in=120, tokens_out=30, cost="0.0042", reason="cancelled")
    assert event is not None


def assert_shows_the_discarded_step(html):
    block = html[html.index('data-testid="discarded-step"'):]
    block = block[: block.index("</li>")]
    assert "step 1" in block and "discarded" in block and "(cancelled)" in block
    assert "half a &lt;b&gt;thought&lt;/b&gt;" in block and "<code>search</code>" in block
    assert "120 / 30 tokens in/out, $0.0042" in block


async def test_a_discarded_step_shows_its_text_and_spend_live_and_after_a_reload(operator):
    from django.test import Client

    run = await running_run()
    ws = await connected(f"/ws/runs/{run.id}/", operator)
    await discard(run)
    text = await frame_with(ws, 'data-testid="discarded-step"')
    assert 'hx-swap-oob="beforeend:#steps"' in text
    assert_shows_the_discarded_step(text)
    await ws.disconnect()

    def reload():
        client = Client()
        client.force_login(operator)
        return client.get(f"/runs/{run.id}/").content.decode()

    page = await database_sync_to_async(reload)()
    steps = page[page.index('id="steps"'):]
    assert_shows_the_discarded_step(steps[: steps.index("</ol>")])
