"""`manage.py bench_live --runs 300 --workers 1 --viewers 30`: the live view end to end.

Everything is real: a throwaway PostgreSQL database of its own (--database, else
RUNWARDEN_BENCH_DATABASE, else bench_live_<pid>; dropped at the end), a daphne server
subprocess, `--workers` `run_agents` subprocesses streaming `--runs` scripted runs at
--token-delay-ms (40 ms) per token, and `--viewers` WebSocket viewers, logged in with a
session cookie and a browser's Origin, each on the page of one run.

How latency is measured without touching the worker's message: a tap thread with its
own event loop subscribes to the watched runs' viewer groups on Redis, like one more
daphne process would, and stamps each delta when Redis hands it over (publish + about
0.15 ms). Each run streams the words w0 w1 w2 …, so a word names itself: its latency is
the first frame that shows it minus the tap's stamp of the delta that carried it (one
clock: both are this process's CLOCK_MONOTONIC). It covers Redis -> daphne -> the
consumer -> the socket; the worker's own lag shows as `published_pace` instead: words of
the watched runs that reached Redis per second over the words their script schedules
(1.0 = on time; less = the worker falls behind, or stopped publishing, e.g. with its fast
path marked down).

Prints ONE JSON line: frames per viewer against what the coalescing interval allows
(RUNWARDEN_PROGRESS_HZ per second: frames_ratio_min / _p50), p50/p99/max delta -> frame,
dropped (words published to a watched run in the window that its viewer never showed),
resyncs, held_max_per_worker (did one worker hold every run), CPU of workers and server,
fast-path warnings in the workers' logs.
"""

import asyncio
import json
import math
import os
import re
import tempfile
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from dashboard.wsviewer import RunPageViewer
from runs import benchkit, groups, transitions
from runs.models import Run

WORD = re.compile(r"\bw(\d+)\b")


class Tap:
    """The watched runs' viewer groups, heard from a thread of its own so this
    process's socket reading never delays the stamps."""

    def __init__(self, run_ids, prefix):
        self.run_ids, self.prefix = [str(r) for r in run_ids], prefix
        self.stamps = {}  # (run_id, word) -> monotonic time the delta carrying it arrived
        self.deltas = 0
        self.ready, self._stop = threading.Event(), None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self, timeout=30):
        self._thread.start()
        if not self.ready.wait(timeout):
            raise CommandError("the Redis tap did not subscribe")

    def stop(self):
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self):
        from channels_redis.pubsub import RedisPubSubChannelLayer

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        layer = RedisPubSubChannelLayer(hosts=[settings.REDIS_URL], prefix=self.prefix)
        listeners = []
        for run_id in self.run_ids:
            channel = await layer.new_channel()
            await layer.group_add(groups.viewers(run_id), channel)
            listeners.append(asyncio.ensure_future(self._listen(layer, channel, run_id)))
        self.ready.set()
        await self._stop.wait()
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
        await layer.flush()

    async def _listen(self, layer, channel, run_id):
        while True:
            message = await layer.receive(channel)
            at = time.monotonic()
            if message.get("type") != "run.progress":
                continue
            self.deltas += 1
            for word in WORD.findall(message.get("text", "")):
                self.stamps.setdefault((run_id, int(word)), at)


