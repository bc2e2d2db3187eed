"""The blocking client: `Client` and its `Run`, with two background threads per run.

- the *pump* sends the batched events every `flush_s` (sooner when `max_chars` wait)
  and heartbeats when nothing else has reached the server for `heartbeat_s`;
- the *control* thread long-polls `GET /runs/{id}/control`, the fast path of a cancel.

A cancel heard on any path (the long-poll, a heartbeat's or an events batch's answer,
a 409 from steps) sets the run's one-shot signal; the agent's thread meets it at its
next checkpoint (`stream`, `call_tool`, `step`, `checkpoint`) as `Cancelled` — or, when
a guardrail asked the stop (a budget crossed, a loop policy), as `Stopped`, a Cancelled
that carries the stop's `reason` (every one of those answers says it: `stop_reason`).
"""

import queue
import threading
import time
import uuid

import httpx

from runwarden_client import _common as c
from runwarden_client._common import Cancelled, RunwardenError


class Client:
    """One API key on one server. `run(...)` creates and claims a run; `claim(...)` takes
    a queued one. Network errors and 502/503/504 are retried for `retry_for_s` seconds
    (with the same `Idempotency-Key` where the call takes one)."""

    def __init__(self, url, key, *, timeout=30.0, retry_for_s=30.0, flush_s=c.DEFAULT_FLUSH_S,
                 max_chars=c.DEFAULT_MAX_CHARS, heartbeat_s=c.DEFAULT_HEARTBEAT_S, poll_s=30.0, **httpx_options):
        self.http = httpx.Client(base_url=url.rstrip("/") + "/api/v1", timeout=timeout,
                                 headers={"Authorization": f"Bearer {key}"}, **httpx_options)
        self.retry_for_s, self.poll_s = retry_for_s, poll_s
        self.flush_s, self.max_chars, self.heartbeat_s = flush_s, max_chars, heartbeat_s

    def request(self, method, path, body=None, *, idempotency_key=None, params=None, timeout=None, expect=(200, 201)):
        """(status, JSON body or None). An answer outside `expect` and 204/409 raises RunwardenError."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        deadline, attempt = time.monotonic() + self.retry_for_s, 0
        while True:
            try:
                response = self.http.request(method, path, json=body, params=params, headers=headers,
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
            time.sleep(c.backoff(attempt))
            attempt += 1

    def run(self, agent, title="", input=None, **limits):
        """Create a run of `agent` and claim it: a `Run` to use as a context manager."""
        body = {"agent": agent, "title": title, "input": input or {}, "claim": True, **limits}
        _, data = self.request("POST", "/runs", body, idempotency_key=f"create-{uuid.uuid4()}")
        return Run(self, data)

    def claim(self, agents):
        """The oldest queued run of one of `agents`, claimed, or None."""
        status, data = self.request("POST", "/runs/claim", {"agents": list(agents)},
                                    idempotency_key=f"claim-{uuid.uuid4()}")
        return None if status == 204 else Run(self, data)

    def close(self):
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Run:
    """A run this key holds. Use it as a context manager: on return it settles
    completed (committing text streamed since the last step); on `Cancelled` it reports
    the step in flight as discarded and settles cancelled (the exception ends there); on
    `Stopped` (a guardrail's stop) it discards the same way and settles as the stop says,
    completed/budget_exhausted truncated or failed/policy_denied (it ends there too);
    on any other exception it discards, settles failed with a safe message and re-raises."""

    def __init__(self, client, data):
        self.client, self.data, self.id, self.input = client, data, data["id"], data.get("input") or {}
        self.signal = c.Signal()
        self.state = c.StepState(index=(data.get("totals") or {}).get("steps", 0))
        self.settled = None  # the settle's answer, once sent
        self.answers = queue.Queue()
        self._seen_answers = set()
        self._wake = threading.Event()  # the pump: send now
        self._wake_waits = threading.Event()  # a tool finished or a stop came: look again
        self._stopped = threading.Event()  # a stop or the end of the run: every wait returns
        self._send = threading.Lock()  # batches go out one at a time, in order
        self._last_contact = time.monotonic()
        self._threads = []

    # --- the agent's verbs ------------------------------------------------------------

    def checkpoint(self):
        """Raise `Cancelled` if a cancel (or the loss of the run) has been heard; `Stopped`
        (a Cancelled) for a guardrail's stop."""
        if self.signal:
            self.signal.delivered = True
            raise self.signal.reason

    def stream(self, text):
        """A fragment of the step in flight, shown live (batched: sent within `flush_s`)."""
        self.checkpoint()
        with self._send:
            self.state.delta(text)
        if self.state.pending_chars >= self.client.max_chars:
            self._wake.set()

    def usage(self, tokens_in=0, tokens_out=0, cost=0, *, estimated=False):
        """Add the spend of the step in flight (a model reply's usage; `estimated`: your guess)."""
        self.state.add_usage(tokens_in, tokens_out, cost, estimated)

    def call_tool(self, name, fn, /, **args):
        """Run `fn(**args)` as tool call `name` of the step in flight, shown live. A cancel
        while it runs raises `Cancelled` at once: the call is abandoned (its thread is left
        to finish on its own, so tools must be safe to abandon) and never committed."""
        self.checkpoint()
        call_id = c.new_call_id()
        with self._send:
            self.state.tool_event(call_id, name, "started", args=args)
        self._wake.set()
        outcome, done = {}, threading.Event()

        def work():
            try:
                outcome["result"] = fn(**args)
            except Exception as error:  # reported as the call's error, the step goes on
                outcome["error"] = f"{type(error).__name__}: {error}"[:2000]
            finally:
                done.set()
                self._wake_waits.set()

        self._wake_waits.clear()
        threading.Thread(target=work, name=f"tool-{name}", daemon=True).start()
        while not done.is_set():
            self.checkpoint()
            self._wake_waits.wait(0.05)
        self.checkpoint()
        record = {"id": call_id, "name": name, "args": args, **outcome}
        with self._send:
            self.state.tool_calls.append(record)
            self.state.tool_event(call_id, name, "failed" if "error" in outcome else "finished", **outcome)
        if "error" in outcome:
            return None
        return outcome["result"]

    def step(self, text=None, *, kind=None, tokens_in=0, tokens_out=0, cost=0):
        """Commit the step in flight whole (its streamed text unless `text` is given, and
        its tool calls); the next stream starts step index + 1. Returns the index."""
        self.checkpoint()
        with self._send:
            self._flush_locked()
            body = self.state.step_body(kind, text, tokens_in, tokens_out, cost)
            status, answer = self.client.request("POST", f"/runs/{self.id}/steps", body,
                                                 idempotency_key=f"{self.id}-step-{body['index']}")
            if status == 409:
                self._conflict(answer)
            self.state.reset(body["index"] + 1)
        self._last_contact = time.monotonic()
        return body["index"]

    def wait_for_approval(self, tool, args=None, *, call_id=None, message=""):
        """Ask an operator to approve tool call `tool`; True when approved, False when denied
        (a denied call must not run: the server refuses a step that holds it)."""
        request = {"kind": "approval", "tool": tool, "args": args, "call_id": call_id or c.new_call_id(),
                   "message": message}
        return bool(self._wait("waiting_for_approval", request).get("approved"))

    def wait_for_input(self, prompt):
        """Ask an operator a question; returns the text of their answer."""
        return self._wait("waiting_for_input", {"kind": "input", "prompt": prompt}).get("text", "")

    def settle(self, status, reason, **fields):
        """Settle the run (once); returns the server's answer ({"settled", "status", "reason"})."""
        if self.settled is None:
            _, self.settled = self.client.request("POST", f"/runs/{self.id}/settle",
                                                  {"status": status, "reason": reason, **fields},
                                                  idempotency_key=f"{self.id}-settle")
        return self.settled

    # --- context manager --------------------------------------------------------------

    def __enter__(self):
        for target in (self._pump, self._control):
            thread = threading.Thread(target=target, name=f"runwarden-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc is None and self.signal.delivered:  # the body caught Cancelled: it still stopped
                exc = self.signal.reason
            if exc is None:
                self._finish_completed()
            elif isinstance(exc, Cancelled):  # a Stopped too: it settles as the stop says
                self._discard("cancelled")
                self._settle_stopped(exc)
                return True
            else:
                reason, error_class, message = c.failure_of(exc)
                self._discard("failed")
                self.settle("failed", reason, error_class=error_class, error_message=message)
        finally:
            self._stopped.set()
            self._wake.set()
            self._threads[0].join(5)  # the pump: no heartbeat after the Client closes
        return False

    def _finish_completed(self):
        try:
            if self.state.text or self.state.tool_calls:
                self.step()
            self.settle("completed", "completed")
        except Cancelled as late:  # the cancel beat the last step: it is discarded, as any other
            self._discard("cancelled")
            self._settle_stopped(late)

    def _settle_stopped(self, cancel):
        """Settle after `cancel`: cancelled, or a `Stopped`'s own ending (completed/
        budget_exhausted truncated, failed/policy_denied)."""
        status, reason, fields = c.ending_of(cancel)
        self.settle(status, reason, **fields)

    # --- plumbing ---------------------------------------------------------------------

    def _stop(self, source="", note="", **how):
        if self.signal.set(source, note, **how):
            self._wake_waits.set()

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

    def _discard(self, reason):
        with self._send:
            self.state.pending = []  # viewers get the interrupted text on the timeline instead
            if not self.state.in_flight():
                return
            body = self.state.discard_body(reason)
        try:
            self.client.request("POST", f"/runs/{self.id}/discard", body,
                                idempotency_key=f"{self.id}-discard-{body['index']}")
        except RunwardenError:
            pass  # the settle still says how it ended; the trace is best effort

    def _flush_locked(self):
        while self.state.pending:
            status, answer = self.client.request("POST", f"/runs/{self.id}/events", {"events": self.state.take_events()})
            self._last_contact = time.monotonic()
            if status == 409:
                self._conflict(answer)
            if answer and answer.get("cancel_requested"):
                self._stop("server", c.pending_note(answer.get("stop_reason")), stop=answer.get("stop_reason"))

    def _wait(self, status, request):
        self.checkpoint()
        with self._send:
            self._flush_locked()
        state, answer = self.client.request("POST", f"/runs/{self.id}/suspend", {"status": status, "request": request})
        if state == 409:
            self._conflict(answer)
        asked = time.monotonic()
        while True:
            self.checkpoint()
            try:
                answer = self.answers.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() - asked >= self.client.heartbeat_s:  # the slow path, as for cancels
                    asked = time.monotonic()
                    self._take(self.client.request("GET", f"/runs/{self.id}/inputs")[1]["inputs"])
                continue
            self.client.request("POST", f"/runs/{self.id}/inputs/{answer['id']}/ack")
            return answer

    def _take(self, answers):
        """Queue the answers not seen before (the long-poll repeats them until acked)."""
        with self._send:
            fresh = [a for a in answers if a["id"] not in self._seen_answers]
            self._seen_answers.update(a["id"] for a in fresh)
        for answer in fresh:
            self.answers.put(answer)
        return bool(fresh)

    def _pump(self):
        while not self._stopped.is_set():
            self._wake.wait(min(self.client.flush_s, self.client.heartbeat_s))
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                with self._send:
                    if self.state.due(self.client.flush_s, self.client.max_chars) or self._wake.is_set():
                        self._flush_locked()
                if time.monotonic() - self._last_contact >= self.client.heartbeat_s:
                    self._heartbeat()
            except Cancelled as late:
                pass  # the signal is set; the agent's thread meets it at its checkpoint
            except RunwardenError:
                pass  # retried for retry_for_s already; the next round tries again
            except RuntimeError:  # the Client was closed under us: nothing left to send
                return

    def _heartbeat(self):
        _, beat = self.client.request("POST", f"/runs/{self.id}/heartbeat")
        self._last_contact = time.monotonic()
        if beat.get("cancel_requested"):
            self._stop("server", c.pending_note(beat.get("stop_reason")), stop=beat.get("stop_reason"))
        elif not beat.get("held"):
            self._stop("server", f"the run is no longer ours ({beat.get('status')})", lost=True)

    def _control(self):
        attempt = 0
        while not self._stopped.is_set() and not self.signal:
            try:
                response = self.client.http.get(f"/runs/{self.id}/control", params={"wait": self.client.poll_s},
                                                timeout=self.client.poll_s + 15)
            except (httpx.TransportError, RuntimeError):  # RuntimeError: the Client was closed under us
                if self._stopped.is_set():
                    return
                self._stopped.wait(c.backoff(attempt))  # a cut connection: poll again, backing off
                attempt += 1
                continue
            attempt = 0
            if response.status_code != 200:
                if response.status_code != 204:
                    self._stopped.wait(c.backoff(5))
                continue
            body = response.json()
            if body.get("cancel"):
                cancel = body["cancel"]
                self._stop(cancel.get("source", ""), cancel.get("note", ""), stop=cancel.get("stop_reason"))
            elif not body.get("held"):
                self._stop("server", f"the run is no longer ours ({body.get('status')})", lost=True)
            if body.get("inputs") and not self._take(body["inputs"]):
                self._stopped.wait(0.1)  # answers not yet acked: the poll answers at once until they are
