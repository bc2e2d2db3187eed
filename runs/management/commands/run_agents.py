"""`manage.py run_agents [--concurrency N] [--worker-id ID] [--agents a,b]`

Claims queued runs and runs them until SIGTERM or SIGINT; then stops claiming, gives
running runs RUNWARDEN_SHUTDOWN_GRACE_S to finish and stops the rest at their next
checkpoint: they end failed / `worker_shutdown` (retryable). A SIGKILL leaves its runs
to the reaper (failed / `worker_lost`, retryable).
"""

import asyncio
import os
import signal
import socket

from django.core.management.base import BaseCommand, CommandError

from runs.agent.worker import Worker


class Command(BaseCommand):
    help = "Run agent workers: claim queued runs, heartbeat them, settle them."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=4, help="runs at once (default 4)")
        parser.add_argument("--worker-id", default="", help="default: host:pid")
        parser.add_argument("--agents", default="", help="comma-separated agent names to claim (default: scripted,openai)")

    def handle(self, *args, concurrency, worker_id, agents, **options):
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        names = [a.strip() for a in agents.split(",") if a.strip()] or None
        asyncio.run(self._serve(Worker(worker_id, concurrency=concurrency, agents=names)))

    async def _serve(self, worker):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        serving = asyncio.ensure_future(worker.serve(stop))
        await asyncio.wait({serving, asyncio.ensure_future(worker.ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        self.stdout.write(f"worker {worker.worker_id} ready", ending="\n")
        self.stdout.flush()
        await serving
