"""A database outage answers 503 with Retry-After, never 500.

People get templates/503.html (rendered without the request: no user, no session, no
query); the agent API and /metrics get the API's JSON error, code
`database_unavailable`. Two ways in, because Django turns an exception into a response
at each layer: `process_exception` catches what a view raised (with DEBUG too), and
`server_error` (the project's handler500) catches what a middleware raised, such as
a session saved on the way out.

Logging is rate-limited: one warning when the database goes away, one when it is back
with how many requests were refused, nothing per request in between. "Back" is the first
new connection that opens (Django's `connection_created`), in servers and workers alike.

Async-capable: a sync-only middleware would run every async view (the agent API's
long-poll) through Django's one thread-sensitive thread.
"""

import json
import logging
import threading
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django import db
from django.http import HttpResponse
from django.template import loader
from django.views import defaults

log = logging.getLogger("dashboard.outage")
RETRY_AFTER_S = 5
JSON_PATHS = ("/api/", "/metrics")


def _errors():
    errors = [db.OperationalError, db.InterfaceError]
    try:  # the driver's own, when one escapes Django's wrapping (psycopg_pool's PoolTimeout is one)
        import psycopg

        errors += [psycopg.OperationalError, psycopg.InterfaceError]
    except ImportError:  # SQLite-only install
        pass
    return tuple(errors)


OUTAGE_ERRORS = _errors()


def is_outage(error):
    """Whether `error` (or what caused it) says the database cannot be reached."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, OUTAGE_ERRORS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class Outage:
    """The process's view of the database: up, or down since when and how many refused."""

    def __init__(self):
        self._lock = threading.Lock()
        self.down_since = None
        self.refused = 0

    def failed(self, error):
        with self._lock:
            self.refused += 1
            first = self.down_since is None
            if first:
                self.down_since = time.monotonic()
        if first:
            reason = " ".join(str(error).split()) or type(error).__name__
            log.warning("database unavailable (%s: %s): answering 503 until it is back",
                        type(error).__name__, reason[:300])

    def recovered(self, **_signal):
        if self.down_since is None:  # the common case: no lock, nothing to say
            return
        with self._lock:
            if self.down_since is None:
                return
            seconds, refused = time.monotonic() - self.down_since, self.refused
            self.down_since, self.refused = None, 0
        log.warning("database is back after %.1f s; %d request%s answered 503 meanwhile",
                    seconds, refused, "" if refused == 1 else "s")


outage = Outage()


def unavailable(request):
    """The 503 for `request`: JSON for the API and /metrics, the HTML page otherwise."""
    message = "the database is unavailable; try again shortly"
    if request.path.startswith(JSON_PATHS):
        from runs.api.errors import error_body

        response = HttpResponse(json.dumps(error_body(503, message, code="database_unavailable")),
                                status=503, content_type="application/json")
    else:
        # No request, so no context processors: nothing here touches the database.
        response = HttpResponse(loader.get_template("503.html").render({"retry_after": RETRY_AFTER_S}),
                                status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    response._has_been_logged = True  # Django's per-request "Service Unavailable" line: the outage logs once
    return response


def server_error(request, *args, **kwargs):
    """handler500: a database outage is a 503; anything else is Django's own 500."""
    import sys

    error = sys.exc_info()[1]
    if is_outage(error):
        outage.failed(error)
        return unavailable(request)
    return defaults.server_error(request, *args, **kwargs)


class DatabaseOutageMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        # Async: get_response returns a coroutine, which the caller awaits. The work is
        # in process_exception (Django calls it in either mode).
        return self.get_response(request)

    def process_exception(self, request, exception):
        if is_outage(exception):
            outage.failed(exception)
            return unavailable(request)
        return None
