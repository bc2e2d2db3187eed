"""`manage.py bench_list --runs 1000000` — server time of the list, triage and overview
pages at a million runs, on PostgreSQL. Prints one JSON line.

It builds its own throwaway database (Django's test-database machinery, so the real
one is never touched), fills it with generate_series, measures each page through the
full Django stack (middleware, templates, queries) and drops the database again.
"""

import json
import statistics
import time

from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test import Client

from runs import overview

PAGES = {
    "list": "/",
    "list_status": "/?status=failed",
    "list_reason": "/?reason=worker_lost",
    "list_agent": "/?agent=agent-7",
    "list_search": "/?q=bench+run+123457",
    "triage": "/triage/",
    "overview": "/overview/",
    "overview_1h": "/overview/?window=1h",
    "overview_7d": "/overview/?window=7d",
}
# The overview memoises each window for a fraction of its bucket; these are also
# measured with the memo emptied before every request (what the first viewer pays).
COLD = ("overview", "overview_7d")
LIVE = 500  # only the newest runs are live, as in a real fleet
TERMINAL_SHAPES = [("completed", "completed")] * 12 + [
    ("completed", "max_iterations"), ("completed", "budget_exhausted"), ("failed", "provider_failed"),
    ("failed", "worker_lost"), ("failed", "policy_denied"), ("cancelled", "cancelled"),
    ("cancelled", "cancelled"), ("failed", "approval_denied"),
]
LIVE_SHAPES = [("running", "")] * 6 + [("queued", ""), ("waiting_for_approval", ""), ("waiting_for_input", "")]

FILL = """
INSERT INTO runs_run (id, agent, title, input, status, termination_reason, truncated, error_class,
    error_message, created_at, started_at, finished_at, heartbeat_at, cancel_requested_at,
    cancel_requested_by, cancel_source, cancel_note, worker, tokens_in, tokens_out, cost, steps,
    tool_calls, event_seq)
SELECT gen_random_uuid(), 'agent-' || (i %% 20), 'bench run ' || i, '{{}}'::jsonb, s.status, s.reason,
    s.reason IN ('max_iterations', 'budget_exhausted'), '', '',
    now() - i * interval '2.5 seconds',
    CASE WHEN s.status <> 'queued' THEN now() - i * interval '2.5 seconds' + interval '1 second' END,
    CASE WHEN s.reason <> '' THEN now() - i * interval '2.5 seconds' + interval '40 seconds' END,
    CASE WHEN s.status <> 'queued' THEN now() - (i %% 7) * interval '1 second' END,
    CASE WHEN s.status = 'cancelled' THEN now() - i * interval '2.5 seconds' + interval '39.99 seconds' END,
    '', CASE WHEN s.status = 'cancelled' THEN 'dashboard' ELSE '' END, '',
    CASE WHEN s.status <> 'queued' THEN 'bench-worker' ELSE '' END,
    i %% 5000, i %% 7000, 0, i %% 20, i %% 5, 0
FROM generate_series(%s, %s) AS i
JOIN (VALUES {shapes}) AS s(k, status, reason)
  ON s.k = CASE WHEN i <= {live} THEN {terminal} + i %% {nlive} ELSE i %% {terminal} END
"""


class Command(BaseCommand):
    help = "p95 server time of list/triage/overview pages at N runs (PostgreSQL). One JSON line."

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=1_000_000)
        parser.add_argument("--repeat", type=int, default=40)
        parser.add_argument("--keep", action="store_true", help="keep the bench database for another run")

    def handle(self, *args, runs, repeat, keep, **options):
        if connection.vendor != "postgresql":
            raise CommandError("bench_list needs PostgreSQL: set DATABASE_URL=postgres://…")
        settings.DEBUG = False  # no query log growing in memory
        real_name = connection.settings_dict["NAME"]
        connection.settings_dict.setdefault("TEST", {})["NAME"] = f"{real_name}_bench_list"
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=keep)
        try:
            started = time.perf_counter()
            if not keep or not _filled(runs):
                self._fill(runs)
            fill_s = time.perf_counter() - started
            result = {"runs": runs, "fill_s": round(fill_s, 1), **self._measure(repeat)}
        finally:
            connection.creation.destroy_test_db(real_name, verbosity=0, keepdb=keep)
        self.stdout.write(json.dumps(result))

    def _fill(self, runs):
        shapes = TERMINAL_SHAPES + LIVE_SHAPES
        values = ", ".join(f"({k}, '{status}', '{reason}')" for k, (status, reason) in enumerate(shapes))
        sql = FILL.format(shapes=values, live=LIVE, terminal=len(TERMINAL_SHAPES), nlive=len(LIVE_SHAPES))
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE runs_run CASCADE")
            for start in range(1, runs + 1, 100_000):
                cursor.execute(sql, [start, min(start + 99_999, runs)])
            # As autovacuum leaves a real table: the visibility map set, so index-only
            # scans (the overview's covering index) need not visit the heap. (Django's
            # autocommit: VACUUM runs outside any transaction block.)
            cursor.execute("VACUUM ANALYZE runs_run")

    def _measure(self, repeat):
        user, _ = User.objects.get_or_create(username="bench")
        user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "cancel_run"]))
        host = next((h for h in settings.ALLOWED_HOSTS if h not in ("*", "") and not h.startswith(".")), "localhost")
        client = Client(HTTP_HOST=host)
        client.force_login(user)
        p95, p50 = {}, {}
        runs_of = [(name, url, False) for name, url in PAGES.items()] + [(f"{n}_cold", PAGES[n], True) for n in COLD]
        for name, url, cold in runs_of:
            timings = []
            for i in range(repeat + 3):
                if cold:
                    overview._memo.clear()
                t0 = time.perf_counter()
                response = client.get(url)
                elapsed = (time.perf_counter() - t0) * 1000
                if response.status_code != 200:
                    raise CommandError(f"{url} answered {response.status_code}")
                if i >= 3:  # the first few warm caches and connections
                    timings.append(elapsed)
            timings.sort()
            p95[name] = round(timings[max(int(len(timings) * 0.95) - 1, 0)], 1)
            p50[name] = round(statistics.median(timings), 1)
        return {"p95_ms": p95, "p50_ms": p50, "worst_p95_ms": max(p95.values())}


def _filled(runs):
    from runs.models import Run

    return Run.objects.count() == runs
