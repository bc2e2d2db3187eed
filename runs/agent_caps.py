"""Per-agent rolling 24 h caps (AgentPolicy.token_cap_24h / cost_cap_24h).

An agent's 24 h spend is the sum of tokens (in + out) and cost of its runs *created* in
the last 24 hours, on the database clock. Created, not "active": a run's totals are
not time-stamped per step, and the creation time is what the index `run_agent_newest`
(agent, -created_at) serves, so the spend of every capped agent is one indexed
aggregate. A long run started 23 h ago counts all of its spend until it is 24 h old;
its spend then leaves the window at once (the cap is a brake on starting work, and the
watchdog asks live runs of a capped agent to stop, so nothing runs on unbounded).

An agent is *capped* once its spend has reached a cap: `claim_next` skips its queued
runs (they stay queued, with the reason shown), the API answers 429
`agent_budget_exhausted` to create or claim, and its live runs are asked to stop
(`stop_live_runs`, from the watchdog's sweep and from `runs.budgets.enforce`).

A released wait of a capped agent that an operator answers is queued again and stays
queued like a fresh run until the spend falls below the cap (or the cap is raised).

`capped_agents()` is on the claim hot path, so its answer is memoised per process for
RUNWARDEN_AGENT_CAPS_MEMO_S seconds (0 turns the memo off): a worker may start one more
run of an agent that crossed its cap within that window, never more than a memo's
worth. Saving or deleting an AgentPolicy in this process forgets the memo.
"""

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import F, Q, Sum
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from runs.models import AgentPolicy, Run
from runs.rules import stale_before

WINDOW = timedelta(hours=24)
LIMIT_TOKENS, LIMIT_COST = "agent_tokens_24h", "agent_cost_24h"
HAS_CAP = Q(token_cap_24h__isnull=False) | Q(cost_cap_24h__isnull=False)


@dataclass(frozen=True)
class Spend:
    tokens: int = 0
    cost: Decimal = Decimal(0)


@dataclass(frozen=True)
class Capped:
    """Why an agent is held back: the limit crossed (`LIMIT_TOKENS` / `LIMIT_COST`),
    and the sentence an operator reads."""

    limit: str
    reason: str
    evidence: dict = None  # {"agent", "spent", "cap"} for the stop's timeline entry

    def __str__(self):
        return self.reason


def window_start():
    return stale_before(WINDOW)


def spend_24h(agents):
    """{agent: Spend} over the window for each of `agents` (absent: nothing spent).
    One aggregate over the index (agent, -created_at)."""
    rows = (
        Run.objects.filter(agent__in=list(agents), created_at__gte=window_start())
        .order_by()
        .values("agent")
        .annotate(tokens=Sum(F("tokens_in") + F("tokens_out")), spent=Sum("cost"))
    )
    return {row["agent"]: Spend(int(row["tokens"] or 0), Decimal(row["spent"] or 0)) for row in rows}


def verdict(policy, spend):
    """The Capped for a policy's caps against `spend`, or None while under both."""
    if policy.cost_cap_24h is not None and spend.cost >= policy.cost_cap_24h:
        return Capped(LIMIT_COST, f"agent cost cap {money(policy.cost_cap_24h)}/24 h reached",
                      {"agent": policy.agent, "spent": str(spend.cost), "cap": str(policy.cost_cap_24h)})
    if policy.token_cap_24h is not None and spend.tokens >= policy.token_cap_24h:
        return Capped(LIMIT_TOKENS, f"agent token cap {policy.token_cap_24h:,}/24 h reached",
                      {"agent": policy.agent, "spent": spend.tokens, "cap": policy.token_cap_24h})
    return None


def money(value):
    """'$5.00', '$0.0125': at least cents, no trailing zeros past them."""
    value = Decimal(value).normalize()
    return f"${value:.2f}" if value == value.quantize(Decimal("0.01")) else f"${value:f}"


def compute_capped():
    """{agent: Capped} for every agent whose 24 h spend reached a cap, from the database
    now (no memo): two queries, none when no agent has a cap."""
    policies = {p.agent: p for p in AgentPolicy.objects.filter(HAS_CAP)}
    if not policies:
        return {}
    spent = spend_24h(policies)
    capped = {}
    for agent, policy in policies.items():
        found = verdict(policy, spent.get(agent, Spend()))
        if found is not None:
            capped[agent] = found
    return capped


_memo = {"at": None, "capped": {}}
_memo_lock = threading.Lock()


