"""The control channel over WebSocket: `/ws/agent/runs/<id>/`.

The key comes in the handshake's `Authorization: Bearer <key>` header (agents are
not browsers: no cookie, no Origin, so this route sits outside the Origin check).
After the socket opens the server sends `{"type": "ready", "run_id", "status"}`, then
`{"type": "cancel", "source", "note"}` the moment a cancel is requested (or at once,
if one was pending before the socket opened) — once per connection. A refused
handshake is accepted, sent `{"type": "error", "error": {...}}`, and closed with
4401 (no valid key), 4403 (not this key's run) or 4404 (no such run).
The client may send `{"type": "ping"}`; the server answers `{"type": "pong"}`.
"""

import json

from channels.generic.websocket import AsyncWebsocketConsumer

from runs import groups, metrics
from runs.api.auth import find_key, token_from_header
from runs.api.control import control_state
from runs.api.db_call import db_call
from runs.api.errors import ApiError


def _authorize(authorization, run_id):
    key = find_key(token_from_header(authorization))
    if key is None:
        raise ApiError(401, "a valid key is required: Authorization: Bearer <key>")
    run, body, _ = control_state(key, run_id)
    return run.pk, body


class AgentControlConsumer(AsyncWebsocketConsumer):
    cancel_sent = False
    hard_sent = False
    group = None
    counted = False

    async def accept(self, subprotocol=None, headers=None):
        await super().accept(subprotocol, headers)
        metrics.OPEN_WEBSOCKETS.labels(kind="agent").inc()
        self.counted = True

    async def connect(self):
        headers = dict(self.scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        try:
            pk, _ = await db_call(_authorize)(authorization, run_id)
        except ApiError as error:
            await self.accept()
            await self.send(json.dumps(error.body()))
            await self.close(code=4000 + error.status)
            return
        self.group = groups.control(pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        # Read again after joining: a cancel requested in between is sent below, not lost.
        _, state = await db_call(_authorize)(authorization, run_id)
        await self.accept()
        await self.send(json.dumps({"type": "ready", "run_id": str(pk), "status": state["status"]}))
        if state["cancel"] is not None:
            await self._send_cancel(state["cancel"]["source"], state["cancel"]["note"])

    async def disconnect(self, code):
        if self.counted:
            metrics.OPEN_WEBSOCKETS.labels(kind="agent").dec()
            self.counted = False
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "null")
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "ping":
            await self.send(json.dumps({"type": "pong"}))

    async def run_cancel(self, message):
        """From `runs.broadcast`: a cancel request or a retire of this run, or the
        watchdog's escalation of a cancel not honoured (`hard`: stop now)."""
        if message.get("hard"):
            if not self.hard_sent:  # an escalation, not a second cancel: once too
                self.hard_sent = self.cancel_sent = True
                await self.send(json.dumps({"type": "cancel", "hard": True, "source": "watchdog",
                                            "note": "cancel not honoured: stop now"}))
            return
        await self._send_cancel(message.get("source", ""), message.get("note", ""))

    async def _send_cancel(self, source, note):
        if self.cancel_sent:
            return  # a cancel is one-shot: a retire after a request is not a second one
        self.cancel_sent = True
        await self.send(json.dumps({"type": "cancel", "source": source or "", "note": note or ""}))
