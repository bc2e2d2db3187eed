"""Real-browser tests: Debian's Chromium driven by Playwright against a live daphne.

Run them in their own pytest process (`-m browser`, with DJANGO_ALLOW_ASYNC_UNSAFE=true
and HOME pointed at a temporary folder): Playwright's sync API keeps an event loop in
the test thread, which breaks asyncio tests sharing the process.

The server is the suite's `live_server_url` (a daphne subprocess); it does not share an
in-memory channel layer, so both sides use the Redis pub/sub layer (own prefix per session). The test process
plays the rest of the system from a `Fleet` thread with its own event loop: it calls
the transitions (which broadcast after commit), streams deltas, and acts as the worker
that hears a cancel and settles.
"""

import asyncio
import os
import threading
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connections

CHROMIUM = "/usr/bin/chromium"
# Every `expect` waits this long before it fails (Playwright's default is 5 s). A passing
# test is not slowed by it; on a loaded 2-core machine a live update can take seconds,
# and how fast it is belongs to the benchmarks, not to a pass/fail wait.
EXPECT_TIMEOUT_MS = 20_000
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REQUIRED = os.environ.get("REQUIRE_BROWSER", "0") == "1"
REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


@pytest.fixture(scope="session", autouse=True)
def _chromium_present():
    """Skip loudly without Chromium, or fail under REQUIRE_BROWSER=1 (CI)."""
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install -y chromium)"
        if REQUIRED:
            pytest.fail(f"REQUIRE_BROWSER=1 and {message}", pytrace=False)
        pytest.skip(f"!!! SKIPPING browser tests: {message}")


@pytest.fixture(scope="session", autouse=True)
def _generous_expect_timeout():
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1360, "height": 820}}


def _redis_reachable():
    import redis

    try:
        return redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        return False


@pytest.fixture(scope="session", autouse=True)
def _shared_layer():
    """Both sides on the Redis pub/sub layer (own prefix per session), set before the
    shared `live_server_url` (tests/conftest.py) starts its server with the same one."""
    from channels.layers import channel_layers

    if not _redis_reachable():
        message = f"Redis at {REDIS_URL} is not reachable; the browser tests need a shared channel layer"
        pytest.fail(message) if REQUIRED else pytest.skip("!!! SKIPPING browser tests: " + message)
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"rw_browser_{os.getpid()}"},
        }
    }
    channel_layers.backends.clear()


class Fleet:
    """The rest of the system, driven from a thread with its own event loop (the test
    thread has Playwright's loop, where async_to_sync cannot run)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=15):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args, **kwargs):
        """A sync function (a transition) in the fleet's database thread."""
        return self.run(database_sync_to_async(fn)(*args, **kwargs))

    def start(self, coro):
        """Run `coro` in the background; returns its concurrent future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self):
        self.run(database_sync_to_async(connections.close_all)())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def fleet(live_server_url, transactional_db):
    fleet = Fleet()
    yield fleet
    fleet.close()


@pytest.fixture
def screenshot_path(tmp_path):
    """docs/dashboard.png when RUNWARDEN_UPDATE_SCREENSHOT=1 (to refresh the README's
    picture), else a temporary file: a test run leaves the checkout as it found it."""
    if os.environ.get("RUNWARDEN_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        return SCREENSHOT
    return tmp_path / "dashboard.png"