def capped_agents():
    """{agent: Capped} (str() is the reason text), memoised: see the module doc."""
    ttl = settings.RUNWARDEN_AGENT_CAPS_MEMO_S
    now = time.monotonic()
    at = _memo["at"]
    if ttl > 0 and at is not None and now - at < ttl:
        return _memo["capped"]
    capped = compute_capped()
    with _memo_lock:
        _memo.update(at=now, capped=capped)
    return capped


def forget(**_):
    """Drop the memo: the next `capped_agents()` reads the database."""
    with _memo_lock:
        _memo.update(at=None, capped={})


post_save.connect(forget, sender=AgentPolicy, dispatch_uid="agent_caps_forget_save")
post_delete.connect(forget, sender=AgentPolicy, dispatch_uid="agent_caps_forget_delete")


def held_back(run):
    """The reason a queued run of a capped agent stays queued, or "" (any other run)."""
    if run.status != Run.Status.QUEUED:
        return ""
    found = capped_agents().get(run.agent)
    return f"queued: {found.reason}" if found else ""


def retry_after(agent):
    """Seconds until the agent's spend falls below its caps as runs age out of the
    window (an integer, at least 1), or None when it cannot be told (not capped, or
    its live runs alone keep it over). Reads the window's runs oldest first."""
    policy = AgentPolicy.objects.filter(agent=agent).first()
    if policy is None:
        return None
    runs = list(
        Run.objects.filter(agent=agent, created_at__gte=window_start())
        .order_by("created_at")
        .values_list("created_at", "tokens_in", "tokens_out", "cost")
    )
    tokens = sum(t_in + t_out for _, t_in, t_out, _ in runs)
    cost = sum((Decimal(c) for *_, c in runs), Decimal(0))
    if verdict(policy, Spend(tokens, cost)) is None:
        return None
    now = timezone.now()
    for created_at, t_in, t_out, c in runs:
        tokens -= t_in + t_out
        cost -= Decimal(c)
        if verdict(policy, Spend(tokens, cost)) is None:
            return max(1, int((created_at + WINDOW - now).total_seconds()) + 1)
    return None


def report():
    """[(policy, Spend, Capped | None)] for every agent with a policy, by name: what
    `manage.py budgets list` shows."""
    policies = list(AgentPolicy.objects.order_by("agent"))
    spent = spend_24h([p.agent for p in policies]) if policies else {}
    return [(p, spent.get(p.agent, Spend()), verdict(p, spent.get(p.agent, Spend()))) for p in policies]


def enforce(run):
    """From the commit path (`runs.budgets.enforce`): ask `run` to stop when its agent
    is capped. Reads the memo, so it costs a commit no query most of the time; a cap
    crossed within the memo's life is caught at a later commit or the watchdog's next
    sweep. Returns the StopOutcome, or None when the agent is not capped."""
    from runs import transitions

    found = capped_agents().get(run.agent)
    if found is None or run.cancel_requested_at is not None:
        return None
    return transitions.request_stop(run.pk, reason=Run.TerminationReason.BUDGET_EXHAUSTED, limit=found.limit,
                                    note=found.reason, evidence=found.evidence)


def stop_live_runs(agents=None, *, limit=500):
    """Ask every live run of a capped agent (of `agents`, if given) that has no stop or
    abort pending to stop: budget_exhausted, limit agent_tokens_24h / agent_cost_24h.
    Returns the ids asked (or settled). Reads the database, not the memo."""
    from runs import transitions  # the transitions import this module (claim_next)

    capped = compute_capped()
    if agents is not None:
        capped = {a: c for a, c in capped.items() if a in set(agents)}
    if not capped:
        return []
    asked = []
    live = Run.objects.filter(agent__in=list(capped), status__in=Run.LIVE, cancel_requested_at__isnull=True)
    for run_id, agent in live.values_list("pk", "agent")[:limit]:
        found = capped[agent]
        outcome = transitions.request_stop(
            run_id, reason=Run.TerminationReason.BUDGET_EXHAUSTED, limit=found.limit, note=found.reason,
            evidence=found.evidence,
        )
        if outcome in (transitions.StopOutcome.REQUESTED, transitions.StopOutcome.SETTLED):
            asked.append(run_id)
    return asked


__all__ = ["Capped", "Spend", "capped_agents", "compute_capped", "enforce", "forget", "held_back", "retry_after", "report",
           "spend_24h", "stop_live_runs"]
