"""Loop and no-progress detection: a run that repeats itself, keeps failing, or goes nowhere.

    flag            a run that …                                               limit (settings / AgentPolicy)
    repeated_tool   called the same tool with the same arguments N times in a RUNWARDEN_LOOP_REPEAT / repeat_limit
                    row: its committed steps' tool calls in order, arguments
                    compared as canonical JSON; a step without tool calls adds
                    nothing to the row and does not break it
    failing_tools   had K tool calls in a row fail (a record with "error")    RUNWARDEN_LOOP_FAILURES / failure_limit
    no_progress     is running, heartbeating, not stopping, and nothing new   RUNWARDEN_NO_PROGRESS_S / no_progress_s
                    for T seconds (`rules.stalled`: no step committed or
                    discarded, no claim or resume, no streamed text of an API
                    run's step in flight)

The two step rules run when a step commits (`after_commit`, called at the end of
`transitions.commit_step`, after its transaction); no_progress is a watchdog finding
(`flag_stalled`). Each flag is written once per run and kind, as a FLAGGED event on the
timeline (data: flag, evidence, policy). Under the agent's `stop` policy the run is then
asked to stop (`transitions.request_stop`, policy_denied, limit "loop"): it ends
failed/policy_denied with the reason on the timeline. Detection never fails a commit: an
error in it is logged and the step stands.
"""

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs import events, rules
from runs.models import AgentPolicy, Run, RunEvent, Step
from runs.transitions.outcomes import Kind, Outcome

log = logging.getLogger(__name__)

REPEATED_TOOL, FAILING_TOOLS, NO_PROGRESS = "repeated_tool", "failing_tools", "no_progress"
FLAGS = (REPEATED_TOOL, FAILING_TOOLS, NO_PROGRESS)
LABELS = {REPEATED_TOOL: "repeated tool", FAILING_TOOLS: "failing tools", NO_PROGRESS: "no progress"}
ACTOR = "runwarden"  # who flags, on the timeline
POLICY_TTL_S = 5.0  # an AgentPolicy change reaches every process this much later at most


class FlagOutcome(Outcome):
    """flag: whether the run's timeline got the flag."""

    FLAGGED = "flagged", Kind.DONE, "Flagged."
    ALREADY_FLAGGED = "already_flagged", Kind.UNCHANGED, "Already flagged so: nothing written."
    NOT_LIVE = "not_live", Kind.REFUSED, "The run has ended (or does not exist): nothing written."


@dataclass(frozen=True)
class Limits:
    repeat: int
    failures: int
    no_progress_s: float
    policy: str  # AgentPolicy.LoopPolicy: "flag" or "stop"


# --- the agent's limits, memoised per process -----------------------------------------

_lock = threading.Lock()
_policies = {}  # agent -> (expires at, monotonic; the AgentPolicy row's values or None)
_agents = OrderedDict()  # run id -> agent (a run never changes agent); bounded
AGENTS_KEPT = 4096


def limits(agent):
    """The agent's loop limits: its AgentPolicy where set, else the settings' defaults.
    The row is read at most once per POLICY_TTL_S per process; settings at each call."""
    now = time.monotonic()
    cached = _policies.get(agent)
    if cached is None or cached[0] < now:
        row = (AgentPolicy.objects.filter(agent=agent)
               .values("loop_policy", "repeat_limit", "failure_limit", "no_progress_s").first())
        cached = (now + POLICY_TTL_S, row)
        with _lock:
            _policies[agent] = cached
    row = cached[1] or {}
    return Limits(
        repeat=row.get("repeat_limit") or settings.RUNWARDEN_LOOP_REPEAT,
        failures=row.get("failure_limit") or settings.RUNWARDEN_LOOP_FAILURES,
        no_progress_s=row.get("no_progress_s") or settings.RUNWARDEN_NO_PROGRESS_S,
        policy=row.get("loop_policy") or AgentPolicy.LoopPolicy.FLAG,
    )


