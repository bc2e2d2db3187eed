"""The control channel's long-poll: `GET /runs/{id}/control?wait=30`.

Returns 200 as soon as there is something to act on (a cancel is pending, an operator
answer is unacknowledged, the run ended, or this key no longer holds it) and 204 when
`wait` seconds pass quietly; 401 as soon as the key is revoked.
It waits on the run's control group of the channel layer — the same signal the
WebSocket and the built-in engine get — and re-reads the database on every wake-up
and every RECHECK_S, so a dropped or missing broadcast delays a cancel by at most
RECHECK_S instead of losing it (the database is the truth; the layer only wakes us).
"""

import asyncio
import logging

from channels.layers import get_channel_layer
from ninja import Query, Router, Status
from pydantic import BaseModel, Field

from runs import groups, messages
from runs.api import inflight
from runs.api.answers import answers_for
from runs.api.auth import run_for
from runs.api.db_call import db_call
from runs.api.errors import ApiError
from runs.api.revocation import key_group, still_active
from runs.api.schemas import ERRORS, ControlOut
from runs.api.serialize import cancel_info
from runs.models import Run

log = logging.getLogger("runs.api")
router = Router(tags=["worker"])
MAX_WAIT_S = 60.0
RECHECK_S = 5.0  # the fallback only; the layer wakes a poll at once
STATE_FIELDS = (
    "id", "status", "worker", "cancel_requested_at", "cancel_requested_by", "cancel_source", "cancel_note", "stop_reason",
)


class ControlQuery(BaseModel):
    wait: float = Field(30.0, ge=0, allow_inf_nan=False, description=f"seconds to wait; capped at {MAX_WAIT_S:g}")


def control_state(key, run_id):
    """(run, body, actionable): what the control channel says about the run now.
    ApiError 401 once the key is revoked (a long-poll outliving its key must end)."""
    if not still_active(key):
        raise ApiError(401, "this key was revoked")
    run = run_for(key, run_id, only=STATE_FIELDS)
    held = run.status in Run.LIVE and run.worker == key.worker
    answers = answers_for(key, run) if held else []
    body = {"cancel": cancel_info(run), "status": run.status, "held": held, "inputs": answers}
    actionable = (run.cancel_requested_at is not None or run.is_terminal or (run.status in Run.LIVE and not held)
                  or bool(answers))
    return run, body, actionable


@router.get("/runs/{run_id}/control", response={200: ControlOut, 204: None, **ERRORS}, summary="Wait for a cancel")
async def control(request, run_id: str, query: Query[ControlQuery]):
    """Long-poll for a cancel or an operator answer: 200 at once when one is pending
    (or the run ended, or is not held by this key), else as soon as one arrives; 204
    after `wait` seconds; 401 when the key is revoked meanwhile."""
    key = request.auth
    state = db_call(control_state)
    run, body, actionable = await state(key, run_id)
    wait = min(query.wait, MAX_WAIT_S)
    if actionable or wait == 0:
        return Status(200, body) if actionable else Status(204, None)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    waker = await _Waker.join(groups.control(run.pk), key_group(key.pk))
    try:
        while True:
            # Re-read after subscribing, then after every wake-up or RECHECK_S: a cancel
            # that landed before the subscription is seen here, not missed.
            _, body, actionable = await state(key, run_id)
            remaining = deadline - loop.time()
            if actionable:
                return Status(200, body)
            if remaining <= 0:
                return Status(204, None)
            message = await waker.wait(min(remaining, RECHECK_S))
            if message and message.get("type") == messages.RESYNC and message.get("reply_channel"):
                # A viewer asking for the in-flight text: this poll is in the control group.
                snapshot = await db_call(inflight.snapshot)(run.pk)
                if snapshot is not None:
                    await waker.layer.send(message["reply_channel"], snapshot)
    finally:
        await waker.leave()


class _Waker:
    """A channel-layer channel in a group; `wait` returns when a message arrives or
    after `timeout`. Without a working layer it only sleeps (the database re-check
    still finds the cancel)."""

    def __init__(self, layer, groups, channel):
        self.layer, self.groups, self.channel, self.receiving = layer, groups, channel, None

    @classmethod
    async def join(cls, *groups):
        layer = get_channel_layer()
        try:
            channel = await layer.new_channel("agent-control.")
            for group in groups:
                await layer.group_add(group, channel)
        except Exception:  # the slow path (database re-check) still works
            log.warning("control long-poll: channel layer unavailable; polling the database", exc_info=True)
            return cls(None, groups, None)
        return cls(layer, groups, channel)

    async def wait(self, timeout):
        """The message that woke us, or None after `timeout`."""
        if self.layer is None:
            await asyncio.sleep(timeout)
            return None
        if self.receiving is None:
            # One receive at a time, never cancelled mid-poll: cancelling a pub/sub
            # layer's receive unsubscribes the channel.
            self.receiving = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait([self.receiving], timeout=timeout)
        if not done:
            return None
        finished, self.receiving = self.receiving, None
        if finished.exception() is not None:
            log.warning("control long-poll: layer receive failed: %r", finished.exception())
            self.layer = None
            return None
        return finished.result()

    async def leave(self):
        if self.receiving is not None:
            self.receiving.cancel()
        if self.layer is not None:
            try:
                for group in self.groups:
                    await self.layer.group_discard(group, self.channel)
            except Exception:  # best effort: the channel goes with the connection anyway
                log.warning("control long-poll: group_discard failed", exc_info=True)
