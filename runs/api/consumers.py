"""The control channel over WebSocket: `/ws/agent/runs/<id>/`.

The key comes in the handshake's `Authorization: Bearer <key>` header (agents are
not browsers: no cookie, no Origin, so this route sits outside the Origin check), or
as a one-use ticket (`?ticket=`, or the subprotocol `ticket.<ticket>`; `runwarden.api.tickets`).
After the socket opens the server sends `{"type": "ready", "run_id", "status"}`, then
`{"type": "cancel", "source", "note"}` the moment a cancel is requested (or at once,
if one was pending before the socket opened) — once per connection; a guardrail's
stop instead is `{"type": "stop", "reason": "budget_exhausted"|"policy_denied",
"source", "note"}`: stop at the same checkpoint and settle with that reason — and
`{"type": "input", "input": {…}}` for each operator answer not yet acknowledged.
A refused handshake is accepted, sent `{"type": "error", "error": {...}}`, and closed
with 4401 (no valid key or ticket; a key revoked later too), 4403 or 4404.
The client may send `{"type": "ping"}` (answered `{"type": "pong"}`) and
`{"type": "ack", "id"}` (answered `{"type": "acked", "id"}`).

The run's control group is shared with the rest of Runwarden: a viewer's
`run.resync` is answered from the server-side in-flight text, and any other message
type is ignored — a message this consumer does not know must never close the socket.
"""

import json
import logging

from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.serializers.json import DjangoJSONEncoder

from runs import groups, metrics
from runs.api import inflight, tickets
from runs.api.answers import answers_for
from runs.api.auth import find_key, token_from_header
from runs.api.control import control_state
from runs.api.db_call import db_call
from runs.api.errors import ApiError, error_body
from runs.api.revocation import key_group, still_active
from runs.models import Run
from runs.transitions import parse_id
from runs.transitions.inputs import ack_answer

log = logging.getLogger("runs.api")


def _authorize(authorization, ticket, run_id):
    """(key, run pk): the header's key, else the ticket's (spent here). ApiError else."""
    if authorization or ticket is None:
        key = find_key(token_from_header(authorization))
        if key is None:
            raise ApiError(401, "a valid key is required: Authorization: Bearer <key>, or ?ticket=")
    else:
        key = tickets.redeem(ticket, parse_id(run_id))
        if key is None:
            raise ApiError(401, "the ticket is unknown, used, expired or for another run: "
                                "ask POST /api/v1/runs/{id}/ticket for a new one", code="bad_ticket")
    run, _, _ = control_state(key, run_id)
    return key, run.pk


def _answers(key, run_pk):
    run = Run.objects.only("id", "worker").get(pk=run_pk)
    return answers_for(key, run)


def _ack(key, run_pk, input_id):
    if not Run.objects.filter(pk=run_pk, worker=key.worker).exists():
        return False
    found, _ = ack_answer(run_pk, input_id)
    return found


def dumps(body):
    return json.dumps(body, cls=DjangoJSONEncoder)


