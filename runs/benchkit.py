"""What the benchmarks (and the scale test) share: a throwaway PostgreSQL database of
their own, real `run_agents` workers and a daphne server as subprocesses on it, and
what can be read about those processes from outside (CPU from /proc, connections from
pg_stat_activity, the lines they log).

Nothing here is used by the product; it exists so each figure comes from the real
processes an operator would run, not from an imitation inside the benchmark.
"""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection, connections

ROOT = Path(settings.BASE_DIR)
WORKER_APP = "rw-bench-worker"  # PGAPPNAME of the workers: pg_stat_activity tells them apart
SERVER_APP = "rw-bench-server"
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
SETTLED_CANCELLED = re.compile(
    r"run (?P<id>[0-9a-f-]{36}) settled cancelled/cancelled \(cancel via (?P<via>[^,)]+)"
)
CONNECTION_ERRORS = re.compile(
    r"too many clients|OperationalError|could not connect|connection (?:refused|failed|is closed)|PoolTimeout",
    re.IGNORECASE,
)


def percentile(values, q):
    """Nearest-rank percentile of a sorted list (None for an empty one)."""
    if not values:
        return None
    rank = max(1, min(len(values), math.ceil(q / 100 * len(values))))
    return values[rank - 1]


def process_cpu_s(pid):
    """User + system CPU seconds of a process (Linux /proc); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU % of each process between start() and percent(): 100 is one core."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.start()

    def start(self):
        self.at = time.monotonic()
        self.cpu = [process_cpu_s(pid) for pid in self.pids]

    def percent(self):
        wall = max(time.monotonic() - self.at, 1e-9)
        return [round(100 * (process_cpu_s(pid) - before) / wall, 1) for pid, before in zip(self.pids, self.cpu)]


def bench_database_name(option, command):
    """The benchmark's own database: --database, else RUNWARDEN_BENCH_DATABASE, else a
    name with this process's id in it, so two benchmarks never share one."""
    name = option or os.environ.get("RUNWARDEN_BENCH_DATABASE") or f"{command}_{os.getpid()}"
    if not NAME_RE.match(name):
        raise CommandError(f"bench database name {name!r}: use lowercase letters, digits and _")
    if name in (connection.settings_dict["NAME"], "postgres", "template0", "template1"):
        raise CommandError(f"bench database name {name!r} is a real database: give one of the bench's own")
    return name


def require_postgres_and_redis(command):
    if connection.vendor != "postgresql":
        raise CommandError(f"{command} needs PostgreSQL: set DATABASE_URL=postgres://…")
    if not settings.REDIS_URL:
        raise CommandError(f"{command} needs Redis for a channel layer shared by processes: set REDIS_URL=redis://…")


class ThrowawayDatabase:
    """Create (migrated) and drop a database of the benchmark's own, through Django's
    test-database machinery, so the configured one is never touched."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.real = connection.settings_dict["NAME"]
        connection.settings_dict.setdefault("TEST", {})["NAME"] = self.name
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        return self

    def __exit__(self, *exc):
        connections.close_all()
        drop_other_sessions(self.name)
        connection.creation.destroy_test_db(self.real, verbosity=0)


def drop_other_sessions(name):
    """End what is left connected to our own bench database (a killed worker's
    sessions linger a moment), so it can be truncated or dropped."""
    with connection._nodb_cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )


def database_url(name):
    """A postgres:// URL for database `name` with the configured credentials."""
    db = connection.settings_dict
    auth = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth + '@' if auth else ''}{host}{port}/{name}"


def use_channel_prefix(prefix):
    """Point this process's channel layer at `prefix` (the children get it from their
    environment): Redis pub/sub ignores the DB number, only a prefix keeps runs apart."""
    from channels.layers import channel_layers

    layers = {k: dict(v) for k, v in settings.CHANNEL_LAYERS.items()}
    layers["default"]["CONFIG"] = {**layers["default"].get("CONFIG", {}), "prefix": prefix}
    settings.CHANNEL_LAYERS = layers
    channel_layers.backends.clear()


def bench_prefix(command):
    return f"{os.environ.get('RUNWARDEN_CHANNEL_PREFIX', 'runwarden')}_{command}_{os.getpid()}"


