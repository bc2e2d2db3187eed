"""`manage.py bench_cancel --live 200 --workers 2` / `--curve 20,50,100,200,500,1000`:
how fast does a cancel land while N runs stream at once?

For each point: a throwaway PostgreSQL database of its own (--database, else
RUNWARDEN_BENCH_DATABASE, else bench_cancel_<pid>; dropped at the end), `--workers`
real `run_agents` subprocesses with `--concurrency` live/workers each, and `live`
scripted runs streaming at --token-delay-ms (40 ms) per token. Once they stream, it
cancels a random streaming run `--rate` times a second, the way the server does (a
sync transition in a thread, its broadcast on a long-lived loop), and queues a fresh
run for each one cancelled, so the live set stays full while `--cancels` (200) land:
p99 is not the maximum. Prints ONE JSON line per point:

  live, workers, concurrency, n, p50_ms / p99_ms / max_ms  request -> row cancelled on
      the DATABASE clock (finished_at - cancel_requested_at): no process's clock is trusted
  live_held_min / live_held_p50    live runs actually held while cancelling
  worker_cpu_pct                   per worker, from /proc/<pid>/stat (100 = one core)
  pg_connections_peak              sessions on the bench database (all processes but the
                                   sampler's own); pg_worker_connections_peak: the workers'
  connection_errors                worker log lines naming a connection failure
  slow_path                        cancels that arrived by heartbeat (the workers' logs)
  cancel_paths, fast_path_unavailable, request_ms_p50 (the bench's own round trip)

Not a test: timings on a shared machine are noisy; compare figures from one machine.
"""

import asyncio
import json
import math
import os
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections
from django.db.models.functions import Now

from runs import benchkit, transitions
from runs.models import Run


def script(seconds, delay_ms):
    """One long streamed turn: no run ends by itself while a point is measured."""
    words = max(20, int(seconds * 1000 / max(delay_ms, 1)))
    return [{"say": " ".join(f"w{i}" for i in range(words)), "token_delay_ms": delay_ms}]


def parse_curve(text):
    try:
        points = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise CommandError(f"--curve {text!r}: give live-run counts, e.g. 20,50,100") from None
    if not points or min(points) < 1:
        raise CommandError(f"--curve {text!r}: every point must be at least 1")
    return points