class Command(BaseCommand):
    help = "The live view end to end (real workers, daphne, WebSocket viewers); prints one JSON line."

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=300)
        parser.add_argument("--workers", type=int, default=1)
        parser.add_argument("--viewers", type=int, default=30)
        parser.add_argument("--concurrency", type=int, default=0, help="per worker (default: runs / workers)")
        parser.add_argument("--seconds", type=float, default=15.0, help="measured window")
        parser.add_argument("--token-delay-ms", type=int, default=40)
        parser.add_argument("--drain", type=float, default=3.0, help="seconds for late frames after the window")
        parser.add_argument("--warmup-timeout", type=float, default=120.0)
        parser.add_argument("--database", default="", help="the bench's own database (created and dropped)")
        parser.add_argument("--log-dir", default="", help="keep the processes' logs here")

    def handle(self, *args, **opts):
        try:
            import websockets  # noqa: F401
        except ImportError:
            raise CommandError("bench_live needs the `websockets` package (pip install -e '.[test]')") from None
        benchkit.require_postgres_and_redis("bench_live")
        if min(opts["runs"], opts["workers"], opts["viewers"]) < 1 or opts["viewers"] > opts["runs"]:
            raise CommandError("need --runs, --workers, --viewers >= 1 and --viewers <= --runs")
        name = benchkit.bench_database_name(opts["database"], "bench_live")
        prefix = benchkit.bench_prefix("bench_live")
        benchkit.use_channel_prefix(prefix)
        settings.DEBUG = False
        log_dir = opts["log_dir"] or tempfile.mkdtemp(prefix="bench_live_")
        with benchkit.ThrowawayDatabase(name):
            result = self.run(name, prefix, log_dir, opts)
        self.stdout.write(json.dumps(result))

    def run(self, db_name, prefix, log_dir, opts):
        workers = opts["workers"]
        concurrency = opts["concurrency"] or math.ceil(opts["runs"] / workers)
        hz = settings.RUNWARDEN_PROGRESS_HZ
        result = {"runs": opts["runs"], "workers": workers, "concurrency": concurrency, "viewers": opts["viewers"],
                  "seconds": opts["seconds"], "token_delay_ms": opts["token_delay_ms"], "progress_hz": hz}
        cookie = self.login()
        words = int((opts["seconds"] + opts["warmup_timeout"] + 60) * 1000 / opts["token_delay_ms"])
        turns = [{"say": " ".join(f"w{i}" for i in range(words)), "token_delay_ms": opts["token_delay_ms"]}]
        run_ids = [str(transitions.create_run(agent="scripted", title=f"live {i}", input={"script": turns}).id)
                   for i in range(opts["runs"])]
        watched = run_ids[: opts["viewers"]]
        fleet = benchkit.Fleet(lambda app, **extra: benchkit.child_env(db_name, prefix, app, **extra), log_dir)
        connections.close_all()
        try:
            server, port = fleet.start_server()
            for i in range(workers):
                fleet.start_worker(f"live-{i}", concurrency)
            self.wait_for_live(opts["runs"], opts["warmup_timeout"], fleet)
            connections.close_all()
            tap = Tap(watched, prefix)
            tap.start()
            cpu = benchkit.CpuMeter([p.pid for p in fleet.workers] + [server.pid])
            with benchkit.Sampler(db_name) as sampler:
                measured = asyncio.run(self.measure(port, cookie, watched, tap, opts))
            usage = cpu.percent()
            tap.stop()
            result.update(measured)
            result.update(worker_cpu_pct=usage[:-1], server_cpu_pct=usage[-1],
                          held_max_per_worker=max(sampler.peak_held.values(), default=0),
                          pg_connections_peak=sampler.peak_sessions)
            result["one_worker_held_all"] = workers == 1 and result["held_max_per_worker"] >= opts["runs"]
        except CommandError as error:
            result["error"] = str(error)
        finally:
            fleet.stop()
            connections.close_all()
        logs = benchkit.read_logs(fleet.worker_logs)
        result["load_1m"] = round(os.getloadavg()[0], 1)  # the machine is shared: how busy it was
        result["fast_path_unavailable"] = logs.count("fast path unavailable")
        result["connection_errors"] = benchkit.connection_errors(logs)
        return result

    @staticmethod
    def login():
        from django.contrib.auth.models import Permission, User
        from django.test import Client

        user = User.objects.create_user("bench-viewer", password="unused-" + os.urandom(8).hex())
        user.user_permissions.add(Permission.objects.get(content_type__app_label="runs", codename="view_run"))
        client = Client()
        client.force_login(user)
        return f"sessionid={client.cookies['sessionid'].value}"

    @staticmethod
    def wait_for_live(n, timeout, fleet):
        deadline = time.monotonic() + timeout
        while Run.objects.filter(status=Run.Status.RUNNING).count() < n:
            if any(p.poll() is not None for p in fleet.workers + fleet.servers):
                raise CommandError("a worker or the server died during the warm-up (see its log)")
            if time.monotonic() > deadline:
                held = Run.objects.filter(status=Run.Status.RUNNING).count()
                raise CommandError(f"only {held} of {n} runs were running after {timeout:.0f} s")
            time.sleep(0.2)

    async def measure(self, port, cookie, watched, tap, opts):
        base = f"ws://127.0.0.1:{port}"
        seen = {run_id: {} for run_id in watched}  # run -> word -> first frame showing it
        window = {}  # viewer's text frames inside the window

        def on_text(run_id):
            def record(text, at):
                firsts = seen[run_id]
                for word in WORD.findall(text):
                    firsts.setdefault(int(word), at)
                if window.get("open"):
                    window[run_id] = window.get(run_id, 0) + 1
            return record

        viewers = [RunPageViewer(base, run_id, cookie, on_text=on_text(run_id)) for run_id in watched]
        retries = 0
        for viewer in viewers:  # one at a time, as people open pages; a refused handshake is retried
            for attempt in range(3):
                try:
                    await viewer.connect()
                    break
                except Exception as error:  # noqa: BLE001 - counted, and fatal after the third
                    retries += 1
                    if attempt == 2:
                        raise CommandError(f"a viewer could not connect: {type(error).__name__}: {error}") from None
        readers = [asyncio.ensure_future(v.read()) for v in viewers]
        await asyncio.sleep(1.0)  # the resync on connect lands first: it is not part of the window
        start = time.monotonic()
        window["open"] = True
        await asyncio.sleep(opts["seconds"])
        window["open"] = False
        end = time.monotonic()
        await asyncio.sleep(opts["drain"])
        for viewer in viewers:
            await viewer.close()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

        latencies, dropped, published = [], 0, 0
        emitted = {run_id: [] for run_id in watched}
        for (run_id, word), stamped in tap.stamps.items():
            if not start <= stamped <= end:
                continue
            published += 1
            emitted[run_id].append(word)
            shown = seen[run_id].get(word)
            if shown is None:
                dropped += 1
            else:
                latencies.append(round((shown - stamped) * 1000, 2))
        latencies.sort()
        allowed = settings.RUNWARDEN_PROGRESS_HZ * (end - start)
        ratios = sorted(window.get(run_id, 0) / allowed for run_id in watched)
        scheduled = (end - start) * 1000 / opts["token_delay_ms"]
        paces = sorted(len(words) / scheduled for words in emitted.values())
        return {
            "frames_allowed_per_viewer": round(allowed, 1),
            "frames_min": min(window.get(r, 0) for r in watched),
            "frames_ratio_min": round(ratios[0], 3),
            "frames_ratio_p50": round(benchkit.percentile(ratios, 50), 3),
            "p50_ms": benchkit.percentile(latencies, 50),
            "p99_ms": benchkit.percentile(latencies, 99),
            "max_ms": latencies[-1] if latencies else None,
            "words_published": published,
            "dropped": dropped,
            "resyncs_after_connect": sum(max(0, v.resyncs - 1) for v in viewers),  # one on connect is expected
            "deltas_tapped": tap.deltas,
            "viewer_connect_retries": retries,
            "published_pace_min": round(paces[0], 3),
            "published_pace_p50": round(benchkit.percentile(paces, 50), 3),
        }
