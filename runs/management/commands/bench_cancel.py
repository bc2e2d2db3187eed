"""`manage.py bench_cancel --runs 200 --cancel 100`: how fast does a cancel land?

Starts `run_agents` workers as subprocesses on the configured database and channel
layer, queues `--runs` scripted runs that stream for seconds, cancels `--cancel` of
them mid-stream at random moments, waits for every run to end, and prints ONE JSON
line: n, p50_ms, p99_ms, max_ms of request -> row cancelled, measured on the database
clock (`finished_at - cancel_requested_at`), so no process's clock is trusted.
Not a test: timings on a shared machine are noisy; compare figures from one machine.
"""

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from runs import transitions
from runs.models import Run

ROOT = Path(settings.BASE_DIR)


def _script(delay_ms):
    # Long enough (>= 5 s) that every cancel, sent 0.2-1.0 s after the start, lands mid-stream.
    words = max(20, int(5000 / max(delay_ms, 1)))
    return [{"say": " ".join(f"w{i}" for i in range(words)), "token_delay_ms": delay_ms}, {"say": "done"}]


def percentile(values, q):
    """Nearest-rank percentile of a sorted list."""
    if not values:
        return None
    rank = max(1, min(len(values), round(q / 100 * len(values) + 0.5)))
    return values[rank - 1]


class Command(BaseCommand):
    help = "Measure cancel latency (request -> row cancelled) with real workers; prints one JSON line."

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=200)
        parser.add_argument("--cancel", type=int, default=100)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--concurrency", type=int, default=10, help="runs at once per worker")
        parser.add_argument("--token-delay-ms", type=int, default=40, help="streaming pace of the runs")
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
        parser.add_argument("--worker-log", default="", help="append the workers' logs to this file")

    def handle(self, *args, runs, cancel, workers, concurrency, token_delay_ms, seed, timeout, worker_log, **options):
        if not 0 < cancel <= runs:
            raise CommandError("need 0 < --cancel <= --runs")
        rng = random.Random(seed)
        log = open(worker_log, "a") if worker_log else subprocess.DEVNULL  # noqa: SIM115 - closed below
        procs = [self._start_worker(f"bench-{os.getpid()}-{i}", concurrency, log) for i in range(workers)]
        try:
            ids = [transitions.create_run(agent="scripted", title=f"bench {i}", input={"script": _script(token_delay_ms)}).id
                   for i in range(runs)]
            doomed = set(rng.sample(ids, cancel))
            asyncio.run(self._cancel_mid_stream(doomed, rng, timeout))
            deadline = time.monotonic() + timeout
            while Run.objects.filter(pk__in=ids, status__in=Run.NON_TERMINAL).exists():
                if time.monotonic() > deadline:
                    raise CommandError("timed out waiting for the runs to end")
                time.sleep(0.1)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(30)
            if worker_log:
                log.close()
        latencies = self._latencies(doomed)
        result = {
            "n": len(latencies),
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "max_ms": latencies[-1] if latencies else None,
            "runs": runs,
            "workers": workers,
            "concurrency": concurrency,
            "token_delay_ms": token_delay_ms,
            "database": connection.vendor,
            "layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1],
        }
        self.stdout.write(json.dumps(result))

    def _start_worker(self, worker_id, concurrency, log):
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--concurrency", str(concurrency), "--worker-id", worker_id],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
        )
        line = proc.stdout.readline()
        if "ready" not in line:
            proc.kill()
            raise CommandError(f"worker {worker_id} did not start")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
        return proc

    async def _cancel_mid_stream(self, doomed, rng, timeout):
        """Cancel each doomed run a random 0.2-1.0 s after it started streaming.

        Requests are made the way the server makes them: a sync transition in a
        thread under `sync_to_async`, so its after-commit broadcast runs on this
        event loop with its channel-layer connection (as in daphne), not on a fresh
        loop and connection per request.
        """
        request = sync_to_async(self._request, thread_sensitive=False)
        running = sync_to_async(
            lambda ids: set(Run.objects.filter(pk__in=ids, status=Run.Status.RUNNING).values_list("pk", flat=True)),
            thread_sensitive=False,
        )
        pending, requests = set(doomed), []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise CommandError("timed out waiting for runs to start")
            started = await running(list(pending))
            for run_id in started:
                requests.append(asyncio.ensure_future(self._later(rng.uniform(0.2, 1.0), request, run_id)))
            pending -= started
            await asyncio.sleep(0.02)
        await asyncio.gather(*requests)

    @staticmethod
    async def _later(delay, request, run_id):
        await asyncio.sleep(delay)
        await request(run_id)

    @staticmethod
    def _request(run_id):
        try:
            transitions.request_cancel(run_id, by="bench", source=Run.CancelSource.CLI, note="bench_cancel")
        finally:
            connection.close()  # an executor thread: do not leave its connection behind

    @staticmethod
    def _latencies(doomed):
        rows = Run.objects.filter(pk__in=doomed, status=Run.Status.CANCELLED, cancel_requested_at__isnull=False)
        return sorted(
            round((finished - requested).total_seconds() * 1000, 2)
            for finished, requested in rows.values_list("finished_at", "cancel_requested_at")
        )
