"""The agent loop: model call (streamed), tool calls, commit the step, repeat.

A cancel is cooperative: the loop consults the run's `CancelSignal` at every place
where work can wait, cancel polled first, and exits there. "Poll" rows mean the next
unit of work never begins; "race" rows mean the work in flight is abandoned at once.

    #   where                                   mechanism            on cancel
    1   turn entry (`Engine._turn`)             poll                 the provider is never touched
    2   a non-streaming model call              race                 the request is abandoned
    3   each stream event poll                  race + deadlines     no further event is read
    4   the provider's rate gate                cancel-aware sleep   the wait is abandoned
    5   the fallback after a stream failure     poll on entry        the rescue is never sent
    6   sequential tools, before each call      poll                 the next call never starts
    7   parallel tools, at each wave top        poll                 later waves never start
    8   each tool call (or wave)                race                 the tool is abandoned
    9   provider retry backoff                  cancel-aware sleep   no retry starts
    10  the worker's dispatch of a claimed run  poll                 settled cancelled, no provider

Each row's test, in tests/runs/agent/test_checkpoints.py:
    1 test_cancel_at_turn_entry_never_touches_the_provider
    2 test_cancel_during_a_non_streaming_call_abandons_the_request
    3 test_cancel_during_the_stream_discards_the_step_keeping_its_text
    4 test_cancel_during_the_rate_gate_sleep_never_opens_the_stream
    5 test_cancel_as_the_stream_fails_never_sends_the_fallback
    6 test_cancel_between_sequential_tool_calls_never_starts_the_next
    7 test_cancel_in_a_parallel_wave_never_starts_the_next_wave
    8 test_cancel_during_a_tool_call_abandons_the_tool
    9 test_cancel_during_retry_backoff_starts_no_retry
    10 test_cancel_before_dispatch_settles_without_building_a_provider

Rows 2-5 and 9 live in `runs.agent.model`, 6-8 in `runs.agent.dispatch`, 10 in
`runs.agent.runner`; approval waits (`runs.agent.approval`) are cancel-aware too.
Besides short database calls, nothing in the loop waits outside these rows. When the
database is away, the step commit and the turn's input take are held until it answers
(`runs.agent.holding`), in cancel-aware sleeps like row 9.

A step (the model message and all its tool results) is committed whole at its boundary
by `transitions.commit_step`; on cancel or failure the in-flight step is discarded: no
Step row, no tool call without its result; its streamed text is kept on the
`step_discarded` event, marked interrupted. Steps committed before stay.

Waiting for an operator never holds the run (`runs.agent.approval`): a gated call
with no answer, or a reply asking for input, parks it (released, the in-flight reply
kept in `pending_request`) and the engine returns PARKED. The worker that claims it
once answered builds its Engine from the same row: the history comes back from the
committed steps (`runs.agent.resume`), the in-flight reply is taken up where it
stopped, without a second model call.
"""

import json
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from runs import transitions
from runs.agent import outcomes, resume
from runs.agent.approval import Approvals, Park
from runs.agent.cancel import Cancelled
from runs.agent.db_pool import DatabaseUnavailable, retry_safe
from runs.agent.dispatch import ToolDispatcher, deny_listed
from runs.agent.holding import hold
from runs.agent.model import ModelCaller
from runs.agent.outcomes import ApprovalDenied, LostRun, PolicyDenied
from runs.agent.providers.base import ModelRequest, ProviderError, Reply, SimulatedDeath
from runs.agent.tools import ToolContext, builtins
from runs.models import Run, RunInput, Step

log = logging.getLogger(__name__)
R = Run.TerminationReason


@dataclass
class Stats:
    """Counters of one worker. A cancel moves none of them."""

    provider_failures: int = 0
    stream_failures: int = 0


