"""Per-run budgets, enforced by the server on what it sees: committed steps, discarded
spend and charged replies, for engine runs and API agents alike.

    limit        spent                      budget
    tokens       tokens_in + tokens_out     token_budget
    cost         cost                       cost_budget
    tool_calls   tool_calls                 tool_call_budget
    wall_clock   (the database clock)       deadline      (runs.watchdog.stop_past_deadline)

A run whose totals reach a budget is asked to stop (`transitions.request_stop`,
budget_exhausted): it ends completed/budget_exhausted, truncated. The check reads the
totals the committing UPDATE returned, so a commit under budget costs no query.
"""

from runs import agent_caps
from runs.models import Run

# What `enforce` reads of the run (and the agent caps and loop detection after it): all a
# committing UPDATE needs to return.
FIELDS = ("agent", "status", "cancel_requested_at", "tokens_in", "tokens_out", "cost", "tool_calls",
          "token_budget", "cost_budget", "tool_call_budget")

LIMITS = (
    # (limit, budget field, words)
    ("tokens", "token_budget", "token"),
    ("cost", "cost_budget", "cost"),
    ("tool_calls", "tool_call_budget", "tool-call"),
)


def spent(run, limit):
    if limit == "tokens":
        return run.tokens_in + run.tokens_out
    return getattr(run, limit)


def crossed(run):
    """The first per-run limit `run`'s totals have reached, as (limit, spent, budget), or None."""
    for limit, field, _ in LIMITS:
        budget = getattr(run, field)
        if budget is not None and spent(run, limit) >= budget:
            return limit, spent(run, limit), budget
    return None


def note(limit, used, budget):
    words = dict((name, words) for name, _, words in LIMITS)[limit]
    return f"{words} budget {budget} reached ({used} spent)"


def enforce(run):
    """Ask `run` (as its last UPDATE returned it) to stop when a budget is reached, or
    its agent's 24 h cap (`runs.agent_caps.enforce`), and nothing is pending yet.
    Returns the StopOutcome, or None when within budget."""
    from runs import transitions  # runs.transitions imports this module

    if run is None or run.status in Run.TERMINAL or run.cancel_requested_at is not None:
        return None
    found = crossed(run)
    if found is None:
        return agent_caps.enforce(run)  # the agent's rolling 24 h caps, from this process's memo
    limit, used, budget = found
    return transitions.request_stop(
        run.id, reason=Run.TerminationReason.BUDGET_EXHAUSTED, limit=limit, note=note(limit, used, budget),
        evidence={"spent": str(used), "budget": str(budget)},
    )