def forget():
    """Drop the memoised policies (tests; a process that must see a change at once)."""
    with _lock:
        _policies.clear()
        _agents.clear()
        _tails.clear()


def _agent_of(run_id):
    agent = _agents.get(run_id)
    if agent is None:
        agent = Run.objects.filter(pk=run_id).values_list("agent", flat=True).first()
        if agent is None:
            return None
        _remember_agent(run_id, agent)
    return agent


def _remember_agent(run_id, agent):
    with _lock:
        _agents[run_id] = agent
        while len(_agents) > AGENTS_KEPT:
            _agents.popitem(last=False)


# --- the step rules -----------------------------------------------------------------------

def same_call_key(call):
    """What makes two calls "the same": the tool's name and its canonical arguments."""
    return call.get("name"), json.dumps(call.get("args") or {}, sort_keys=True, default=str)


def failed(call):
    return "error" in call and call.get("error") is not None


def after_commit(run_id, step, *, agent=None):
    """Check the step rules for `step`, just committed to `run_id` (a Step, or None when
    the commit lost: nothing to do). Runs once the surrounding transaction (if any, as
    the API's idempotent commit) has committed. Never raises. `agent`: the run's, when
    the caller has it (the commit's UPDATE returned it), so it is not read again."""
    if step is None:
        return
    if agent:
        _remember_agent(run_id, agent)
    if not step.tool_calls:  # the sequence of tool calls did not change: nothing new can be flagged
        transaction.on_commit(lambda: _passed(run_id, step.index))
        return
    transaction.on_commit(lambda: _check_step(run_id, step))


def _check_step(run_id, step):
    try:
        check_step(run_id, step.index, step.tool_calls, step=step)
    except Exception:  # noqa: BLE001 - detection must never break a committed step
        log.exception("loop detection failed after step %s of run %s", step.index, run_id)


def check_step(run_id, index, tool_calls, *, step=None):
    """The step rules for the calls of step `index`, reading earlier steps only as far
    back as a row still runs and is short of its limit. Returns the flags written. When
    the agent's policy stops the run, `step` (the committed Step, when checked before
    commit_step returns) gets the StopOutcome as its `stopping`, unless a budget's stop
    is there already, so the committing engine stops at once rather than on the message."""
    stops = []
    agent = _agent_of(run_id)
    if agent is None:
        return []
    lim = limits(agent)
    keep = max(lim.repeat, lim.failures)
    history = _Backwards(run_id, index, tool_calls, batch=keep - 1, known=_known_tail(run_id, index))
    last = same_call_key(tool_calls[-1])
    written = {}
    repeated = history.streak(lambda call: same_call_key(call) == last, lim.repeat)
    if len(repeated) >= lim.repeat:
        call = repeated[-1][1]
        evidence = {"tool": call.get("name"), "args": call.get("args") or {}, "times": len(repeated),
                    "steps": _steps(repeated)}
        written[REPEATED_TOOL] = flag(run_id, REPEATED_TOOL, evidence, lim.policy, stops=stops)
    failing = history.streak(failed, lim.failures)
    if len(failing) >= lim.failures:
        evidence = {"times": len(failing), "steps": _steps(failing), "tools": [c.get("name") for _, c in failing],
                    "last_error": str(failing[-1][1].get("error"))[:300]}
        written[FAILING_TOOLS] = flag(run_id, FAILING_TOOLS, evidence, lim.policy, stops=stops)
    _remember_tail(run_id, index, history.remembered(keep))
    if stops and step is not None and getattr(step, "stopping", None) is None:
        step.stopping = stops[0]
    return [name for name, outcome in written.items() if outcome is FlagOutcome.FLAGGED]


