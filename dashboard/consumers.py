"""Live run pages over WebSocket: server-rendered fragments for htmx out-of-band swaps.

Both consumers are thin: check the viewer, join the group, `accept()` last, then send
what the page missed between its render and the socket. Database work happens in
`database_sync_to_async` helpers; state changes are coalesced so a row updates a few
times a second at most, however fast its run moves.

The detail consumer also follows the in-flight step. Deltas carry the step index and
the character offset where they start; the consumer knows how much of the step this
browser already shows, appends only what is new, drops duplicates, and when a delta
would leave a gap asks the worker for the whole in-flight text (`run.resync`), which
replaces the block. So a reconnecting browser sees no gap and no duplicated text.
"""

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict

from dashboard import accounts, fragments, listing, logs, runview
from runs import groups, messages, metrics

log = logging.getLogger(__name__)

LIST_INTERVAL_S = 0.25  # a list row updates at most four times a second
DETAIL_INTERVAL_S = 0.1
RESYNC_EVERY_S = 1.0
HEARTBEAT_REFRESH_S = 2.0  # heartbeats are not events; viewers re-read them on a clock
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# The channel layer is checked end to end: each socket sends itself a probe through it
# every PROBE_EVERY_S. No echo for STALE_AFTER_S: the page is told it may be missing
# updates; the first echo after that closes the socket with 1012 ("service restart"),
# which the page answers by reconnecting with its cursor, so it catches up from the
# database (the layer is best effort; the database is the truth).
PROBE_EVERY_S = 2.0
STALE_AFTER_S = 5.0
CLOSE_RESYNC = 1012


class Coalescer:
    """Collects keys and calls `flush(keys)` at most once per `interval` seconds."""

    def __init__(self, interval, flush):
        self.interval, self.flush = interval, flush
        self.pending, self.task, self.last = set(), None, 0.0

    def add(self, key):
        self.pending.add(key)
        if self.task is None:
            self.task = asyncio.ensure_future(self._drain())

    async def _drain(self):
        loop = asyncio.get_running_loop()
        try:
            while self.pending:
                wait = self.last + self.interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)  # the rate limit itself, not a wait for an event
                keys, self.pending = self.pending, set()
                self.last = loop.time()
                await self.flush(keys)
        except Exception:  # a failed render must not kill the socket silently
            log.exception("live update failed")
        finally:
            self.task = None

    def cancel(self):
        if self.task is not None:
            self.task.cancel()


@database_sync_to_async
def viewer_access(user):
    """Access for a logged-in user with `runs.view_run`, else None."""
    if not user.is_authenticated or not user.has_perm("runs.view_run"):
        return None
    return runview.Access.of(user)


@database_sync_to_async
def current_cursor(run_id):
    """(event seq, committed steps) of the run now, or None when it does not exist."""
    return runview.get_run_cursor(run_id)


changed_since = database_sync_to_async(listing.changed_since)


@database_sync_to_async
def render_update(run_id, access, *, after_seq, steps_known):
    """runview.render_update's answer and the run's retire clock, or None."""
    update = runview.render_update(run_id, access, after_seq=after_seq, steps_known=steps_known)
    return None if update is None else (*update, runview.retire_clock(update[3]))
heartbeat_cells = database_sync_to_async(runview.heartbeat_cells)


@database_sync_to_async
def render_rows(run_ids, access, filters, first_page):
    matching = listing.matching(filters, run_ids)
    return runview.render_rows(run_ids, access, insertable=matching if first_page else set(), matching=matching)


def query_of(scope):
    return QueryDict(scope.get("query_string", b"").decode("latin-1"))


def int_param(query, name):
    try:
        value = int(query.get(name, ""))
    except ValueError:
        return None
    return value if value >= 0 else None


