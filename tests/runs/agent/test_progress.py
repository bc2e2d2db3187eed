"""Deltas to viewers: coalesced at the source, contiguous by offset, bounded when the
layer lags, a visible gap when a batch is lost, and a resync on request."""

import asyncio
import time

import pytest
from channels.layers import get_channel_layer

from runs import groups
from runs.agent.cancel import CancelSignal
from runs.agent.deltas import DeltaPublisher
from runs.agent.progress import Progress
from runs.agent.runner import execute
from runs.models import Step
from tests.runs.agent.conftest import say

pytestmark = pytest.mark.asyncio


class Captured:
    """A sink that records each batch; `stall()` makes the next publishes wait."""

    def __init__(self):
        self.batches = []
        self.released = asyncio.Event()
        self.released.set()
        self.entered = asyncio.Event()
        self.fail_next = 0

    def stall(self):
        self.released.clear()
        self.entered.clear()

    async def publish(self, batch):
        self.entered.set()
        await self.released.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("lost")
        self.batches.append((time.monotonic(), list(batch)))

    @property
    def messages(self):
        return [m for _, batch in self.batches for _, m, _ in batch]

    async def reset(self):
        pass

    async def close(self):
        pass


def contiguous(messages, step):
    offset = 0
    for message in messages:
        assert (message["type"], message["step"], message["offset"]) == ("run.progress", step, offset)
        offset += len(message["text"])
    return "".join(m["text"] for m in messages)


async def drained(publisher):
    while publisher._flusher is not None and not publisher._flusher.done():
        await asyncio.sleep(0.005)


async def test_deltas_are_coalesced_to_ten_a_second_and_contiguous():
    sink = Captured()
    progress = Progress("r1", DeltaPublisher(None, hz=10, sink=sink))
    progress.start(3)
    text = ""
    started = time.monotonic()
    for i in range(100):  # a fast stream: 100 chunks in about 0.5 s
        chunk = f"w{i} "
        text += chunk
        progress.append(chunk)
        await asyncio.sleep(0.005)
    progress.flush()
    await drained(progress.publisher)
    elapsed = time.monotonic() - started
    assert len(sink.messages) <= elapsed * 10 + 2  # at most ~10 per second
    assert len(sink.messages) >= 3  # but it does stream, not one lump at the end
    assert {g for _, batch in sink.batches for g, _, _ in batch} == {groups.viewers("r1")}
    assert contiguous(sink.messages, 3) == text
    await progress.close()


async def test_many_runs_share_one_batch_each_holding_one_message_per_run():
    sink = Captured()
    publisher = DeltaPublisher(None, hz=20, sink=sink)
    runs = [Progress(f"r{i}", publisher) for i in range(50)]
    texts = {p.run_id: "" for p in runs}
    for p in runs:
        p.start(0)
    started = time.monotonic()
    for i in range(20):
        for p in runs:
            p.append(f"t{i} ")
            texts[p.run_id] += f"t{i} "
        await asyncio.sleep(0.01)
    for p in runs:
        p.flush()
    await drained(publisher)
    elapsed = time.monotonic() - started
    # 50 runs × 20 tokens = 1,000 deltas, sent as a handful of batches (at most 20 a
    # second), not 1,000 sends.
    assert len(sink.batches) <= elapsed * 20 + 3 and len(sink.batches) < 1000
    for _, batch in sink.batches:
        names = [g for g, _, _ in batch]
        assert len(names) == len(set(names))  # never two messages of one run in a batch
    for p in runs:
        mine = [m for m in sink.messages if m["run_id"] == p.run_id]
        assert contiguous(mine, 0) == texts[p.run_id]
        await p.close()


async def test_a_lagging_layer_merges_pending_text_instead_of_queueing_messages():
    sink = Captured()
    publisher = DeltaPublisher(None, hz=100, sink=sink)
    progress = Progress("r1", publisher)
    progress.start(0)
    progress.append("first ")
    await asyncio.wait_for(sink.entered.wait(), 5)  # the first batch went out at once
    await drained(publisher)
    sink.stall()
    progress.append("a ")
    await asyncio.wait_for(sink.entered.wait(), 5)  # that batch is stuck in the layer
    text = "first a "
    for i in range(500):  # meanwhile the run streams on
        progress.append(f"w{i} ")
        text += f"w{i} "
    await asyncio.sleep(0.05)  # five intervals of the flusher: none may start another batch
    assert len(sink.batches) == 1 and publisher.batches == 1
    sink.released.set()
    await drained(publisher)
    # The stuck batch, then ONE message holding all 500 deltas: nothing piled up.
    assert [len(batch) for _, batch in sink.batches] == [1, 1, 1]
    assert contiguous(sink.messages, 0) == text
    await progress.close()


async def test_a_lost_batch_leaves_a_gap_the_viewer_sees():
    sink = Captured()
    publisher = DeltaPublisher(None, hz=100, sink=sink)
    progress = Progress("r1", publisher)
    progress.start(0)
    sink.fail_next = 1
    progress.append("lost ")
    await drained(publisher)
    progress.append("next")
    await drained(publisher)
    (message,) = sink.messages
    # Not silently lost: the message after the gap starts past what any viewer holds,
    # which is what makes the dashboard ask for a resync.
    assert (message["offset"], message["text"]) == (len("lost "), "next")
    assert progress.snapshot()["text"] == "lost next"
    await progress.close()


