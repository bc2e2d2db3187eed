"""`manage.py budgets …` — per-agent rolling 24 h caps (runs/agent_caps.py).

    budgets list                                   agents with a policy: 24 h spend vs caps
    budgets set AGENT [--tokens N] [--cost X] [--clear-tokens] [--clear-cost]
    budgets clear AGENT                            drop both caps (the loop policy stays)

An agent that has reached a cap keeps its new runs queued and its live runs are asked to
stop (budget_exhausted); setting a cap it has already reached asks them at once. Bad
input is one line on stderr and exit 2, with nothing written.
"""

from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from runs import agent_caps
from runs.management.commands.runs import operator
from runs.models import AgentPolicy

MAX_TOKENS, MAX_COST = 2**63 - 1, Decimal(99999999)


def bad(message):
    return CommandError(message, returncode=2)


def agent_name(text):
    name = (text or "").strip()
    if not name or len(name) > 100:
        raise bad("AGENT must be a non-empty name of at most 100 characters")
    return name


def parse_tokens(text):
    if not text.isdigit() or not 1 <= int(text) <= MAX_TOKENS:
        raise bad(f"--tokens must be a whole number from 1 to {MAX_TOKENS}, not {text!r}")
    return int(text)


def parse_cost(text):
    try:
        value = Decimal(text.lstrip("$"))
    except InvalidOperation:
        raise bad(f"--cost must be a number of dollars, not {text!r}") from None
    if not value.is_finite() or not 0 < value <= MAX_COST:
        raise bad(f"--cost must be more than 0 and at most {MAX_COST}, not {text!r}")
    if value.as_tuple().exponent < -6:
        raise bad(f"--cost has at most 6 decimal places, not {text!r}")
    return value


def shown(value, unit=""):
    if value is None:
        return "-"
    return agent_caps.money(value) if unit == "$" else f"{value:,}"


class Command(BaseCommand):
    help = "Per-agent 24 h token and cost caps: list, set, clear."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="agents with a policy: their 24 h spend against their caps")
        setting = sub.add_parser("set", help="set or clear an agent's caps (creates its policy)")
        setting.add_argument("agent")
        setting.add_argument("--tokens", help="token cap (in + out) per rolling 24 h")
        setting.add_argument("--cost", help="cost cap in dollars per rolling 24 h")
        setting.add_argument("--clear-tokens", action="store_true", dest="clear_tokens")
        setting.add_argument("--clear-cost", action="store_true", dest="clear_cost")
        clear = sub.add_parser("clear", help="drop both caps of an agent (its loop policy stays)")
        clear.add_argument("agent")

    def handle(self, *args, action, **options):
        getattr(self, f"do_{action}")(**options)

    def do_list(self, **_):
        rows = agent_caps.report()
        if not rows:
            self.stdout.write("no agent policies (budgets set AGENT --tokens N / --cost X)")
            return
        self.stdout.write(f"{'agent':<24} {'tokens 24h / cap':>28} {'cost 24h / cap':>26}  loop  state")
        for policy, spend, capped in rows:
            used_tokens = f"{spend.tokens:,} / {shown(policy.token_cap_24h)}"
            used_cost = f"{agent_caps.money(spend.cost)} / {shown(policy.cost_cap_24h, '$')}"
            state = capped.reason if capped else "ok"
            self.stdout.write(f"{policy.agent:<24} {used_tokens:>28} {used_cost:>26}  {policy.loop_policy:<4}  {state}")

    def do_set(self, *, agent, tokens=None, cost=None, clear_tokens=False, clear_cost=False, **_):
        agent = agent_name(agent)
        if tokens is not None and clear_tokens:
            raise bad("--tokens and --clear-tokens contradict each other")
        if cost is not None and clear_cost:
            raise bad("--cost and --clear-cost contradict each other")
        changes = {}
        if tokens is not None:
            changes["token_cap_24h"] = parse_tokens(tokens)
        if cost is not None:
            changes["cost_cap_24h"] = parse_cost(cost)
        if clear_tokens:
            changes["token_cap_24h"] = None
        if clear_cost:
            changes["cost_cap_24h"] = None
        if not changes:
            raise bad("nothing to set: give --tokens, --cost, --clear-tokens or --clear-cost")
        with transaction.atomic():
            policy, _ = AgentPolicy.objects.select_for_update().get_or_create(agent=agent)
            for name, value in changes.items():
                setattr(policy, name, value)
            policy.updated_by = operator()
            policy.save()
        self.stdout.write(f"{agent}: tokens cap {shown(policy.token_cap_24h)}, cost cap "
                          f"{shown(policy.cost_cap_24h, '$')} per 24 h")
        self._stop_if_capped(agent)

    def do_clear(self, *, agent, **_):
        agent = agent_name(agent)
        cleared = AgentPolicy.objects.filter(agent=agent).update(token_cap_24h=None, cost_cap_24h=None,
                                                                 updated_by=operator(), updated_at=timezone.now())
        agent_caps.forget()
        self.stdout.write(f"{agent}: caps cleared" if cleared else f"{agent}: no policy, nothing to clear")

    def _stop_if_capped(self, agent):
        asked = agent_caps.stop_live_runs([agent])
        if asked:
            self.stdout.write(f"{agent}: cap reached; {len(asked)} live run(s) asked to stop")
