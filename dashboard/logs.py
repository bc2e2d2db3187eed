"""Logging helpers: expected refusals are one line, not a traceback.

A request with a Host not in ALLOWED_HOSTS, or any other SuspiciousOperation, is logged
by Django at ERROR with the exception's traceback; it is a refusal the server handled
(a 400), not a bug, so the line keeps its message and loses the traceback, at WARNING.
"""

import logging

REFUSAL_LOGGERS = ("django.security.",)


class ExpectedRefusals(logging.Filter):
    def filter(self, record):
        if record.name.startswith(REFUSAL_LOGGERS):
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# --- the channel layer (Redis) going away --------------------------------------------
#
# With Redis down every socket's connect, every reconnect and the layer's own receive
# task fail, each logged with its traceback by whoever caught it (channels_redis, daphne,
# our consumers): about 60 lines a second. An operator needs to read three: it went away
# (once), it is still away (a count every REPORT_S), it is back (once, at the first layer
# operation that works again: see `layer_answered`).

REPORT_S = 30.0


def _is_layer_error(exc_info):
    """True when the record's exception (or one it was raised from) is Redis refusing or
    dropping a connection: the layer is away, not a bug."""
    import redis.exceptions

    error = exc_info[1] if exc_info else None
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class LayerOutage(logging.Filter):
    """Collapses the tracebacks of a channel-layer outage into one line down, a count
    every REPORT_S, and one line back. State is per process, as the outage is seen."""

    down_since = None
    suppressed = 0
    reported_at = 0.0

    def filter(self, record):
        if not record.exc_info or not _is_layer_error(record.exc_info):
            return True
        import time

        now = time.monotonic()
        error = record.exc_info[1]
        cls = LayerOutage
        if cls.down_since is None:
            cls.down_since, cls.reported_at, cls.suppressed = now, now, 0
            message = (f"channel layer (Redis) unavailable: {type(error).__name__}: {error}; live pages "
                       "pause, cancels reach workers by heartbeat")
        elif now - cls.reported_at >= REPORT_S:
            message = (f"channel layer (Redis) still unavailable after {now - cls.down_since:.0f} s; "
                       f"{cls.suppressed} error(s) since the last report")
            cls.reported_at, cls.suppressed = now, 0
        else:
            cls.suppressed += 1
            return False
        record.msg, record.args = message, ()
        record.exc_info = record.exc_text = record.stack_info = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def layer_answered():
    """A channel-layer operation just worked: if an outage was being reported, say it
    is over (once)."""
    import time

    cls = LayerOutage
    if cls.down_since is None:
        return
    took, suppressed = time.monotonic() - cls.down_since, cls.suppressed
    cls.down_since, cls.suppressed = None, 0
    logging.getLogger("dashboard.layer").warning(
        "channel layer (Redis) answering again after %.1f s; %d more error(s) meanwhile", took, suppressed
    )