class LiveConsumer(AsyncWebsocketConsumer):
    """Shared: refuse unknown viewers, ignore message types we do not render."""

    coalescer = None
    ticker = None
    counted = False

    async def accept(self, subprotocol=None, headers=None):
        await super().accept(subprotocol, headers)
        metrics.OPEN_WEBSOCKETS.labels(kind="viewer").inc()
        self.counted = True

    async def refuse(self, code):
        """Accept, then close with `code`: a close before the handshake is an HTTP 403
        that the browser reports as 1006 and htmx retries forever; a 4xxx close code
        reaches the page (which says why) and is not retried."""
        await AsyncWebsocketConsumer.accept(self)
        await self.close(code=code)

    async def dispatch(self, message):
        kind = message["type"]
        if kind == messages.PROGRESS and hasattr(self, "run_progress"):
            # The hot path (up to ten deltas a second per run) touches no database:
            # skip the thread hop Channels' dispatch makes for every message to close
            # stale database connections. Measured: about a fifth of the server's time.
            return await self.run_progress(message)
        # Another part of the system may add message types to the viewer groups; an
        # unknown type is ignored rather than killing the viewer's socket.
        if hasattr(self, kind.replace(".", "_")) or kind.startswith("websocket."):
            await super().dispatch(message)

    async def receive(self, text_data=None, bytes_data=None):
        """Viewers only listen; actions are POSTs with CSRF and permission checks."""

    async def join(self, *groups_):
        """Join the given groups and those that end this socket with its session."""
        session = self.scope.get("session")
        account = [accounts.user_group(self.scope["user"].pk)]
        if session is not None and session.session_key:
            account.append(accounts.session_group(session.session_key))
        self.joined = [*groups_, *account]
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)

    async def session_ended(self, message):
        """Logged out, made inactive or deleted: no more run data on this socket."""
        await self.close(code=CLOSE_FORBIDDEN)

    def start_ticker(self):
        self.ticker = asyncio.ensure_future(self.refresh_heartbeats())
        self.echoed_at, self.stale = asyncio.get_running_loop().time(), False
        self.prober = asyncio.ensure_future(self.probe_layer())

    async def probe_layer(self):
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PROBE_EVERY_S)  # a clock: the probe's echo is the event
            try:
                await asyncio.wait_for(self.channel_layer.send(self.channel_name, {"type": "layer.probe"}),
                                       PROBE_EVERY_S)
            except Exception:  # noqa: BLE001 - the layer is away; the missing echo says so below
                pass
            if not self.stale and loop.time() - self.echoed_at > STALE_AFTER_S:
                self.stale = True
                await self.send(text_data=fragments.live_state_stale())

    async def layer_probe(self, message):
        self.echoed_at = asyncio.get_running_loop().time()
        if self.stale:  # back: whatever was published meanwhile is lost to this socket
            await self.close(code=CLOSE_RESYNC)

    async def refresh_heartbeats(self):
        while True:
            await asyncio.sleep(HEARTBEAT_REFRESH_S)  # a clock, not a wait for an event
            try:
                parts = self.heartbeat_parts(await heartbeat_cells())
            except Exception:  # try again on the next tick
                log.exception("heartbeat refresh failed")
                continue
            if parts:
                await self.send(text_data=runview.upsert(parts))

    def heartbeat_parts(self, cells):
        return []

    async def disconnect(self, code):
        if self.counted:
            metrics.OPEN_WEBSOCKETS.labels(kind="viewer").dec()
            self.counted = False
        if self.coalescer is not None:
            self.coalescer.cancel()
        if self.ticker is not None:
            self.ticker.cancel()
        if getattr(self, "prober", None) is not None:
            self.prober.cancel()
        if getattr(self, "retire_timer", None) is not None:
            self.retire_timer.cancel()
        for group in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)


class RunListConsumer(LiveConsumer):
    """`/ws/runs/?<filters>&page=1&since=<event id>&oldest=&newest=`: row updates for the
    run list. `oldest`/`newest` are the list cursors of the page's last and first rows:
    the catch-up re-sends only runs that can be on that page, not older ones."""

    async def connect(self):
        self.access = await viewer_access(self.scope["user"])
        if self.access is None:
            return await self.refuse(CLOSE_FORBIDDEN)
        query = query_of(self.scope)
        self.filters = listing.Filters.from_query(query)
        self.first_page = query.get("page", "1") == "1"
        since = int_param(query, "since")
        bounds = {name: listing.decode_cursor(query.get(name, "")) for name in ("oldest", "newest")}
        self.coalescer = Coalescer(LIST_INTERVAL_S, self.flush)
        await self.join(groups.LIST_GROUP)
        logs.layer_answered()
        await self.accept()
        self.start_ticker()
        if since is not None:  # what changed between the page's render (or the last frame) and now
            for run_id in await changed_since(since, self.filters, self.first_page, **bounds):
                self.coalescer.add(str(run_id))

    async def run_changed(self, message):
        self.coalescer.add(message["run_id"])

    def heartbeat_parts(self, cells):
        return list(cells.values())

    async def flush(self, run_ids):
        html = await render_rows(run_ids, self.access, self.filters, self.first_page)
        await self.send(text_data=html)