class AgentControlConsumer(AsyncWebsocketConsumer):
    cancel_sent = False
    hard_sent = False
    joined = ()
    counted = False
    key = run_pk = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._uncount()  # however the socket ended, the gauge counts live ones only

    async def dispatch(self, message):
        try:
            known = getattr(self, self._handler_name(message), None) is not None
        except ValueError:
            known = False
        if not known:
            log.debug("agent control socket: ignoring %r", message.get("type"))
            return
        await super().dispatch(message)

    @staticmethod
    def _handler_name(message):
        from channels.consumer import get_handler_name

        return get_handler_name(message)

    async def accept(self, subprotocol=None, headers=None):
        await super().accept(subprotocol, headers)
        metrics.OPEN_WEBSOCKETS.labels(kind="agent").inc()
        self.counted = True

    def _uncount(self):
        if self.counted:
            metrics.OPEN_WEBSOCKETS.labels(kind="agent").dec()
            self.counted = False

    async def connect(self):
        headers = dict(self.scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        ticket, subprotocol = tickets.from_scope(self.scope)
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        self.sent_answers = set()
        try:
            self.key, self.run_pk = await db_call(_authorize)(authorization, ticket, run_id)
        except ApiError as error:
            await self.refuse(error, subprotocol)
            return
        self.joined = (groups.control(self.run_pk), key_group(self.key.pk))
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        # Read again after joining: a cancel requested in between is sent below, not lost.
        _, state, _ = await db_call(control_state)(self.key, run_id)
        await self.accept(subprotocol)
        await self.send(dumps({"type": "ready", "run_id": str(self.run_pk), "status": state["status"]}))
        if state["cancel"] is not None:
            cancel = state["cancel"]
            await self._send_cancel(cancel["source"], cancel["note"], stop=cancel["stop_reason"])
        await self.send_answers()

    async def refuse(self, error, subprotocol=None):
        if not self.counted:
            await self.accept(subprotocol)
        await self.send(dumps({"type": "error", **error.body()}))
        await self.close(code=4000 + error.status)

    async def disconnect(self, code):
        self._uncount()
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = ()

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "null")
        except ValueError:
            message = None
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "ping":
            # The revocation message is the fast path; a ping re-reads the key in case it was lost.
            if not await db_call(still_active)(self.key):
                return await self.refuse(ApiError(401, "this key was revoked"))
            await self.send(dumps({"type": "pong"}))
        elif kind == "ack" and isinstance(message.get("id"), int) and not isinstance(message["id"], bool):
            if await db_call(_ack)(self.key, self.run_pk, message["id"]):
                await self.send(dumps({"type": "acked", "id": message["id"]}))
            else:
                await self.send(dumps({"type": "error", **error_body(
                    404, f"no answer {message['id']} for this key on this run", code="input_not_found")}))
        else:
            await self.send(dumps({"type": "error", **error_body(
                400, "send {\"type\": \"ping\"} or {\"type\": \"ack\", \"id\": N}", code="unknown_message")}))

    async def send_answers(self):
        """Every unacknowledged answer this connection has not sent yet, in order."""
        for answer in await db_call(_answers)(self.key, self.run_pk):
            if answer["id"] not in self.sent_answers:
                self.sent_answers.add(answer["id"])
                await self.send(dumps({"type": "input", "input": answer}))

    async def run_answered(self, message):
        """From `runs.broadcast`: an operator answered the run (it was resumed)."""
        await self.send_answers()

    async def run_resync(self, message):
        """A viewer joined mid-step (or saw a gap): send it the whole in-flight text."""
        reply = message.get("reply_channel")
        if not reply:
            return
        snapshot = await db_call(inflight.snapshot)(self.run_pk)
        if snapshot is not None:
            await self.channel_layer.send(reply, snapshot)

    async def key_revoked(self, message):
        await self.refuse(ApiError(401, "this key was revoked"))

    async def run_cancel(self, message):
        """From `runs.broadcast`: a cancel request or a retire of this run, or the
        watchdog's escalation of a cancel not honoured (`hard`: stop now)."""
        if message.get("hard"):
            if not self.hard_sent:  # an escalation, not a second cancel: once too
                self.hard_sent = self.cancel_sent = True
                await self.send(dumps({"type": "cancel", "hard": True, "source": "watchdog",
                                       "note": "cancel not honoured: stop now"}))
            return
        await self._send_cancel(message.get("source", ""), message.get("note", ""), stop=message.get("stop"))

    async def _send_cancel(self, source, note, stop=None):
        if self.cancel_sent:
            return  # a cancel is one-shot: a retire after a request is not a second one
        self.cancel_sent = True
        if stop:  # a guardrail's stop: end with its reason (a cancelled settle is recorded so too)
            await self.send(dumps({"type": "stop", "reason": stop, "source": source or "", "note": note or ""}))
            return
        await self.send(dumps({"type": "cancel", "source": source or "", "note": note or ""}))
