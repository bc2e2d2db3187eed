"""The asyncio client: `AsyncClient` and its `AsyncRun`, the twin of `sync.py`.

Same verbs, awaited. One thing more: a cancel interrupts the task that entered
`async with run` (`interrupt=True`, the default), so an agent stops at its very next
await — a model call, a tool, a sleep — not only at its next checkpoint. The
`CancelledError` that raises is turned back into a settled `cancelled` run on the way out
(a guardrail's stop, `Stopped`, into the stop's ending: completed/budget_exhausted or
failed/policy_denied).
"""

import asyncio
import time
import uuid

import httpx

from runwarden_client import _common as c
from runwarden_client._common import Cancelled, RunwardenError


class AsyncClient:
    """See `runwarden_client.Client`; every call is a coroutine."""

    def __init__(self, url, key, *, timeout=30.0, retry_for_s=30.0, flush_s=c.DEFAULT_FLUSH_S,
                 max_chars=c.DEFAULT_MAX_CHARS, heartbeat_s=c.DEFAULT_HEARTBEAT_S, poll_s=30.0, **httpx_options):
        self.http = httpx.AsyncClient(base_url=url.rstrip("/") + "/api/v1", timeout=timeout,
                                      headers={"Authorization": f"Bearer {key}"}, **httpx_options)
        self.retry_for_s, self.poll_s = retry_for_s, poll_s
        self.flush_s, self.max_chars, self.heartbeat_s = flush_s, max_chars, heartbeat_s

    async def request(self, method, path, body=None, *, idempotency_key=None, params=None, timeout=None,
                      expect=(200, 201)):
        """(status, JSON body or None); see `Client.request`."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        deadline, attempt = time.monotonic() + self.retry_for_s, 0
        while True:
            try:
                response = await self.http.request(method, path, json=body, params=params, headers=headers,
                                                   timeout=timeout or httpx.USE_CLIENT_DEFAULT)
            except httpx.TransportError as error:
                failure = RunwardenError(0, "unreachable", str(error) or type(error).__name__)
            else:
                payload = c.json_of(response)
                if response.status_code in (*expect, 204, 409):
                    return response.status_code, payload
                failure = RunwardenError.from_response(response.status_code, payload)
                if response.status_code not in c.RETRY_STATUSES:
                    raise failure
            if time.monotonic() + c.backoff(attempt) > deadline:
                raise failure
            await asyncio.sleep(c.backoff(attempt))
            attempt += 1

    async def run(self, agent, title="", input=None, *, interrupt=True, **limits):
        """Create a run of `agent` and claim it: an `AsyncRun` for `async with`."""
        body = {"agent": agent, "title": title, "input": input or {}, "claim": True, **limits}
        _, data = await self.request("POST", "/runs", body, idempotency_key=f"create-{uuid.uuid4()}")
        return AsyncRun(self, data, interrupt=interrupt)

    async def claim(self, agents, *, interrupt=True):
        status, data = await self.request("POST", "/runs/claim", {"agents": list(agents)},
                                          idempotency_key=f"claim-{uuid.uuid4()}")
        return None if status == 204 else AsyncRun(self, data, interrupt=interrupt)

    async def aclose(self):
        await self.http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


class AsyncRun:
    """See `runwarden_client.Run`; `async with run:` settles it the same ways."""

    def __init__(self, client, data, *, interrupt=True):
        self.client, self.data, self.id, self.input = client, data, data["id"], data.get("input") or {}
        self.interrupt = interrupt
        self.signal = c.Signal()
        self.state = c.StepState(index=(data.get("totals") or {}).get("steps", 0))
        self.settled = None
        self.answers = asyncio.Queue()
        self._seen_answers = set()
        self._stopped = asyncio.Event()
        self._send = asyncio.Lock()
        self._last_contact = time.monotonic()
        self._tasks = []
        self._body = None  # the task inside `async with`, interrupted by a cancel
        self._interrupted = False

    # --- the agent's verbs ------------------------------------------------------------

    def checkpoint(self):
        """Raise `Cancelled` if a cancel (or the loss of the run) has been heard."""
        if self.signal:
            self.signal.delivered = True
            raise self.signal.reason

    def stream(self, text):
        """A fragment of the step in flight (batched: sent within `flush_s`). Not a
        coroutine: a model stream's loop calls it per token."""
        self.checkpoint()
        self.state.delta(text)

    def usage(self, tokens_in=0, tokens_out=0, cost=0, *, estimated=False):
        self.state.add_usage(tokens_in, tokens_out, cost, estimated)

    def tool_started(self, name, args=None, call_id=None):
        """Show a tool call starting (for frameworks that run tools themselves); its id."""
        self.checkpoint()
        call_id = call_id or c.new_call_id()
        self.state.tool_event(call_id, name, "started", args=args)
        return call_id

    def tool_finished(self, call_id, name, args=None, *, result=None, error=None):
        """Record a finished tool call of the step in flight (committed with the step)."""
        outcome = {"error": error} if error is not None else {"result": result}
        self.state.tool_calls.append({"id": call_id, "name": name, "args": args, **outcome})
        self.state.tool_event(call_id, name, "failed" if error is not None else "finished", **outcome)
        self.checkpoint()

    async def call_tool(self, name, fn, /, **args):
        """Await `fn(**args)` (a coroutine function or a plain one) as tool call `name`."""
        call_id = self.tool_started(name, args)
        try:
            result = fn(**args)
            if asyncio.iscoroutine(result):
                result = await result
        except (asyncio.CancelledError, Cancelled):
            raise
        except Exception as error:
            self.tool_finished(call_id, name, args, error=f"{type(error).__name__}: {error}"[:2000])
            return None
        self.tool_finished(call_id, name, args, result=result)
        return result

    async def step(self, text=None, *, kind=None, tokens_in=0, tokens_out=0, cost=0):
        """Commit the step in flight whole; returns its index."""
        self.checkpoint()
        async with self._send:
            await self._flush_locked()
            body = self.state.step_body(kind, text, tokens_in, tokens_out, cost)
            status, answer = await self.client.request("POST", f"/runs/{self.id}/steps", body,
                                                       idempotency_key=f"{self.id}-step-{body['index']}")
            if status == 409:
                self._conflict(answer)
            self.state.reset(body["index"] + 1)
        self._last_contact = time.monotonic()
        return body["index"]

    async def wait_for_approval(self, tool, args=None, *, call_id=None, message=""):
        """Ask an operator to approve tool call `tool`; True when approved, False when denied."""
        request = {"kind": "approval", "tool": tool, "args": args, "call_id": call_id or c.new_call_id(),
                   "message": message}
        return bool((await self._wait("waiting_for_approval", request)).get("approved"))

    async def wait_for_input(self, prompt):
        return (await self._wait("waiting_for_input", {"kind": "input", "prompt": prompt})).get("text", "")

    async def settle(self, status, reason, **fields):
        if self.settled is None:
            _, self.settled = await self.client.request("POST", f"/runs/{self.id}/settle",
                                                        {"status": status, "reason": reason, **fields},
                                                        idempotency_key=f"{self.id}-settle")
        return self.settled

    # --- context manager --------------------------------------------------------------

    async def __aenter__(self):
        self._body = asyncio.current_task()
        self._tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._control())]
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if self._interrupted and isinstance(exc, asyncio.CancelledError | Cancelled):
            self._body.uncancel()  # our own interruption, not the caller's: it ends here
            exc = self.signal.reason
        elif exc is None and self.signal.delivered:
            exc = self.signal.reason
        try:
            if exc is None:
                await self._finish_completed()
            elif isinstance(exc, Cancelled):  # a Stopped too: it settles as the stop says
                await self._discard("cancelled")
                await self._settle_stopped(exc)
                return True
            elif isinstance(exc, asyncio.CancelledError):  # the caller cancelled us: a shutdown
                await self._discard("failed")
                await self.settle("failed", "worker_shutdown", error_class="CancelledError",
                                  error_message="the agent's task was cancelled")
            else:
                reason, error_class, message = c.failure_of(exc)
                await self._discard("failed")
                await self.settle("failed", reason, error_class=error_class, error_message=message)
        finally:
            self._stopped.set()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        return False

    async def _finish_completed(self):
        try:
            if self.state.text or self.state.tool_calls:
                await self.step()
            await self.settle("completed", "completed")
        except Cancelled as late:
            await self._discard("cancelled")
            await self._settle_stopped(late)

    async def _settle_stopped(self, cancel):
        """Settle after `cancel`: cancelled, or a `Stopped`'s own ending (completed/
        budget_exhausted truncated, failed/policy_denied)."""
        status, reason, fields = c.ending_of(cancel)
        await self.settle(status, reason, **fields)

    # --- plumbing ---------------------------------------------------------------------

    def _stop(self, source="", note="", **how):
        if self.signal.set(source, note, **how) and self.interrupt and self._body is not None:
            if not self._body.done() and self.settled is None:
                self._interrupted = True
                self._body.cancel()

    def _conflict(self, answer):
        code = ((answer or {}).get("error") or {}).get("code", "conflict")
        if code == "cancel_requested":
            stop = (answer or {}).get("stop_reason")
            self._stop("server", c.pending_note(stop), stop=stop)
        elif code in ("run_ended", "not_held", "not_claimed"):
            self._stop("server", f"the run is no longer ours ({code})", lost=True)
        else:
            raise RunwardenError.from_response(409, answer)
        self.checkpoint()

    async def _discard(self, reason):
        self.state.pending = []
        if not self.state.in_flight():
            return
        body = self.state.discard_body(reason)
        try:
            await self.client.request("POST", f"/runs/{self.id}/discard", body,
                                      idempotency_key=f"{self.id}-discard-{body['index']}")
        except RunwardenError:
            pass  # the settle still says how it ended; the trace is best effort

    async def _flush_locked(self):
        while self.state.pending:
            status, answer = await self.client.request("POST", f"/runs/{self.id}/events",
                                                       {"events": self.state.take_events()})
            self._last_contact = time.monotonic()
            if status == 409:
                self._conflict(answer)
            if answer and answer.get("cancel_requested"):
                self._stop("server", c.pending_note(answer.get("stop_reason")), stop=answer.get("stop_reason"))

    async def _wait(self, status, request):
        self.checkpoint()
        async with self._send:
            await self._flush_locked()
        state, answer = await self.client.request("POST", f"/runs/{self.id}/suspend",
                                                  {"status": status, "request": request})
        if state == 409:
            self._conflict(answer)
        asked = time.monotonic()
        while True:
            self.checkpoint()
            try:
                answer = await asyncio.wait_for(self.answers.get(), 0.1)
            except TimeoutError:
                if time.monotonic() - asked >= self.client.heartbeat_s:  # the slow path, as for cancels
                    asked = time.monotonic()
                    self._take((await self.client.request("GET", f"/runs/{self.id}/inputs"))[1]["inputs"])
                continue
            await self.client.request("POST", f"/runs/{self.id}/inputs/{answer['id']}/ack")
            return answer

    def _take(self, answers):
        """Queue the answers not seen before (the long-poll repeats them until acked)."""
        fresh = [a for a in answers if a["id"] not in self._seen_answers]
        self._seen_answers.update(a["id"] for a in fresh)
        for answer in fresh:
            self.answers.put_nowait(answer)
        return bool(fresh)

    async def _pump(self):
        while not self._stopped.is_set():
            await asyncio.sleep(min(self.client.flush_s, self.client.heartbeat_s))
            try:
                async with self._send:
                    if self.state.due(self.client.flush_s, self.client.max_chars):
                        await self._flush_locked()
                if time.monotonic() - self._last_contact >= self.client.heartbeat_s:
                    await self._heartbeat()
            except (Cancelled, RunwardenError):
                pass  # the signal is set / retried already: the next round tries again

    async def _heartbeat(self):
        _, beat = await self.client.request("POST", f"/runs/{self.id}/heartbeat")
        self._last_contact = time.monotonic()
        if beat.get("cancel_requested"):
            self._stop("server", c.pending_note(beat.get("stop_reason")), stop=beat.get("stop_reason"))
        elif not beat.get("held"):
            self._stop("server", f"the run is no longer ours ({beat.get('status')})", lost=True)

    async def _control(self):
        attempt = 0
        while not self._stopped.is_set() and not self.signal:
            try:
                response = await self.client.http.get(f"/runs/{self.id}/control", params={"wait": self.client.poll_s},
                                                      timeout=self.client.poll_s + 15)
            except httpx.TransportError:
                await asyncio.sleep(c.backoff(attempt))  # a cut connection: poll again, backing off
                attempt += 1
                continue
            attempt = 0
            if response.status_code != 200:
                if response.status_code != 204:
                    await asyncio.sleep(c.backoff(5))
                continue
            body = response.json()
            if body.get("cancel"):
                cancel = body["cancel"]
                self._stop(cancel.get("source", ""), cancel.get("note", ""), stop=cancel.get("stop_reason"))
            elif not body.get("held"):
                self._stop("server", f"the run is no longer ours ({body.get('status')})", lost=True)
            if body.get("inputs") and not self._take(body["inputs"]):
                await asyncio.sleep(0.1)  # answers not yet acked: the poll answers at once until they are