async def test_tool_states_ride_on_the_deltas():
    sink = Captured()
    progress = Progress("r1", DeltaPublisher(None, hz=1000, sink=sink))
    progress.start(0)
    progress.tool("c1", "sleep", "started")
    await drained(progress.publisher)
    progress.tool("c1", "sleep", "finished")
    progress.flush()
    await drained(progress.publisher)
    tools = [m["tools"] for m in sink.messages if "tools" in m]
    assert tools[0] == [{"id": "c1", "name": "sleep", "state": "started"}]
    assert tools[-1] == [{"id": "c1", "name": "sleep", "state": "finished"}]
    with pytest.raises(ValueError, match="unknown tool state 'running'"):
        progress.tool("c1", "sleep", "running")  # the engine's old word: not on the wire any more
    await progress.close()


@pytest.mark.django_db(transaction=True)
async def test_the_engine_reports_tool_states_in_the_agent_apis_words(ctx, claimed, monkeypatch):
    from runs import messages

    reported, tool = [], Progress.tool
    monkeypatch.setattr(Progress, "tool", lambda self, *a: reported.append(a[1:]) or tool(self, *a))
    layer = get_channel_layer()
    run = await claimed(script=[{"tools": [{"name": "echo", "args": {"x": 1}}, {"name": "no-such-tool", "args": {}}]},
                                say(2)])
    viewer = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), viewer)
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 10)
    assert reported == [("echo", "started"), ("echo", "finished"), ("no-such-tool", "started"),
                        ("no-such-tool", "failed")]
    # What reached the viewers before the step committed speaks the same words.
    message = {}
    while "tools" not in message:  # the group carries run.changed and the next step's text too
        message = await asyncio.wait_for(layer.receive(viewer), 5)
    assert {t["state"] for t in message["tools"]} <= set(messages.TOOL_STATES)


async def test_a_step_sealed_before_its_commit_still_goes_out_after_the_next_step_began():
    sink = Captured()
    publisher = DeltaPublisher(None, hz=100, sink=sink)
    progress = Progress("r1", publisher)
    sink.stall()
    progress.start(0)
    progress.append("zero")
    await asyncio.wait_for(sink.entered.wait(), 5)
    progress.append(" tail")
    progress.flush()  # before step 0's commit
    progress.committed(0)
    progress.start(1)
    progress.append("one")
    sink.released.set()
    await drained(publisher)
    steps = [(m["step"], m["offset"], m["text"]) for m in sink.messages]
    assert steps == [(0, 0, "zero"), (0, 4, " tail"), (1, 0, "one")]
    await progress.close()


async def test_between_steps_a_resync_holds_no_committed_text():
    progress = Progress("r1", DeltaPublisher(None, hz=1000, sink=Captured()), step=2)
    assert (progress.snapshot()["step"], progress.snapshot()["text"]) == (2, "")
    progress.start(2)
    progress.append("hello")
    progress.flush()
    progress.committed(2)  # in the database now: a resync must not hand it out again
    assert (progress.snapshot()["step"], progress.snapshot()["text"], progress.snapshot()["offset"]) == (3, "", 0)
    await progress.close()


@pytest.mark.django_db(transaction=True)
async def test_a_resync_request_gets_the_whole_in_flight_text(ctx, claimed):
    layer = get_channel_layer()
    run = await claimed(script=[{"say": " ".join(f"w{i}" for i in range(400)), "token_delay_ms": 2}])
    viewer = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), viewer)
    signal = CancelSignal()
    task = asyncio.ensure_future(execute(run, signal=signal, ctx=ctx))
    seen = ""
    for _ in range(3):  # streaming has begun: a viewer holds some text
        message = await asyncio.wait_for(layer.receive(viewer), 5)
        assert message["offset"] == len(seen)
        seen += message["text"]
    reply_to = await layer.new_channel()
    await layer.group_send(groups.control(run.id), {"type": "run.resync", "reply_channel": reply_to})
    snapshot = await asyncio.wait_for(layer.receive(reply_to), 5)
    signal.cancel()
    await task
    assert (snapshot["type"], snapshot["offset"], snapshot["resync"], snapshot["step"]) == ("run.progress", 0, True, 0)
    assert snapshot["text"].startswith(seen) and seen.startswith("w0 w1")


@pytest.mark.django_db(transaction=True)
async def test_a_viewer_gets_the_committed_text_in_few_contiguous_messages(ctx, claimed, pool):
    # Through the real layer (in-memory, or Redis on the PostgreSQL + Redis pass).
    layer = get_channel_layer()
    tokens = 300
    run = await claimed(script=[{"say": " ".join(f"w{i}" for i in range(tokens)), "token_delay_ms": 1}])
    viewer = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), viewer)
    started = time.monotonic()
    await asyncio.wait_for(execute(run, signal=CancelSignal(), ctx=ctx), 20)
    elapsed = time.monotonic() - started
    (committed,) = await pool.call(lambda: list(Step.objects.filter(run_id=run.id)))
    messages = []
    while sum(len(m["text"]) for m in messages) < len(committed.text):
        message = await asyncio.wait_for(layer.receive(viewer), 5)
        if message["type"] == "run.progress":  # the group carries run.changed too
            messages.append(message)
    assert contiguous(messages, 0) == committed.text
    # 300 deltas coalesced: at most `progress_hz` a second (plus the first and the seal).
    assert len(messages) <= elapsed * ctx.config.progress_hz + 3 < tokens
