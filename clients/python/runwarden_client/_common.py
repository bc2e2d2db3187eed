"""What the sync and the async client share: errors, the step in flight, retry timing.

No I/O here: `sync.py` and `aio.py` move these over httpx, each in its own way.
"""

import time
import uuid

RETRY_STATUSES = {502, 503, 504}  # a proxy or a database outage: retry with the same key
DEFAULT_FLUSH_S = 0.1  # deltas reach viewers at most this late (the server shows 10 frames/s)
DEFAULT_MAX_CHARS = 8000  # ... or as soon as this much text is waiting
DEFAULT_HEARTBEAT_S = 1.0
MAX_EVENTS = 500  # the server's per-request limit


class RunwardenError(Exception):
    """An answer the client cannot act on: `status`, `code` and `message` from the server's
    `{"error": {...}}` body (`status` 0: the server could not be reached in time)."""

    def __init__(self, status, code, message, body=None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.body = status, code, message, body or {}

    @classmethod
    def from_response(cls, status, body):
        error = (body or {}).get("error") or {}
        return cls(status, error.get("code", "error"), error.get("message", ""), body)


class Cancelled(Exception):
    """The run must stop now: an operator (or the watchdog, `hard`) cancelled it, or this
    key no longer holds it (`lost`). Raised at a checkpoint; the run's context manager
    discards the step in flight and settles cancelled."""

    def __init__(self, source="", note="", *, hard=False, lost=False):
        super().__init__(note or source or "cancelled")
        self.source, self.note, self.hard, self.lost = source, note, hard, lost


class Stopped(Cancelled):
    """A guardrail asked the run to stop: a budget it crossed (`reason` "budget_exhausted")
    or its agent's loop policy ("policy_denied"). A kind of `Cancelled`, so code that
    catches Cancelled stops for it too, at the same checkpoints. The run's context manager
    discards the step in flight and settles as `ending()` says: completed/budget_exhausted,
    truncated (the money ran out, not an error), or failed/policy_denied — not cancelled."""

    def __init__(self, reason, source="", note="", *, hard=False):
        super().__init__(source, note or f"stopped: {reason}", hard=hard)
        self.reason = reason

    def ending(self):
        """(status, reason, extra settle fields) for this stop; an unknown reason (a newer
        server's) settles cancelled, which the server records as the stop's own ending."""
        return STOP_ENDINGS.get(self.reason, ("cancelled", "cancelled", {}))


STOP_ENDINGS = {
    "budget_exhausted": ("completed", "budget_exhausted", {"truncated": True}),
    "policy_denied": ("failed", "policy_denied", {}),
}


def ending_of(cancel):
    """How a run settles after `cancel` (a Cancelled or a Stopped): (status, reason, fields)."""
    return cancel.ending() if isinstance(cancel, Stopped) else ("cancelled", "cancelled", {})


def pending_note(stop):
    """The note of a cancel heard without one (a heartbeat's, a batch's or a 409's answer)."""
    return f"a guardrail's stop is pending ({stop})" if stop else "a cancel is pending"


class Failed(Exception):
    """Raise it to end the run failed with a chosen `reason` (default `provider_failed`,
    retryable) and a `message` that is safe to show operators."""

    def __init__(self, message, reason="provider_failed"):
        super().__init__(message)
        self.reason, self.message = reason, message


def failure_of(exc):
    """(reason, error_class, safe message) for an exception that ended a run.

    Any other exception's text stays out of the run: it may hold a prompt, a path or a
    secret, and operators read run rows. Its class name is enough to find the log line."""
    if isinstance(exc, Failed):
        return exc.reason, "Failed", exc.message[:2000]
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return "worker_shutdown", type(exc).__name__, "the agent process was stopped"
    return "provider_failed", type(exc).__name__, f"the agent raised {type(exc).__name__}"


class Signal:
    """The one-shot stop of a run: set once, by whichever channel hears first. `stop`: the
    reason of a guardrail's stop (the signal is then a `Stopped`)."""

    def __init__(self):
        self.reason = None
        self.delivered = False  # raised to the agent at a checkpoint

    def set(self, source="", note="", *, hard=False, lost=False, stop=None):
        current = self.reason
        if current is not None:
            stop = stop or getattr(current, "reason", None)  # the hard stop of an escalated stop is still that stop
            hard, lost = hard or current.hard, lost or current.lost
            # Changed only to harden it, or to name the stop before the agent met a bare cancel.
            news = (hard and not current.hard) or (stop and not isinstance(current, Stopped) and not current.lost
                                                   and not self.delivered)
            if not news:
                return False
        if stop and not lost:
            self.reason = Stopped(stop, source, note, hard=hard)
        else:
            self.reason = Cancelled(source, note, hard=hard, lost=lost)
        return True

    def __bool__(self):
        return self.reason is not None


class StepState:
    """The step in flight: what streamed of it, the tool calls it made, the events not
    yet sent. `take_events` hands over the batch; contiguous deltas are merged, since
    the server relays a batch's contiguous text as one message anyway."""

    def __init__(self, index=0):
        self.index = index
        self.reset(index)
        self.pending = []
        self.pending_chars = 0
        self.last_sent = time.monotonic()

    def reset(self, index):
        self.index, self.text, self.tool_calls, self.started_tools = index, "", [], []
        self.tokens_in = self.tokens_out = 0
        self.cost, self.estimated = 0.0, False

    def delta(self, text):
        if not text:
            return
        last = self.pending[-1] if self.pending else None
        offset = len(self.text)  # code points, as the server counts them
        if last and last["type"] == "delta" and last["step"] == self.index and last["offset"] + len(last["text"]) == offset:
            last["text"] += text
        else:
            self.pending.append({"type": "delta", "step": self.index, "offset": offset, "text": text})
        self.text += text
        self.pending_chars += len(text)

    def tool_event(self, call_id, name, state, **extra):
        if state == "started":
            self.started_tools.append(name)
        self.pending.append({"type": "tool", "step": self.index, "id": call_id, "name": name, "state": state, **extra})

    def add_usage(self, tokens_in=0, tokens_out=0, cost=0, estimated=False):
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost
        self.estimated = self.estimated or estimated

    def due(self, flush_s, max_chars):
        return bool(self.pending) and (
            self.pending_chars >= max_chars or len(self.pending) >= MAX_EVENTS
            or time.monotonic() - self.last_sent >= flush_s)

    def take_events(self):
        batch, self.pending = self.pending[:MAX_EVENTS], self.pending[MAX_EVENTS:]
        self.pending_chars = sum(len(e.get("text", "")) for e in self.pending)
        self.last_sent = time.monotonic()
        return batch

    def in_flight(self):
        return bool(self.text or self.started_tools or self.tokens_in or self.tokens_out or self.cost)

    def step_body(self, kind=None, text=None, tokens_in=0, tokens_out=0, cost=0):
        tool_calls = list(self.tool_calls)
        return {
            "index": self.index,
            "kind": kind or ("tool_calls" if tool_calls else "message"),
            "text": self.text if text is None else text,
            "tool_calls": tool_calls,
            "tokens_in": self.tokens_in + tokens_in,
            "tokens_out": self.tokens_out + tokens_out,
            "cost": round(self.cost + cost, 6),
        }

    def discard_body(self, reason):
        finished = {call["name"] for call in self.tool_calls}
        abandoned = [name for name in self.started_tools if name not in finished] or list(self.started_tools)
        return {"index": self.index, "text": self.text, "tool_calls": abandoned, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "cost": round(self.cost, 6), "estimated": self.estimated,
                "reason": reason}


def json_of(response):
    """The JSON body of an httpx response, None when empty; a non-JSON body (a proxy's
    error page) becomes an error body, judged by its status like any other."""
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"error": {"code": "not_json", "message": response.text[:200]}}


def new_call_id():
    return "call_" + uuid.uuid4().hex[:12]


def backoff(attempt):
    """Seconds before retry `attempt` (0, 1, …): 50 ms doubling, at most 2 s."""
    return min(0.05 * 2**attempt, 2.0)
