"""The lifecycle, declared once: every verb, the statuses it starts from, where it
leaves the run, and with which reasons. The guards read their allowed sources from
here (`ALLOWED_FROM`), the transition-table test drives every verb from every status
against it, and the README's lifecycle table is generated from it (a test fails when
the README's copy differs, and prints the table to paste).

A row may name an extra condition (`when`): it is checked inside the same UPDATE.
"""

from dataclasses import dataclass

from runs.models import Run

S, R = Run.Status, Run.TerminationReason
SAME = ()  # the status does not change


@dataclass(frozen=True)
class Edge:
    verb: str
    sources: tuple  # statuses it may start from; () for create_run (no row yet)
    targets: tuple = SAME  # statuses it may leave the run in
    reasons: tuple = ()  # termination reasons it may set
    when: str = ""  # the extra guard, in words


WAITING_RELEASED = "waiting and released by the engine (no worker holds it)"
WAITING_HELD = "waiting and held (an API agent's wait)"

LIFECYCLE = (
    Edge("create_run", (), (S.QUEUED,), when="a new run, with its `created` event"),
    Edge("claim", (S.QUEUED,), (S.RUNNING,), when="answered (resumed) runs first, for claim_next"),
    Edge("heartbeat", Run.LIVE, when="held by the beating worker"),
    Edge("request_cancel", (S.QUEUED, *Run.WAITING), (S.CANCELLED,), (R.CANCELLED,),
         when=f"queued, or {WAITING_RELEASED}: settled at once"),
    Edge("request_cancel", Run.LIVE, when="held, no cancel pending: cancel_requested_at set, the worker signalled"),
    Edge("request_stop", (S.QUEUED, *Run.WAITING), (S.COMPLETED, S.FAILED), (R.BUDGET_EXHAUSTED, R.POLICY_DENIED),
         when=f"a guardrail (budget, loop policy); queued, or {WAITING_RELEASED}: ended at once"),
    Edge("request_stop", Run.LIVE, when="held, no abort or stop pending: cancel_requested_at and stop_reason set, "
         "the worker signalled; honoured, it ends completed/budget_exhausted or failed/policy_denied"),
    Edge("suspend", (S.RUNNING,), Run.WAITING, when="held by the worker, no cancel pending"),
    Edge("resume", Run.WAITING, (S.RUNNING,), when=f"{WAITING_HELD}, for what `expect` names (approval or input)"),
    Edge("resume", Run.WAITING, (S.QUEUED,), when=f"{WAITING_RELEASED}, for what `expect` names"),
    Edge("settle", Run.LIVE, tuple(Run.REASONS), tuple(r for rs in Run.REASONS.values() for r in rs),
         when="held by the settling worker; a failure or cancel while an abort or stop is pending is recorded "
         "as that request's ending"),
    Edge("retire", Run.NON_TERMINAL, (S.CANCELLED, S.COMPLETED, S.FAILED),
         (R.CANCELLED, R.BUDGET_EXHAUSTED, R.POLICY_DENIED),
         when="the worker is gone or ignores an abort; a run asked to stop by a guardrail ends as the stop says"),
    Edge("escalate_cancel", Run.LIVE, when="a cancel pending, not escalated yet: a hard stop asked, once"),
    Edge("reap", (S.RUNNING,), (S.FAILED, S.CANCELLED, S.COMPLETED),
         (R.WORKER_LOST, R.CANCELLED, R.BUDGET_EXHAUSTED, R.POLICY_DENIED),
         when="stale heartbeat (the watchdog); a pending abort's or stop's ending if one was pending"),
    Edge("expire_wait", Run.WAITING, (S.FAILED, S.CANCELLED), (R.APPROVAL_DENIED, R.CANCELLED),
         when=f"{WAITING_RELEASED}, past its wait_deadline (the watchdog)"),
    Edge("queue_input", Run.NON_TERMINAL, when="an operator input (RunInput) for the worker to take"),
    Edge("retry", tuple(s for s in S if s in Run.TERMINAL),
         when="a retryable reason, not retried yet: a new queued run (retry_of); the row itself never changes"),
)


def _sources(verb):
    found = {s for edge in LIFECYCLE if edge.verb == verb for s in edge.sources}
    return tuple(s for s in S if s in found)  # in the lifecycle's order


VERBS = tuple(dict.fromkeys(edge.verb for edge in LIFECYCLE))
ALLOWED_FROM = {verb: _sources(verb) for verb in VERBS if verb != "create_run"}


def _words(values, empty):
    return ", ".join(f"`{v}`" for v in values) or empty


def markdown():
    """The README's lifecycle table."""
    lines = ["| verb | from | to | reasons | when |", "|---|---|---|---|---|"]
    for edge in LIFECYCLE:
        to = _words(edge.targets, "(same)")
        lines.append(
            f"| `{edge.verb}` | {_words(edge.sources, '—')} | {to} | {_words(edge.reasons, '—')} | {edge.when} |"
        )
    return "\n".join(lines) + "\n"

