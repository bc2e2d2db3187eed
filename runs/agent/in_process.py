"""Workers, the watchdog (and the demo feeder) inside the server process: the embedded default.

`start()` must be called from code running on the server's event loop (e.g. the ASGI
application's first call). It is idempotent and returns the stop event; setting it
runs the worker's shutdown (grace, then cancel as `shutdown`).
"""

import asyncio
import logging
import os
import socket

from django.conf import settings

from runs import watchdog
from runs.agent import demo
from runs.agent.worker import Worker

log = logging.getLogger(__name__)
_running = {}


def start(*, concurrency=None, with_demo=None):
    loop = asyncio.get_running_loop()
    if loop in _running:
        return _running[loop]
    stop = asyncio.Event()
    worker = Worker(
        f"embedded-{socket.gethostname()}:{os.getpid()}",
        concurrency=concurrency or settings.RUNWARDEN_EMBEDDED_CONCURRENCY,
    )
    # The watchdog too: on the embedded default nothing else would reap lost runs.
    tasks = [asyncio.ensure_future(worker.serve(stop)), asyncio.ensure_future(watchdog.serve(stop))]
    if settings.RUNWARDEN_DEMO if with_demo is None else with_demo:
        tasks.append(asyncio.ensure_future(demo.feed(stop)))
    for task in tasks:
        task.add_done_callback(_report)
    _running[loop] = stop
    log.info("embedded worker %s started", worker.worker_id)
    return stop


def _report(task):
    if not task.cancelled() and task.exception() is not None:
        log.error("embedded task failed", exc_info=task.exception())
