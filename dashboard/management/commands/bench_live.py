"""Measure the live path: a worker's delta → the WebSocket frame a viewer receives.

    python manage.py bench_live --runs 200 --viewers 50

Starts one daphne server (a forked process, the production ASGI application) on a
throwaway test database, creates `--runs` running runs, connects `--viewers` viewers
(each with the run list open and the detail page of its share of the runs, logged in
through the session, with a browser's Origin), then publishes deltas like the engine
does (`run.progress`, `--hz` per run) over the Redis pub/sub layer for `--seconds`.
Each delta carries a marker; each frame is matched to its delta by it. Prints one JSON
line: p50_ms, p99_ms (delta published → frame received), frames_per_s, dropped
(expected frames that never arrived), plus the parameters.

The server and the publisher share one clock (CLOCK_MONOTONIC), so latencies are
comparable across the two processes. A cross-process channel layer is needed: the
bench uses REDIS_URL (default redis://127.0.0.1:6379/0) with its own prefix.
"""

import asyncio
import json
import os
import re
import statistics
import time
from functools import partial

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

MARKER = re.compile(r"\u00a7(\d+)\u00a7")  # §123§: cannot be produced by HTML escaping


def process_cpu_s(pid):
    """User + system CPU seconds of another process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s():
    return time.process_time()


class Command(BaseCommand):
    help = "Benchmark delta→frame latency for many runs and viewers; prints one JSON line."

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=200)
        parser.add_argument("--viewers", type=int, default=50)
        parser.add_argument("--seconds", type=float, default=10.0)
        parser.add_argument("--hz", type=float, default=10.0, help="deltas per second per run (the engine's cap)")
        parser.add_argument("--drain", type=float, default=3.0, help="seconds to wait for late frames")
        parser.add_argument("--fanout", type=int, default=1, help="viewers with each run's detail page open")

    def handle(self, *args, **options):
        try:
            import websockets  # noqa: F401
        except ImportError:
            raise CommandError("bench_live needs the `websockets` package (pip install -e '.[test]')") from None
        redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.use_redis_layer(redis_url)
        old_name = connection.settings_dict["NAME"]
        test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        server = None
        try:
            cookie, run_ids = self.prepare(options["runs"])
            server, port = self.start_server()
            cpu_before = (process_cpu_s(server.pid), own_cpu_s())
            result = asyncio.run(self.measure(port, cookie, run_ids, options))
            # CPU seconds per wall second while measuring: is the server, or this client, the limit?
            wall = result.pop("elapsed")
            result["server_cpu"] = round((process_cpu_s(server.pid) - cpu_before[0]) / wall, 2)
            result["client_cpu"] = round((own_cpu_s() - cpu_before[1]) / wall, 2)
        finally:
            if server is not None:
                server.terminate()
                server.join(10)
            connections.close_all()
            connection.creation.destroy_test_db(old_name, verbosity=0)
        result.update(runs=options["runs"], viewers=options["viewers"], fanout=options["fanout"], seconds=options["seconds"],
                      hz=options["hz"], layer="redis-pubsub", database=connection.vendor, test_db=os.path.basename(str(test_name)))
        self.stdout.write(json.dumps(result))

    def use_redis_layer(self, redis_url):
        import redis
        from channels.layers import channel_layers

        try:
            redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
        except redis.RedisError as error:
            raise CommandError(f"bench_live needs Redis for a cross-process channel layer ({redis_url}): {error}")
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {"hosts": [redis_url], "prefix": f"rw_bench_{os.getpid()}"},
            }
        }
        channel_layers.backends.clear()

    def prepare(self, n_runs):
        from django.contrib.auth.models import Permission, User
        from django.test import Client

        from runs import transitions

        user = User.objects.create_user("bench-viewer", password="unused-" + os.urandom(8).hex())
        user.user_permissions.add(Permission.objects.get(content_type__app_label="runs", codename="view_run"))
        client = Client()
        client.force_login(user)
        run_ids = []
        for i in range(n_runs):
            run = transitions.create_run(agent="bench", title=f"bench run {i}")
            transitions.claim(run.id, worker="bench-worker")
            run_ids.append(str(run.id))
        return f"sessionid={client.cookies['sessionid'].value}", run_ids

    def start_server(self):
        from channels.testing.live import make_application
        from daphne.testing import DaphneProcess

        connections.close_all()  # the forked server must not share our database sockets
        server = DaphneProcess("127.0.0.1", partial(make_application, static_wrapper=None))
        server.start()
        if not server.ready.wait(timeout=30):
            server.terminate()
            raise CommandError("daphne did not start")
        return server, server.port.value

    async def measure(self, port, cookie, run_ids, options):
        import websockets
        from channels.layers import get_channel_layer

        from runs import groups

        headers = {"Origin": "http://127.0.0.1", "Cookie": cookie}
        base = f"ws://127.0.0.1:{port}"
        n_viewers = options["viewers"]
        watchers = {run_id: [] for run_id in run_ids}  # run → viewer sockets on its detail page
        sent_at, latencies, received = {}, [], [0]
        target, all_in = [None], asyncio.Event()
        sockets = []

        async def reader(ws):
            async for frame in ws:
                now = time.monotonic()
                for marker in MARKER.findall(frame):
                    at = sent_at.get(int(marker))
                    if at is not None:
                        latencies.append((now - at) * 1000)
                        received[0] += 1
                        if target[0] is not None and received[0] >= target[0]:
                            all_in.set()

        async def connect(path):
            ws = await websockets.connect(base + path, additional_headers=headers, max_queue=None, open_timeout=30)
            sockets.append(ws)
            return ws

        readers = []
        for v in range(n_viewers):
            readers.append(asyncio.ensure_future(reader(await connect("/ws/runs/?page=1"))))
            for i, run_id in enumerate(run_ids):
                if (v - i) % n_viewers < options["fanout"]:
                    ws = await connect(f"/ws/runs/{run_id}/?seq=2&steps=0&step=0&offset=0")
                    watchers[run_id].append(ws)
                    readers.append(asyncio.ensure_future(reader(ws)))

        layer = get_channel_layer()
        offsets = dict.fromkeys(run_ids, 0)
        expected, marker = 0, 0
        interval = 1.0 / options["hz"]
        loop = asyncio.get_running_loop()
        started = loop.time()
        tick = 0
        # Spread the runs over the interval, as independent workers would be.
        while loop.time() - started < options["seconds"]:
            tick_start = started + tick * interval
            for i, run_id in enumerate(run_ids):
                due = tick_start + interval * i / len(run_ids)
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                marker += 1
                text = f" word\u00a7{marker}\u00a7"
                sent_at[marker] = time.monotonic()
                await layer.group_send(groups.viewers(run_id), {
                    "type": "run.progress", "run_id": run_id, "step": 0, "offset": offsets[run_id], "text": text,
                })
                offsets[run_id] += len(text)
                expected += len(watchers[run_id])
            tick += 1
        elapsed = loop.time() - started
        target[0] = expected
        if received[0] < expected:
            try:
                await asyncio.wait_for(all_in.wait(), options["drain"])
            except TimeoutError:
                pass  # what is still missing is dropped
        for ws in sockets:
            await ws.close()
        for task in readers:
            task.cancel()
        latencies.sort()
        return {
            "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
            "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2) if latencies else None,
            "frames_per_s": round(received[0] / elapsed, 1),
            "dropped": expected - received[0],
            "frames": received[0],
            "elapsed": loop.time() - started,
            "deltas": marker,
        }
