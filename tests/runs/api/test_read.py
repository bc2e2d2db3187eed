"""The read API: runs in keyset pages with filters, a run's steps and its timeline;
operator keys read all, agent keys their own."""

import pytest

from runs import transitions
from tests.runs.api.conftest import error_code

pytestmark = pytest.mark.django_db


def ids(response):
    return [run["id"] for run in response.json()["runs"]]


def test_runs_come_newest_first_in_pages_that_never_repeat(operator, held_run):
    _, ops = operator
    made = [held_run(title=f"r{i}") for i in range(5)]
    first = ops.get("/runs?limit=2")
    seen, cursor = ids(first), first.json()["next_cursor"]
    held_run(title="new")  # created meanwhile: it must not shift the pages
    while cursor:
        page = ops.get(f"/runs?limit=2&cursor={cursor}")
        seen, cursor = seen + ids(page), page.json()["next_cursor"]
    assert seen == made[::-1]


def test_runs_filter_by_status_agent_and_since(operator, agent, held_run):
    _, ops = operator
    running = held_run()
    queued = transitions.create_run(agent="other").pk
    assert ids(ops.get("/runs?status=running")) == [running]
    assert set(ids(ops.get("/runs?status=running&status=queued"))) == {running, str(queued)}
    assert ids(ops.get("/runs?agent=other")) == [str(queued)]
    assert ids(ops.get("/runs?since=2999-01-01T00:00:00%2B00:00")) == []
    assert ops.get("/runs?status=bogus").status_code == 422
    assert error_code(ops.get("/runs?cursor=nonsense")) == "bad_cursor"


def test_an_agent_key_lists_only_its_runs(agent, other_agent, held_run, foreign_run):
    mine = held_run()
    _, other = other_agent
    other.post("/runs", {"agent": "ext"})
    _, client = agent
    assert ids(client.get("/runs")) == [mine]


def test_steps_and_events_of_a_run(agent, other_agent, held_run):
    _, client = agent
    run_id = held_run()
    for index in range(3):
        client.post(f"/runs/{run_id}/steps", {"index": index, "kind": "message", "text": f"s{index}"})
    page = client.get(f"/runs/{run_id}/steps?start=1&limit=1").json()
    assert ([s["text"] for s in page["steps"]], page["next_start"]) == (["s1"], 2)
    events = client.get(f"/runs/{run_id}/events?after=0").json()
    kinds = [e["kind"] for e in events["events"]]
    assert kinds[:2] == ["created", "claimed"] and kinds.count("step_committed") == 3
    after = client.get(f"/runs/{run_id}/events?after={events['next_after']}").json()
    assert (after["events"], after["next_after"]) == ([], None)
    _, other = other_agent
    assert error_code(other.get(f"/runs/{run_id}/steps")) == "not_your_run"
    assert error_code(other.get(f"/runs/{run_id}/events")) == "not_your_run"
