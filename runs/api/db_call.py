"""Database calls from the API's async code (long-poll, events, the control socket)."""

import functools

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection


def db_call(fn):
    """`await db_call(fn)(...)`: run `fn` in the request's sync thread, then let go of
    that thread's connection as Django does at the end of a request (with
    CONN_MAX_AGE=0: close it), so a long-poll does not pin an idle connection for 30 s.

    Unlike channels' database_sync_to_async it does not close inside an atomic block
    (a test's transaction), and not before the call, so the key lookup's connection
    is reused by the call that follows it.
    """

    @functools.wraps(fn)
    def closing(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            if not connection.in_atomic_block:
                close_old_connections()

    return sync_to_async(closing)
