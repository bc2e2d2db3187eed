"""`manage.py bench_waits --waiting 8 --plain 8 --concurrency 4`: do waits block a worker?

Starts one `run_agents` worker (a subprocess, on the configured database and channel
layer), queues `--waiting` runs that ask an approval (first, so they are claimed
first) and `--plain` runs, waits until every plain run completed and every waiting
run is released, answers them all, and waits until they completed. Prints ONE JSON
line: how long the plain runs took, and answer -> claimed (p50, max) per resumed run,
from the `resumed` and `claimed` events' times (both processes on this machine).
Not a test: timings on a shared machine are noisy.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs import transitions
from runs.models import Run, RunEvent

GATED = [{"say": "asking now"}, {"ask_approval": {"tool": "echo", "args": {"n": 1}}}, {"say": "done"}]


class Command(BaseCommand):
    help = "Measure that runs waiting for approval hold no worker slot; prints one JSON line."

    def add_arguments(self, parser):
        parser.add_argument("--waiting", type=int, default=8)
        parser.add_argument("--plain", type=int, default=8)
        parser.add_argument("--concurrency", type=int, default=4, help="slots of the one worker")
        parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")

    def handle(self, *args, waiting, plain, concurrency, timeout, **options):
        if min(waiting, plain, concurrency) < 1:
            raise CommandError("--waiting, --plain and --concurrency must be at least 1")
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--concurrency", str(concurrency), "--worker-id", "bench-waits"],
            cwd=Path(settings.BASE_DIR), env={**os.environ, "RUNWARDEN_CLAIM_POLL_S": "0.5"},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            if "ready" not in proc.stdout.readline():
                raise CommandError("the worker did not start")
            result = self._measure(waiting, plain, concurrency, time.monotonic() + timeout)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        self.stdout.write(json.dumps(result))

    def _measure(self, waiting, plain, concurrency, give_up):
        def until(ids, **state):
            while Run.objects.filter(pk__in=ids, **state).count() < len(ids):
                if time.monotonic() > give_up:
                    raise CommandError(f"timed out waiting for {state}")
                time.sleep(0.01)

        waits = [transitions.create_run(agent="scripted", title=f"bench wait {i}", input={"script": GATED}).id
                 for i in range(waiting)]
        plains = [transitions.create_run(agent="scripted", title=f"bench plain {i}", input={"script": [{"say": "plain"}]}).id
                  for i in range(plain)]
        started = time.monotonic()
        until(plains, status="completed")
        plain_s = time.monotonic() - started
        until(waits, status="waiting_for_approval", worker="")
        for run_id in waits:
            transitions.resume(run_id, expect=Run.Status.WAITING_FOR_APPROVAL, by="bench", answer={"approved": True})
        until(waits, status="completed")
        latencies = []
        for run_id in waits:
            at = dict(RunEvent.objects.filter(run_id=run_id, kind__in=["resumed", "claimed"]).order_by("seq")
                      .values_list("kind", "at"))  # the last claim: the resumed one
            latencies.append((at["claimed"] - at["resumed"]).total_seconds() * 1000)
        return {
            "bench": "waits", "concurrency": concurrency, "waiting": waiting, "plain": plain,
            "plain_completed_s": round(plain_s, 2),
            "answer_to_claimed_ms_p50": round(statistics.median(latencies), 1),
            "answer_to_claimed_ms_max": round(max(latencies), 1),
        }