class RunDetailConsumer(LiveConsumer):
    """`/ws/runs/<uuid>/?seq=&steps=&step=&offset=`: one run, live, from where the page is."""

    retire_timer = None
    retire_shown = False

    async def connect(self):
        self.run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        self.access = await viewer_access(self.scope["user"])
        if self.access is None:
            return await self.refuse(CLOSE_FORBIDDEN)
        cursor = await current_cursor(self.run_id)
        if cursor is None:
            return await self.refuse(CLOSE_NOT_FOUND)
        query = query_of(self.scope)
        seq, steps = int_param(query, "seq"), int_param(query, "steps")
        # Without a cursor the browser is taken to be current (a fresh render).
        self.seq = cursor.seq if seq is None else seq
        self.steps_known = cursor.steps if steps is None else steps
        self.terminal = cursor.terminal
        self.step = int_param(query, "step")
        self.length = int_param(query, "offset") or 0
        self.resync_asked = 0.0
        self.coalescer = Coalescer(DETAIL_INTERVAL_S, self.flush)
        await self.join(groups.viewers(self.run_id))
        logs.layer_answered()
        await self.accept()
        self.start_ticker()
        if (self.seq, self.steps_known) != (cursor.seq, cursor.steps):
            self.coalescer.add(self.run_id)
        self.follow_clock(cursor.clock)
        if not cursor.terminal:
            await self.ask_resync()

    def follow_clock(self, clock):
        """Retire is offered when a cancel has waited past its grace or the heartbeat
        went stale: a clock, not an event. Re-render the actions when it strikes."""
        self.retire_shown, due = clock
        if self.retire_timer is not None:
            self.retire_timer.cancel()
            self.retire_timer = None
        if due is not None and self.access.can_cancel:
            loop = asyncio.get_running_loop()
            self.retire_timer = loop.call_later(due + 0.05, self.coalescer.add, self.run_id)

    async def run_changed(self, message):
        self.coalescer.add(self.run_id)

    def heartbeat_parts(self, cells):
        cell = None if self.terminal else cells.get(self.run_id)
        if cell and runview.STUCK_MARK in cell and not self.retire_shown and self.access.can_cancel:
            self.coalescer.add(self.run_id)  # stuck now: the actions offer Retire
        return [cell] if cell else []

    async def flush(self, _keys):
        update = await render_update(self.run_id, self.access, after_seq=self.seq, steps_known=self.steps_known)
        if update is None:
            return
        html, self.seq, self.steps_known, run, clock = update
        self.follow_clock(clock)
        if run.is_terminal and not self.terminal:
            html += fragments.outcome_settled(run)
        self.terminal = run.is_terminal
        # Decided after the await: a delta of the next step may have arrived meanwhile,
        # and its text must not be wiped.
        if self.terminal or (self.step is not None and self.step < self.steps_known):
            html += fragments.inflight_block(self.steps_known, "", live=False)
            self.step, self.length = None, 0
        await self.send(text_data=html)

    async def run_progress(self, message):
        step, offset, text = message.get("step"), message.get("offset", 0), message.get("text", "")
        tools = message.get("tools")
        if self.terminal or not isinstance(step, int) or step < self.steps_known:
            return  # a late delta of a step that is committed (or discarded) already
        if message.get("resync") or step != self.step:
            if offset != 0:
                return await self.ask_resync()  # we would show the middle of a step
            self.step, self.length = step, len(text)
            return await self.send(text_data=fragments.inflight_block(step, text, tools=tools))
        if offset > self.length:
            return await self.ask_resync()  # a gap: some delta never reached us
        end = offset + len(text)
        if end <= self.length and not tools:
            return  # all of it is shown already
        fresh = text[self.length - offset:] if end > self.length else ""
        self.length = max(self.length, end)
        await self.send(text_data=fragments.inflight_append(fresh, tools=tools))

    async def ask_resync(self):
        """Ask whoever runs the run for the whole in-flight text, at most once a second."""
        now = time.monotonic()
        if now - self.resync_asked < RESYNC_EVERY_S:
            return
        self.resync_asked = now
        await self.channel_layer.group_send(
            groups.control(self.run_id), messages.resync(self.channel_name)
        )


class UnknownPath(AsyncWebsocketConsumer):
    """Any other `/ws/…` path: closed with 4404 and one log line (the router would
    answer 500 with a traceback)."""

    async def connect(self):
        log.warning("websocket: no route for %s", self.scope.get("path", "?"))
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
