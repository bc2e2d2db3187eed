"""End to end on PostgreSQL + Redis, with `manage.py run_agents` as a real subprocess.

Twenty runs, half of them cancelled at random moments: those end cancelled/cancelled
with no step committed after the request; the rest complete. Then the same with the
fast path unavailable (the worker's Redis is a closed port): the heartbeat carries
every cancel. Both need PostgreSQL and Redis; they skip on the embedded default.
"""

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from runs import groups, transitions
from runs.models import Run, RunEvent, Step

ROOT = Path(__file__).resolve().parents[3]
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def script():
    # At least ~2.8 s per run: every cancel (at most 1.2 s after all 20 run) finds it live.
    words = " ".join(f"w{i}" for i in range(50))
    return [
        {"say": words, "token_delay_ms": 15},
        {"tools": [{"name": "sleep", "args": {"seconds": 0.3}}, {"name": "echo", "args": {"n": 1}}], "parallel": True},
        {"say": words, "token_delay_ms": 15},
        {"tools": [{"name": "sleep", "args": {"seconds": 0.2}}, {"name": "echo", "args": {"n": 2}}]},
        {"say": words, "token_delay_ms": 15},
    ]


@pytest.fixture
def redis_url():
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    return settings.REDIS_URL


@pytest.fixture
def start_worker(postgres, tmp_path):
    """Start `run_agents` against this test database; stopped (SIGTERM) at teardown."""
    procs = []

    def start(redis, *, worker_id, concurrency=20, **env):
        db = connection.settings_dict
        url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        log = tmp_path / f"{worker_id}.log"
        err = log.open("w")
        environ = {
            **os.environ, "DATABASE_URL": url, "REDIS_URL": redis, "DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "e2e", "RUNWARDEN_HEARTBEAT_S": "0.2",
            "RUNWARDEN_CLAIM_POLL_S": "0.1", "RUNWARDEN_WORKSPACE": str(tmp_path / "ws"), **env,
        }
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--concurrency", str(concurrency), "--worker-id", worker_id],
            cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=err, text=True,
        )
        procs.append((proc, err))
        line = _readline(proc, timeout=30)
        assert "ready" in line, f"worker did not start: {line!r}\n{log.read_text()}"
        return proc, log

    yield start
    for proc, err in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        err.close()


def _readline(proc, timeout):
    box = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


def wait_until(predicate, timeout, what):
    # The worker is another process: its database rows are all we can watch.
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def twenty_runs_half_cancelled(seed):
    rng = random.Random(seed)
    runs = [transitions.create_run(agent="scripted", title=f"e2e {i}", input={"script": script()}) for i in range(20)]
    ids = [r.id for r in runs]
    wait_until(lambda: Run.objects.filter(pk__in=ids, status="running").count() == 20, 20, "all 20 running")
    doomed = rng.sample(ids, 10)
    outcomes = {}

    def cancel(run_id):
        try:
            outcomes[run_id] = transitions.request_cancel(run_id, by="e2e", source="api", note="random moment")
        finally:
            connection.close()  # this timer thread's own connection: the test database is dropped later

    timers = [threading.Timer(rng.uniform(0.0, 1.2), cancel, args=(run_id,)) for run_id in doomed]
    for timer in timers:
        timer.start()
    for timer in timers:
        timer.join()
    wait_until(lambda: not Run.objects.filter(pk__in=ids, status__in=Run.NON_TERMINAL).exists(), 30, "all settled")
    assert set(outcomes.values()) == {transitions.CancelOutcome.REQUESTED}, f"seed {seed}: {outcomes}"
    return ids, set(doomed)


def assert_outcomes(ids, doomed, seed):
    for run in Run.objects.filter(pk__in=ids):
        steps = list(Step.objects.filter(run=run).order_by("index"))
        assert [s.index for s in steps] == list(range(run.steps)), f"seed {seed}: gap in {run.id}"
        for step in steps:  # never a tool call without its result
            assert all("result" in c or "error" in c for c in step.tool_calls)
        if run.id in doomed:
            assert (run.status, run.termination_reason) == ("cancelled", "cancelled"), f"seed {seed}: {run.id}"
            events = dict(RunEvent.objects.filter(run=run, kind="cancel_requested").values_list("kind", "seq"))
            last_commit = max(
                RunEvent.objects.filter(run=run, kind="step_committed").values_list("seq", flat=True), default=0
            )
            assert last_commit < events["cancel_requested"], f"seed {seed}: step committed after the cancel"
            assert run.steps < 5
        else:
            assert (run.status, run.termination_reason, run.steps) == ("completed", "completed", 5)


class Listening:
    """Collect a group's channel-layer messages on a loop in a thread of its own."""

    def __init__(self, group):
        self.group, self.messages, self.ready = group, [], threading.Event()
        self.arrived = threading.Condition()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)

    def wait_for(self, predicate, timeout):
        """Block until `predicate(messages)` holds (True) or `timeout` passes (False).
        Broadcasts follow their commit, so a row can read settled before its message lands."""
        with self.arrived:
            return self.arrived.wait_for(lambda: predicate(list(self.messages)), timeout)

    async def _listen(self):
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(self.group, channel)
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        self.ready.set()
        while not self.stop.is_set():
            receive = asyncio.ensure_future(layer.receive(channel))
            await asyncio.wait({receive, asyncio.ensure_future(self.stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
            if receive.done():
                with self.arrived:
                    self.messages.append(receive.result())
                    self.arrived.notify_all()
            else:
                receive.cancel()
        await layer.flush()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def test_twenty_runs_half_cancelled_at_random_moments_over_the_fast_path(start_worker, redis_url):
    seed = random.randrange(1 << 30)
    proc, log = start_worker(redis_url, worker_id="e2e-fast")
    def settled(messages):
        return {m["run_id"] for m in messages if m.get("event") == "settled"}

    with Listening(groups.LIST_GROUP) as dashboard:
        ids, doomed = twenty_runs_half_cancelled(seed)
        # The worker's own broadcasts (claimed, step committed, settled) reached viewers.
        dashboard.wait_for(lambda messages: settled(messages) >= {str(i) for i in ids}, 10)
    assert_outcomes(ids, doomed, seed)
    assert settled(dashboard.messages) == {str(i) for i in ids}
    text = log.read_text()
    assert "cancel via channel" in text  # the fast path carried cancels
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_twenty_runs_half_cancelled_with_the_fast_path_unavailable(start_worker, redis_url):
    seed = random.randrange(1 << 30)
    proc, log = start_worker(DEAD_REDIS, worker_id="e2e-slow")
    ids, doomed = twenty_runs_half_cancelled(seed)
    assert_outcomes(ids, doomed, seed)
    text = log.read_text()
    assert "fast path unavailable" in text and "cancel via channel" not in text
    # Each cancel arrived through a heartbeat's answer, or the database refused the next
    # commit first: both are the slow path.
    assert text.count("cancel via heartbeat") + text.count("cancel via commit refused") == len(doomed)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0