class Command(BaseCommand):
    help = "Cancel latency (request -> row cancelled) with N live runs on real workers; one JSON line per point."

    def add_arguments(self, parser):
        parser.add_argument("--live", type=int, default=20, help="runs streaming at once")
        parser.add_argument("--curve", default="", help="comma-separated live counts: one JSON line each")
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--concurrency", type=int, default=0, help="per worker (default: live / workers)")
        parser.add_argument("--cancels", type=int, default=200, help="cancels measured per point")
        parser.add_argument("--rate", type=float, default=20.0, help="cancels per second")
        parser.add_argument("--min-age-ms", type=int, default=200, help="cancel only runs streaming this long")
        parser.add_argument("--token-delay-ms", type=int, default=40)
        parser.add_argument("--warmup-timeout", type=float, default=120.0, help="seconds for the live set to fill")
        parser.add_argument("--timeout", type=float, default=300.0, help="seconds for one point's cancels")
        parser.add_argument("--database", default="", help="the bench's own database (created and dropped)")
        parser.add_argument("--log-dir", default="", help="keep the workers' logs here")
        parser.add_argument("--seed", type=int, default=None)

    def handle(self, *args, **opts):
        points = parse_curve(opts["curve"]) if opts["curve"] else [opts["live"]]
        if opts["workers"] < 1 or opts["cancels"] < 1 or opts["rate"] <= 0 or min(points) < 1:
            raise CommandError("--live, --workers, --cancels and --rate must be positive")
        benchkit.require_postgres_and_redis("bench_cancel")
        name = benchkit.bench_database_name(opts["database"], "bench_cancel")
        self.prefix = benchkit.bench_prefix("bench_cancel")
        benchkit.use_channel_prefix(self.prefix)
        self.rng = random.Random(opts["seed"])
        settings.DEBUG = False  # no query log growing in memory
        log_dir = opts["log_dir"] or tempfile.mkdtemp(prefix="bench_cancel_")
        with benchkit.ThrowawayDatabase(name):
            for live in points:
                result = self.point(name, live, log_dir, opts)
                self.stdout.write(json.dumps(result))
                self.stdout.flush()

    def point(self, db_name, live, log_dir, opts):
        workers = opts["workers"]
        concurrency = opts["concurrency"] or math.ceil(live / workers)
        result = {"live": live, "workers": workers, "concurrency": concurrency}
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE runs_run CASCADE")
        fleet = benchkit.Fleet(
            lambda app, **extra: benchkit.child_env(db_name, self.prefix, app, **extra), log_dir
        )
        run_s = opts["timeout"] + opts["warmup_timeout"]
        turns = script(run_s, opts["token_delay_ms"])
        requested, request_ms, sampler, errors = [], [], None, 0
        try:
            for i in range(workers):
                fleet.start_worker(f"bench-{live}-{i}", concurrency)
            pids = [p.pid for p in fleet.workers]
            for i in range(live):
                transitions.create_run(agent="scripted", title=f"bench {i}", input={"script": turns})
            started = time.monotonic()
            self.wait_for_live(live, opts["warmup_timeout"], fleet)
            result["warmup_s"] = round(time.monotonic() - started, 1)
            cpu, began = benchkit.CpuMeter(pids), time.monotonic()
            with benchkit.Sampler(db_name) as sampler:
                errors = asyncio.run(self.cancel_while_streaming(turns, requested, request_ms, opts))
                self.wait_for_ends(requested, opts["timeout"])
            result["worker_cpu_pct"] = cpu.percent()
            result["window_s"] = round(time.monotonic() - began, 1)
            result["cancels_per_s"] = round(len(requested) / result["window_s"], 1)
        except CommandError as error:  # the point failed: say so on its line, go on to the next
            result["error"] = str(error)
        finally:
            fleet.stop()
            connections.close_all()
        logs = benchkit.read_logs(fleet.worker_logs)
        latencies = self.latencies(requested)
        paths = benchkit.cancel_paths(logs, requested)
        held = sorted(sampler.live) if sampler else []
        result.update(
            n=len(latencies),
            p50_ms=benchkit.percentile(latencies, 50),
            p99_ms=benchkit.percentile(latencies, 99),
            max_ms=latencies[-1] if latencies else None,
            live_held_min=held[0] if held else None,
            live_held_p50=benchkit.percentile(held, 50),
            pg_connections_peak=sampler.peak_sessions if sampler else None,
            pg_worker_connections_peak=sampler.peak_by_app.get(benchkit.WORKER_APP, 0) if sampler else None,
            connection_errors=benchkit.connection_errors(logs) + errors,
            slow_path=paths.get("heartbeat", 0),
            cancel_paths=dict(paths),
            fast_path_unavailable=logs.count("fast path unavailable"),
            request_ms_p50=benchkit.percentile(sorted(request_ms), 50),
            token_delay_ms=opts["token_delay_ms"],
            rate=opts["rate"],
            load_1m=round(os.getloadavg()[0], 1),  # the machine is shared: how busy it was
            database=connection.vendor,
            layer=settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1],
        )
        return result

    def wait_for_live(self, live, timeout, fleet):
        """Until every run is held by a worker (streaming starts at once): a warm-up."""
        deadline = time.monotonic() + timeout
        while Run.objects.filter(status=Run.Status.RUNNING).count() < live:
            if any(p.poll() is not None for p in fleet.workers):
                raise CommandError("a worker died during the warm-up (see its log)")
            if time.monotonic() > deadline:
                held = Run.objects.filter(status=Run.Status.RUNNING).count()
                raise CommandError(f"only {held} of {live} runs were running after {timeout:.0f} s")
            time.sleep(0.2)

    async def cancel_while_streaming(self, turns, requested, request_ms, opts):
        """Cancel `--cancels` streaming runs at `--rate`, topping the live set up with a
        fresh run for each. One thread makes the requests, as a server thread would (its
        broadcasts go out on the publisher's long-lived loop); another queues the top-ups,
        so creating runs never delays a cancel."""
        db = sync_to_async(lambda fn, *a: fn(*a))
        creator = ThreadPoolExecutor(1, thread_name_prefix="bench-top-up")
        top_ups = []
        interval, min_age = 1.0 / opts["rate"], opts["min_age_ms"] / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + opts["timeout"]
        due, candidates, refreshed, errors = loop.time(), [], 0.0, 0
        try:
            while len(requested) < opts["cancels"]:
                if loop.time() > deadline:
                    raise CommandError(f"only {len(requested)} cancels in {opts['timeout']:.0f} s")
                due = max(due + interval, loop.time() - interval)  # no burst after a stall
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not candidates or loop.time() - refreshed > 0.5:
                    candidates = await db(self.streaming, min_age)
                    refreshed = loop.time()
                if not candidates:
                    continue
                run_id = candidates.pop()
                t0 = time.perf_counter()
                try:
                    outcome = await db(self.request, run_id)
                except Exception:  # noqa: BLE001 - counted: a cancel the operator could not make
                    errors += 1
                    continue
                request_ms.append(round((time.perf_counter() - t0) * 1000, 2))
                if outcome == transitions.CancelOutcome.REQUESTED:
                    requested.append(run_id)
                    top_ups.append(loop.run_in_executor(creator, lambda: transitions.create_run(
                        agent="scripted", title="bench top-up", input={"script": turns})))
        finally:
            await asyncio.gather(*top_ups, return_exceptions=True)
            await loop.run_in_executor(creator, connections.close_all)  # that thread's own
            creator.shutdown()
            await db(connections.close_all)  # this thread's, not the main one's
        return errors

    def streaming(self, min_age):
        ids = list(
            Run.objects.filter(
                status=Run.Status.RUNNING, cancel_requested_at__isnull=True,
                started_at__lte=Now() - timedelta(seconds=min_age),
            ).values_list("pk", flat=True)
        )
        self.rng.shuffle(ids)
        return ids

    @staticmethod
    def request(run_id):
        return transitions.request_cancel(run_id, by="bench", source=Run.CancelSource.CLI, note="bench_cancel")

    @staticmethod
    def wait_for_ends(run_ids, timeout):
        deadline = time.monotonic() + timeout
        while Run.objects.filter(pk__in=run_ids, status__in=Run.NON_TERMINAL).exists():
            if time.monotonic() > deadline:
                left = Run.objects.filter(pk__in=run_ids, status__in=Run.NON_TERMINAL).count()
                raise CommandError(f"{left} cancelled runs had not ended after {timeout:.0f} s")
            time.sleep(0.1)
        connection.close()

    @staticmethod
    def latencies(run_ids):
        rows = Run.objects.filter(pk__in=run_ids, status=Run.Status.CANCELLED, cancel_requested_at__isnull=False)
        return sorted(
            round((finished - requested).total_seconds() * 1000, 2)
            for finished, requested in rows.values_list("finished_at", "cancel_requested_at")
        )