class _Backwards:
    """The run's tool calls from the newest back, as (step index, call): this step's
    first, then what this process remembers of the run (`_tails`), else earlier steps
    read from the database a batch at a time, on demand, once."""

    def __init__(self, run_id, index, tool_calls, *, batch, known=None):
        self.run_id, self.index, self.batch = run_id, index, max(1, batch)
        self.current = [(index, call) for call in reversed(tool_calls)]
        self.calls, self.before, self.done, self.partial = list(self.current), index, False, False
        if known is not None:
            tail, complete = known
            self.calls += tail
            self.done, self.partial = complete, not complete

    def get(self, i):
        if i >= len(self.calls) and self.partial:
            # Wanted more than the remembered tail (a limit was raised): read it all back.
            self.calls, self.before, self.partial = list(self.current), self.index, False
        while i >= len(self.calls) and not self.done:
            rows = list(Step.objects.filter(run_id=self.run_id, index__lt=self.before)
                        .order_by("-index").values_list("index", "tool_calls")[: self.batch])
            self.done = len(rows) < self.batch
            for step_index, step_calls in rows:
                self.calls += [(step_index, call) for call in reversed(step_calls or [])]
            if rows:
                self.before = rows[-1][0]
        return self.calls[i] if i < len(self.calls) else None

    def streak(self, test, limit):
        """The newest calls in a row that pass `test`, up to `limit` of them, oldest first."""
        row = []
        while len(row) < limit:
            item = self.get(len(row))
            if item is None or not test(item[1]):
                break
            row.append(item)
        return row[::-1]

    def remembered(self, keep):
        """(the newest `keep` calls, whether they are all the run has) for `_tails`, from
        what was read anyway; None when that is not enough to be sure."""
        if len(self.calls) >= keep:
            return self.calls[:keep], False
        if self.done and not self.partial:
            return list(self.calls), True
        return None


# What this process knows of a run's latest tool calls: run id -> (the index of the last
# step it committed and checked, (newest calls, complete)). Only the run's holder commits,
# in order, and a Step never changes, so when this process committed step i and now
# commits step i+1, nothing came between and the tail it kept is the truth: the common
# case reads nothing. Any other index (another worker had the run) reads the database.
_tails = OrderedDict()
TAILS_KEPT = 4096


def _known_tail(run_id, index):
    if index == 0:
        return [], True  # the first step: no earlier call to read back
    with _lock:
        entry = _tails.get(run_id)
    return entry[1] if entry is not None and entry[0] == index - 1 else None


def _remember_tail(run_id, index, tail):
    with _lock:
        if tail is None:
            _tails.pop(run_id, None)
            return
        _tails[run_id] = (index, tail)
        _tails.move_to_end(run_id)
        while len(_tails) > TAILS_KEPT:
            _tails.popitem(last=False)


def _passed(run_id, index):
    """A step without tool calls was committed at `index`: the kept tail still holds."""
    with _lock:
        entry = _tails.get(run_id)
    if entry is not None and entry[0] == index - 1:
        _remember_tail(run_id, index, entry[1])


def _steps(row):
    return sorted({index for index, _ in row})


# --- flagging ---------------------------------------------------------------------------

def flag(run_id, kind, evidence, policy=AgentPolicy.LoopPolicy.FLAG, *, stops=None):
    """Write the FLAGGED event `kind` for a live run, once per run and kind, then, under
    the `stop` policy, ask the run to stop (the StopOutcome is appended to `stops`, if
    given). Returns a FlagOutcome: ALREADY_FLAGGED (this kind is on its timeline already,
    whoever wrote it) or NOT_LIVE write nothing."""
    already = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.FLAGGED, data__flag=kind)
    if already.exists():  # the cheap answer for a loop that goes on after its flag
        return FlagOutcome.ALREADY_FLAGGED
    with transaction.atomic():
        # The run's row lock orders two flaggers of one run (a commit's check and a
        # watchdog, two watchdogs): the second waits here for the first's commit and
        # then sees its event. events.append and every transition take the same lock;
        # on SQLite the IMMEDIATE transaction serialises writers instead.
        if not Run.objects.select_for_update().filter(pk=run_id, status__in=Run.NON_TERMINAL).exists():
            return FlagOutcome.NOT_LIVE
        if already.exists():
            return FlagOutcome.ALREADY_FLAGGED
        events.append(run_id, RunEvent.Kind.FLAGGED, actor=ACTOR, source=Run.CancelSource.GUARDRAIL,
                      flag=kind, evidence=evidence, policy=str(policy))
    log.info("run %s flagged %s: %s (policy %s)", run_id, kind, describe(kind, evidence), policy)
    if policy == AgentPolicy.LoopPolicy.STOP:
        outcome = _stop(run_id, kind, evidence)
        if stops is not None:
            stops.append(outcome)
    return FlagOutcome.FLAGGED