class Engine:
    """Runs one claimed run to an `Outcome`; never settles (the runner does)."""

    def __init__(self, run, *, worker_id, signal, provider, db, progress, config, breaker, stats, tools=None,
                 policy=None, fire=None, parking=None):
        self.run_id = run.id
        # How the engine fires its own signal, saying why (the runner notes it).
        self.fire = fire or (lambda via="": signal.cancel())
        self.parking = parking or (lambda: None)  # tells the runner a release is coming (see _park)
        self.worker_id = worker_id
        self.signal = signal
        self.provider = provider
        self.db = db
        self.progress = progress
        # Budgets are the server's (runs.budgets, checked as each step commits: they may be
        # edited mid-run); the iteration cap is the engine's own.
        self.max_iterations = run.max_iterations
        self.index = run.steps  # the next step to commit
        self.usage = {"tokens_in": run.tokens_in, "tokens_out": run.tokens_out, "cost": run.cost}
        self.row = run  # as claimed: its pending_request says how it was resumed
        parked = resume.state_of(run)
        self.taken = parked["taken"]  # operator messages taken: [{"before": index, "content"}]
        self.resumed = resume.load_reply(parked["step"]) if parked["step"] else None
        self.messages = resume.opening(run)  # rebuilt from the steps in `run()` when resuming
        self.wait_s = wait_timeout(run, config)
        self.inflight = None  # the step being built: {"index", "reply"?, "charged"?}
        self.discarded = None  # the step_discarded event's data, once one was dropped
        tools = tools if tools is not None else builtins()
        self.caller = ModelCaller(
            provider, signal=signal, config=config, breaker=breaker, stats=stats,
            on_text=progress.append, on_restart=progress.restart,
        )
        self.approvals = approve = Approvals(
            signal=signal, granted=parked["step"]["approved"] if parked["step"] else (),
        )
        self.dispatcher = ToolDispatcher(
            tools, signal=signal, config=config, progress=progress, approve=approve,
            context=ToolContext(run_id=str(run.id), signal=signal, workspace=config.workspace),
            policy=policy or deny_listed(config.denied_tools),
        )
        self.tool_specs = [tool.spec() for tool in tools.values()]

    async def run(self):
        """The run's Outcome. Raises only SimulatedDeath (the runner abandons the run)."""
        try:
            if self.index or self.resumed is not None:
                await self._restore()
            return await self._loop()
        except Cancelled:
            await self._discard("cancelled")
            return outcomes.CANCELLED
        except LostRun:
            log.info("run %s is no longer held by %s: stopping without settling", self.run_id, self.worker_id)
            return outcomes.LOST
        except SimulatedDeath:
            raise
        except PolicyDenied as error:
            return await self._fail(outcomes.failed(R.POLICY_DENIED, error))
        except ApprovalDenied as error:
            return await self._fail(outcomes.failed(R.APPROVAL_DENIED, error))
        except ProviderError as error:
            return await self._fail(outcomes.failed(R.PROVIDER_FAILED, error))
        except DatabaseUnavailable as error:  # a write that may have landed: not held; the pool logs the outage
            log.info("run %s: database connection lost mid-write; it ends failed (retryable)", self.run_id)
            return await self._fail(outcomes.failed(R.PROVIDER_FAILED, error, "database connection lost mid-write"))
        except Exception as error:  # noqa: BLE001 - a bug must still settle the run, retryably
            log.exception("run %s: unexpected error in the engine", self.run_id)
            return await self._fail(outcomes.failed(R.PROVIDER_FAILED, error, f"internal error: {type(error).__name__}"))

    @property
    def totals(self):
        """Tokens and cost spent, including a discarded step's (the provider charged it)."""
        return dict(self.usage)

    async def _loop(self):
        while True:
            outcome = await self._turn()
            if outcome is not None:
                return outcome

    async def _turn(self):
        self.signal.raise_if_cancelled()  # checkpoint 1: the provider is not touched
        if self.resumed is not None:  # the reply this run parked on: no second model call
            reply, self.resumed = self.resumed, None
            self.inflight = {"index": self.index, "reply": reply, "charged": True}
            self.progress.start(self.index)
            self.progress.append(reply.text)
        else:
            await self._take_messages()
            if self.provider.exhausted(self.index):
                return outcomes.COMPLETED
            if self.max_iterations and self.index >= self.max_iterations:
                return outcomes.MAX_ITERATIONS
            self.signal.raise_if_cancelled()
            self.inflight = {"index": self.index}
            self.progress.start(self.index)
            request = ModelRequest(str(self.run_id), self.index, list(self.messages), self.tool_specs)
            self.inflight["request"] = request
            reply = await self.caller.call(request)
            self.inflight["reply"] = reply
        try:
            records = await self.dispatcher.run(reply) if reply.tool_calls else []
        except Park as park:
            return await self._park(park, step=resume.dump_step(self.index, reply, self.approvals.granted))
        self.signal.raise_if_cancelled()  # cancel polled before the commit, too
        self.progress.flush()
        charged = self.inflight.get("charged", False)
        step = await self._commit(reply, records)
        if step is None:
            await self._refused()
        if getattr(step, "stopping", None) == transitions.StopOutcome.REQUESTED:
            self.fire("budget")  # this commit reached a budget: stop at the next checkpoint, not on the message
        self.inflight = None
        self.progress.committed(self.index)
        self.index += 1
        if not charged:
            self._spend(reply)
        self.messages += resume.turn(reply, records)
        if reply.needs_input and not reply.tool_calls:  # the step asked the operator something
            return await self._park(Park(Run.Status.WAITING_FOR_INPUT, {"kind": "input", "prompt": reply.text}))
        if reply.final and not reply.tool_calls:
            return outcomes.COMPLETED
        return None

    async def _commit(self, reply, records):
        """Commit the finished step. Held through a database outage (cancel-aware): the
        step is whole and paid for, so it is written once the database answers; a
        cancel meanwhile discards it as usual."""
        step = {
            "worker": self.worker_id, "index": self.index, "kind": "tool_calls" if records else "message",
            "text": reply.text, "tool_calls": records,
            "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out, "cost": reply.cost,
            # A resumed step's reply was charged when the run parked: not counted twice.
            "charged": self.inflight.get("charged", False),
        }

        def attempt(first):
            return self.db.call(transitions.commit_step if first else _commit_again, self.run_id, **step)

        committed, _ = await hold(
            attempt, what=f"run {self.run_id}: committing step {self.index}", signal=self.signal, idempotent=True,
        )
        return committed

    async def _take_messages(self):
        def attempt(first):
            return self.db.call(transitions.consume_inputs, self.run_id, kind=RunInput.Kind.MESSAGE)

        # Not idempotent (inputs are taken once): retried only while nothing can have committed.
        items, _ = await hold(attempt, what=f"run {self.run_id}: taking inputs", signal=self.signal)
        for item in items:
            text = (item.payload or {}).get("text") or json.dumps(item.payload)
            self.messages.append({"role": "user", "content": text})
            self.taken.append({"before": self.index, "content": text})  # in no Step row: kept for a resume

    async def _restore(self):
        """A run taken up again: its history from the committed steps, and the answer
        it was resumed with (the approval of the call it parked on)."""
        self.messages = await self.db.call(resume.history, self.row, self.taken)
        if self.resumed is None:
            return
        answers = await self.db.call(transitions.consume_inputs, self.run_id, kind=RunInput.Kind.APPROVAL)
        call_id = (self.row.pending_request or {}).get("call_id")
        if answers and call_id:
            self.approvals.answer = (call_id, answers[-1])

    async def _park(self, park, step=None):
        """Release the run while it waits (see `runs.agent.approval`). The in-flight
        reply, if any, is kept in the row with its spend charged now (it was paid
        for whatever the answer). Returns PARKED, or raises Cancelled / LostRun when
        the suspend is refused."""
        deadline = timezone.now() + timedelta(seconds=self.wait_s)
        request = {**park.request, "deadline": deadline.isoformat(), "resume": {"step": step, "taken": self.taken}}
        reply = (self.inflight or {}).get("reply")
        charge = None
        if step is not None and not self.inflight.get("charged"):
            charge = {"tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out, "cost": reply.cost}
        self.progress.flush()

        def attempt(first):
            return self.db.call(
                transitions.suspend, self.run_id, worker=self.worker_id, status=park.status, request=request,
                release=True, timeout_s=self.wait_s, charge=charge,
            )

        # Before the suspend: a heartbeat answered after its commit says "not held", and
        # must not be taken for a retire (a refused suspend still ends in LostRun below).
        self.parking()
        # Held through an outage, retried only while nothing can have committed.
        parked, _ = await hold(attempt, what=f"run {self.run_id}: releasing it to wait", signal=self.signal)
        if not parked:
            await self._refused()
        self.inflight = None  # kept in the row, not discarded
        log.info("run %s released while %s (until %s)", self.run_id, park.status.replace("_", " "), deadline)
        return outcomes.PARKED

    async def _refused(self):
        """commit_step refused: a cancel is pending (discard), or the run is not ours."""
        beat = await self.db.call(transitions.heartbeat, self.run_id, worker=self.worker_id)
        if beat.cancel_requested or self.signal.is_cancelled():
            self.fire("commit refused")
            raise Cancelled()
        if not beat.held:
            raise LostRun()
        raise RuntimeError(f"step {self.index} refused out of order")

    async def _fail(self, outcome):
        # An error that arrives while a cancel is pending is a cancel: the stop came first.
        if self.signal.is_cancelled():
            await self._discard("cancelled")
            return outcomes.CANCELLED
        await self._discard("failed")
        return outcome

    async def discard(self, why):
        """Drop the step in flight, as a cancel does (see _discard); for a hard stop."""
        await self._discard(why)

    async def _discard(self, why):
        """Drop the in-flight step. Its streamed text is kept for the `step_discarded`
        event, which the runner writes in the settle's transaction (one commit, so the
        cancel lands sooner and the timeline never shows one without the other)."""
        inflight, self.inflight = self.inflight, None
        if inflight is None:
            return
        reply = inflight.get("reply")
        spent = self._spent_on(inflight)
        if not inflight.get("charged"):  # a resumed step's spend was charged when it parked
            self._spend(spent)
        self.discarded = {
            "index": inflight["index"], "text": self.progress.text, "interrupted": True, "reason": why,
            "tool_calls": [c.name for c in reply.tool_calls] if reply else [],
            # Paid for though thrown away: counted in the run's totals, shown apart.
            "tokens_in": spent.tokens_in, "tokens_out": spent.tokens_out, "cost": str(spent.cost),
            "estimated": reply is None,
        }

    def _spent_on(self, inflight):
        """What the discarded step cost: its reply's usage, or, abandoned mid-stream
        (usage comes only with the reply), the provider's estimate for what streamed."""
        if inflight.get("reply") is not None:
            return inflight["reply"]
        if inflight.get("request") is None or not self.progress.text:
            return Reply(text="")  # nothing was generated (or nothing is known of it)
        tokens_in, tokens_out, cost = self.provider.estimate(inflight["request"], self.progress.text)
        return Reply(text="", tokens_in=tokens_in, tokens_out=tokens_out, cost=cost)

    def _spend(self, reply):
        self.usage["tokens_in"] += reply.tokens_in
        self.usage["tokens_out"] += reply.tokens_out
        self.usage["cost"] += reply.cost


@retry_safe  # a read, then the guarded commit
def _commit_again(run_id, *, index, **step):
    # The attempt before may have committed and only its answer been lost: then the
    # step is there, and committing again would be refused as out of order.
    existing = Step.objects.filter(run_id=run_id, index=index).first()
    return existing if existing is not None else transitions.commit_step(run_id, index=index, **step)


def wait_timeout(run, config):
    """Seconds a released wait lasts: the run's `approval_timeout_s` input, else
    RUNWARDEN_APPROVAL_TIMEOUT_S. ValueError for a value that is not a positive number."""
    value = (run.input or {}).get("approval_timeout_s")
    if value is None:
        return float(config.approval_timeout_s)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 10**8:
        raise ValueError("input approval_timeout_s must be a positive number of seconds")
    return float(value)
