"""End to end: a separate process speaking only HTTP to a live daphne server runs a
loop and is cancelled through `transitions.request_cancel`. The cancel must reach it
(over the WebSocket control channel, or the long-poll) and the run end cancelled/cancelled.
How fast is for the benchmarks (bench_cancel): a wall-clock bound here failed on a loaded
machine ("ended after [235, 48, 192] ms") while the behaviour was right.

The cancel travels test process → Redis → server → agent process → server → database,
so these need the Redis channel layer (the in-memory one is not shared between
processes) and skip without it. The documented client (docs/agent_client.py) is also
run to completion here, on every configuration, to keep it runnable.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from runs import groups, transitions
from runs.api.auth import create_key
from runs.api.db_call import db_call
from runs.models import Run

ROOT = Path(__file__).resolve().parents[3]
# Every one of TRIES cancels must reach its agent and end the run cancelled/cancelled.
TRIES = 3
needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs the Redis channel layer: set REDIS_URL")


def start_agent(argv, env=None):
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_line(process):
    line = process.stdout.readline().strip()  # blocks until the agent is ready (an event, not a sleep)
    if not line:
        raise AssertionError(f"agent exited early: {process.wait()} {process.stderr.read()}")
    return line


def timed_request_cancel(run_id):
    """request_cancel on an already open connection (opening one is the harness's
    cost, not the cancel's); returns the wall-clock time it was called at."""
    try:
        connection.ensure_connection()
        called_at = time.time()
        assert transitions.request_cancel(run_id, by="e2e", source="api", note="e2e") == "requested"
        return called_at
    finally:
        connection.close()


async def cancel_and_time_the_settle(run_id):
    """Call request_cancel and wait for the run's terminal `run.changed` broadcast
    (sent after the agent's settle commits). Returns the seconds from the call to the
    run's `finished_at`, the database's own record of when it ended — so the test's
    own receive latency on a loaded machine is not counted against the agent."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(groups.viewers(run_id), channel)
    called_at = await sync_to_async(timed_request_cancel, thread_sensitive=False)(run_id)
    while True:
        message = await asyncio.wait_for(layer.receive(channel), timeout=10)
        if message["type"] == "run.changed" and message["status"] in Run.TERMINAL:
            break
    await layer.group_discard(groups.viewers(run_id), channel)
    run = await db_call(Run.objects.get)(pk=run_id)
    elapsed = run.finished_at.timestamp() - called_at
    print(f"run ended {elapsed * 1000:.1f} ms after request_cancel was called")
    return elapsed


def finish(process):
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    return out


async def cancel_agents(argv, env=None, times=TRIES):
    """Start the agent `times` times, cancel each run through request_cancel; returns
    the seconds each took to end, after checking each ended cancelled/cancelled."""
    took = []
    for _ in range(times):
        agent = start_agent(argv, env)
        try:
            run_id = await asyncio.to_thread(first_line, agent)
            took.append(await cancel_and_time_the_settle(run_id))
            out = await asyncio.to_thread(finish, agent)
        finally:
            agent.kill()
        run = await db_call(Run.objects.get)(pk=run_id)
        assert (run.status, run.termination_reason) == ("cancelled", "cancelled"), out
        assert '"settled": true' in out.lower() or "'settled': true" in out.lower(), out
    return took


@needs_redis
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_websocket_agent_gets_the_cancel_and_ends_cancelled(live_server_url):
    # The agent hears of a cancel only on its control socket: that it settled
    # cancelled (checked in cancel_agents) is the proof the cancel reached it there.
    _, key = await db_call(create_key)("e2e-ws")
    took = await cancel_agents(["tests/runs/api/ws_agent.py", live_server_url, key])
    assert len(took) == TRIES


@needs_redis
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_long_polling_agent_gets_the_cancel_and_ends_cancelled(live_server_url):
    _, key = await db_call(create_key)("e2e-poll")
    env = {"RUNWARDEN_URL": live_server_url, "RUNWARDEN_KEY": key, "RUNWARDEN_STEPS": "100000", "RUNWARDEN_STEP_S": "0.05"}
    took = await cancel_agents(["docs/agent_client.py"], env)
    assert len(took) == TRIES  # that the layer, not the re-check, wakes a poll: test_control


@pytest.mark.django_db(transaction=True)
def test_the_documented_client_runs_to_completion(live_server_url):
    _, key = create_key("docs-client")
    env = {"RUNWARDEN_URL": live_server_url, "RUNWARDEN_KEY": key, "RUNWARDEN_STEPS": "3", "RUNWARDEN_STEP_S": "0.01"}
    agent = start_agent(["docs/agent_client.py"], env)
    run_id = first_line(agent)
    out = finish(agent)
    assert '"settled": True' in out or "'settled': True" in out, out
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.termination_reason, run.steps) == ("completed", "completed", 3)


def test_the_documented_client_stays_under_50_lines():
    assert len((ROOT / "docs" / "agent_client.py").read_text().splitlines()) < 50


@pytest.mark.django_db(transaction=True)
def test_bench_ingest_prints_one_json_line(live_server_url, capsys):
    call_command("bench_ingest", "--url", live_server_url, "--clients", "1", "--seconds", "0.5", "--batch", "50")
    (line,) = capsys.readouterr().out.strip().splitlines()
    result = json.loads(line)
    assert result["events_per_s_per_process"] > 0 and result["errors"] == 0 and result["p99_ms"] > 0
    assert not Run.objects.filter(agent="bench").exists()  # it cleans up after itself
