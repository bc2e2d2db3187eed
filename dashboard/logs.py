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
