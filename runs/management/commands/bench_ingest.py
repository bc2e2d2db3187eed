"""`manage.py bench_ingest`: how many streamed events one server process ingests.

Starts one daphne process on this configuration's database and channel layer (or uses
--url), creates a throwaway agent key and one claimed run per client, then has
--clients separate processes POST batches of --batch deltas to
`/api/v1/runs/{id}/events` for --seconds. Prints ONE JSON line: events/s per server
process, p50/p99 request time, and the setup. Everything it created is removed.
Not a test: numbers on a shared machine are noisy; compare runs, not absolutes.
"""

import json
import multiprocessing
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

from runs import transitions
from runs.api.auth import create_key
from runs.api.benchclient import post_batches
from runs.models import ApiKey, ApiRunCreator, Run


class Command(BaseCommand):
    help = "Benchmark event ingestion of the agent API; prints one JSON line."

    def add_arguments(self, parser):
        parser.add_argument("--clients", type=int, default=4)
        parser.add_argument("--seconds", type=float, default=5.0)
        parser.add_argument("--batch", type=int, default=100, help="events per request (at most 500)")
        parser.add_argument("--text", default="token ", help="the text of each delta")
        parser.add_argument("--url", default="", help="use this running server instead of starting one")

    def handle(self, *args, clients, seconds, batch, text, url, **options):
        if not 1 <= batch <= 500 or clients < 1 or seconds <= 0:
            raise CommandError("need 1 <= --batch <= 500, --clients >= 1, --seconds > 0")
        record, key = create_key(f"bench-{secrets.token_hex(4)}")
        run_ids = [self._held_run(record) for _ in range(clients)]
        server = None
        try:
            if not url:
                server, url = start_server()
            result = self._load(url, key, run_ids, batch, text, seconds)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
            Run.objects.filter(pk__in=run_ids).delete()
            ApiKey.objects.filter(pk=record.pk).delete()
        self.stdout.write(json.dumps(result))

    def _held_run(self, record):
        run = transitions.create_run(agent="bench", title="bench_ingest")
        ApiRunCreator.objects.create(run=run, worker=record.worker)
        transitions.claim(run.pk, worker=record.worker)
        return str(run.pk)

    def _load(self, url, key, run_ids, batch, text, seconds):
        start_at = time.time() + 1.5  # time for the spawned clients to start
        stop_at = start_at + seconds
        jobs = [(url, key, run_id, batch, text, start_at, stop_at) for run_id in run_ids]
        with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
            results = pool.starmap(post_batches, jobs)
        accepted = sum(r[0] for r in results)
        latencies = sorted(seconds for r in results for seconds in r[1])
        return {
            "events_per_s_per_process": round(accepted / seconds),
            "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
            "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
            "requests": len(latencies),
            "errors": sum(r[2] for r in results),
            "server_processes": 1,
            "clients": len(run_ids),
            "batch": batch,
            "seconds": seconds,
            "database": connection.vendor,
            "channel_layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1],
        }


def start_server():
    """One daphne process serving this project; returns (process, base url)."""
    connections.close_all()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DEBUG": "0", "SECRET_KEY": settings.SECRET_KEY, "RUNWARDEN_EMBEDDED": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "dashboard.asgi:application"],
        cwd=settings.BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in server.stderr:
        if "Listening on TCP address" in line:
            break
    else:
        raise CommandError(f"daphne did not start (exit {server.wait()})")
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    return server, f"http://127.0.0.1:{port}"


def _percentile(values, fraction):
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(len(values) * fraction))]