def _stop(run_id, kind, evidence):
    from runs import transitions

    note = f"{kind}: {describe(kind, evidence)}"[: rules.NOTE_LIMIT]
    outcome = transitions.request_stop(
        run_id, reason=Run.TerminationReason.POLICY_DENIED, limit="loop", note=note, evidence={"flag": kind, **evidence},
    )
    log.info("run %s asked to stop (loop policy): %s", run_id, outcome)
    return outcome


def flag_stalled(*, limit=500):
    """The watchdog's no_progress finding: flag each run `rules.stalled` for its agent's
    T (per AgentPolicy, else RUNWARDEN_NO_PROGRESS_S), on the database clock, once.
    Returns the ids flagged."""
    overrides = {}
    for agent, seconds in AgentPolicy.objects.exclude(no_progress_s=None).values_list("agent", "no_progress_s"):
        overrides.setdefault(seconds, []).append(agent)
    groups = [(settings.RUNWARDEN_NO_PROGRESS_S, Run.objects.exclude(agent__in=[a for g in overrides.values() for a in g]))]
    groups += [(seconds, Run.objects.filter(agent__in=agents)) for seconds, agents in overrides.items()]
    flagged = []
    now = timezone.now()
    for seconds, runs in groups:
        found = rules.with_last_progress(runs.filter(rules.stalled(seconds))).filter(rules.no_progress_for(seconds))
        for run_id, agent, since in found.values_list("pk", "agent", "last_progress")[:limit]:
            evidence = {"idle_s": round((now - since).total_seconds()) if since else None, "limit_s": seconds,
                        "since": since.isoformat() if since else None}
            if flag(run_id, NO_PROGRESS, evidence, limits(agent).policy) is FlagOutcome.FLAGGED:
                flagged.append(run_id)
    return flagged


# --- in words ------------------------------------------------------------------------------

def describe(kind, evidence):
    """A flag's evidence as an operator reads it, e.g. "called search(q='x') 3 times in a
    row (steps 4–6)". Steps are counted from 1, as the run page shows them."""
    evidence = evidence or {}
    steps = _step_words(evidence.get("steps") or [])
    if kind == REPEATED_TOOL:
        args = evidence.get("args") or {}
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(args.items())) if isinstance(args, dict) else repr(args)
        if len(shown) > 80:
            shown = shown[:79] + "…"
        return f"called {evidence.get('tool')}({shown}) {evidence.get('times')} times in a row{steps}"
    if kind == FAILING_TOOLS:
        error = evidence.get("last_error") or ""
        last = f"; last: {error[:120]}" if error else ""
        return f"{evidence.get('times')} tool calls failed in a row{steps}{last}"
    if kind == NO_PROGRESS:
        idle, limit_s = evidence.get("idle_s"), evidence.get("limit_s")
        return (f"no new step for {_seconds(idle)} while heartbeating (limit {_seconds(limit_s)})"
                if idle is not None else f"no new step while heartbeating (limit {_seconds(limit_s)})")
    return str(kind)


def _step_words(indexes):
    shown = [i + 1 for i in indexes if isinstance(i, int)]
    if not shown:
        return ""
    if len(shown) == 1:
        return f" (step {shown[0]})"
    if shown == list(range(shown[0], shown[-1] + 1)):
        return f" (steps {shown[0]}–{shown[-1]})"
    return " (steps " + ", ".join(map(str, shown)) + ")"


def _seconds(value):
    if value is None:
        return "?"
    value = float(value)
    if value >= 120:
        return f"{value / 60:.0f} min"
    return f"{value:g}s"
