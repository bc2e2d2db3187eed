"""The embedded default: agent workers and the demo feeder inside the server process.

`make run` sets RUNWARDEN_EMBEDDED=1. Daphne does not speak the ASGI lifespan protocol,
so this wrapper starts the engine (`runs.agent.in_process.start`) on the first scope it
sees, i.e. on the server's own event loop: the in-memory channel layer is not safe
across loops or threads, and this way the worker's deltas and the viewers' sockets
share one. On shutdown (a Twisted "before shutdown" trigger) the worker is told to
stop and given its grace period to settle or cancel its runs.
"""

import asyncio
import logging

from django.conf import settings

log = logging.getLogger(__name__)


class EmbeddedWorkers:
    """ASGI middleware: start the embedded engine once, then pass every scope through."""

    def __init__(self, app):
        self.app = app
        self.stop = None
        self.started = False

    async def __call__(self, scope, receive, send):
        if not self.started:
            self.started = True
            self.start()
        return await self.app(scope, receive, send)

    def start(self):
        try:
            from runs.agent import in_process as engine
        except ImportError as error:  # the dashboard works without the engine
            log.warning("embedded workers not started: %s", error)
            return
        self.stop = engine.start()
        self._on_shutdown()

    def _on_shutdown(self):
        try:
            from twisted.internet import defer, reactor
        except ImportError:  # another ASGI server: it stops the loop itself
            return
        reactor.addSystemEventTrigger(
            "before", "shutdown", lambda: defer.Deferred.fromFuture(asyncio.ensure_future(self.shutdown()))
        )

    async def shutdown(self):
        """Set the stop event and wait (bounded) for the worker to wind its runs down."""
        if self.stop is None:
            return
        others = asyncio.all_tasks() - {asyncio.current_task()}
        self.stop.set()
        log.info("stopping embedded workers")
        if others:
            await asyncio.wait(others, timeout=settings.RUNWARDEN_SHUTDOWN_GRACE_S + 5)
