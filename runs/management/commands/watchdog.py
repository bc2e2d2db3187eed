"""`manage.py watchdog` — reap lost runs, enforce deadlines, retire ignored cancels."""

import asyncio
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from runs import watchdog


class Command(BaseCommand):
    help = "Every few seconds: flag stuck runs, reap lost ones, enforce deadlines."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one sweep, print it, exit")
        parser.add_argument("--interval", type=float, default=settings.RUNWARDEN_WATCHDOG_S)

    def handle(self, *args, once, interval, **options):
        if once:
            report = watchdog.sweep()
            self.stdout.write(
                f"stuck {report.stuck}, cancel not honoured {report.not_honoured}, "
                f"reaped {len(report.reaped)}, stopped at deadline {len(report.deadline_stopped)}, "
                f"retired {len(report.retired)}, waits expired {len(report.expired)}"
            )
            return
        asyncio.run(self._serve(interval))

    async def _serve(self, interval):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        self.stdout.write(f"watchdog: sweeping every {interval}s (Ctrl-C to stop)")
        await watchdog.serve(stop, interval_s=interval)