def child_env(db_name, prefix, app, **extra):
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(db_name),
        REDIS_URL=settings.REDIS_URL,
        RUNWARDEN_CHANNEL_PREFIX=prefix,
        RUNWARDEN_EMBEDDED="0",
        RUNWARDEN_DEMO="0",
        SECRET_KEY=settings.SECRET_KEY,
        PGAPPNAME=app,
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _wait_line(stream, pattern, timeout, what, sink):
    """Read `stream` until a line matches `pattern` (returns the match); a thread keeps
    copying it into `sink` (the child's log) so the child never blocks on a full pipe."""
    found, lines = [], []
    done = threading.Event()

    def read():
        for line in stream:
            try:
                sink.write(line)
                sink.flush()
            except ValueError:  # the log was closed: the fleet is stopping
                pass
            if not found:
                lines.append(line)
                match = re.search(pattern, line)
                if match:
                    found.append(match)
                    done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout) or not found:
        raise CommandError(f"{what} did not start: {''.join(lines[-5:]).strip() or 'no output'}")
    return found[0]


def _append_log(path):
    """A fresh log file in append mode: the child writes one stream to it and our
    drain thread the other, and O_APPEND keeps them from overwriting each other."""
    path.write_text("")
    return open(path, "a")  # noqa: SIM115 - closed in Fleet.stop()


class Fleet:
    """The subprocesses of one measurement; stop() ends every one it started."""

    def __init__(self, env_for, log_dir):
        self.env_for = env_for  # (app name, **extra) -> environment
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.workers, self.servers, self.logs = [], [], []

    def start_worker(self, worker_id, concurrency, *, timeout=60, **extra):
        log_path = self.log_dir / f"{worker_id}.log"
        log = _append_log(log_path)
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_agents", "--concurrency", str(concurrency), "--worker-id", worker_id],
            cwd=ROOT, env=self.env_for(WORKER_APP, **extra), stdout=subprocess.PIPE, stderr=log, text=True,
        )
        self.workers.append(proc)
        self.logs.append((log_path, log))
        _wait_line(proc.stdout, r"ready", timeout, f"worker {worker_id}", log)
        return proc

    def start_server(self, *, timeout=60, **extra):
        """daphne on a free port of 127.0.0.1; returns (process, port)."""
        log_path = self.log_dir / f"server-{len(self.servers)}.log"
        log = _append_log(log_path)
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", "0", "dashboard.asgi:application"],
            cwd=ROOT, env=self.env_for(SERVER_APP, **extra), stdout=log, stderr=subprocess.PIPE, text=True,
        )
        self.servers.append(proc)
        self.logs.append((log_path, log))
        match = _wait_line(proc.stderr, r"Listening on TCP address [\d.]+:(\d+)", timeout, "daphne", log)
        return proc, int(match.group(1))

    @property
    def worker_logs(self):
        return [path for path, _ in self.logs if not path.name.startswith("server-")]

    def stop(self, *, graceful=False, timeout=30):
        procs = self.workers + self.servers
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        for proc in procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for _, log in self.logs:
            log.close()


def read_logs(paths):
    text = []
    for path in paths:
        try:
            text.append(Path(path).read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(text)


def cancel_paths(log_text, run_ids):
    """How each of `run_ids` learnt of its cancel, from the workers' settle lines."""
    wanted = {str(r) for r in run_ids}
    return Counter(m["via"] for m in SETTLED_CANCELLED.finditer(log_text) if m["id"] in wanted)


LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def connection_errors(log_text):
    """Log records (not traceback lines) that name a database connection failure."""
    return sum(1 for line in log_text.splitlines() if LOG_RECORD.match(line) and CONNECTION_ERRORS.search(line))


class Sampler:
    """A thread sampling, every `every_s`, the bench database's sessions by
    application and the live runs each worker holds; keeps the peaks and the series."""

    def __init__(self, db_name, every_s=0.2):
        self.db_name, self.every_s = db_name, every_s
        self.peak_sessions, self.peak_by_app = 0, Counter()
        self.live, self.peak_held = [], Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.every_s)
        finally:
            connection.close()

    def sample(self):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND pid <> pg_backend_pid() GROUP BY 1",
                [self.db_name],
            )
            by_app = dict(cursor.fetchall())
            cursor.execute(
                "SELECT worker, count(*) FROM runs_run WHERE status IN ('running', 'waiting_for_input', "
                "'waiting_for_approval') GROUP BY 1"
            )
            held = dict(cursor.fetchall())
        self.peak_sessions = max(self.peak_sessions, sum(by_app.values()))
        for app, count in by_app.items():
            self.peak_by_app[app] = max(self.peak_by_app[app], count)
        for worker, count in held.items():
            self.peak_held[worker] = max(self.peak_held[worker], count)
        self.live.append(sum(held.values()))
