"""`manage.py runs …` — the operator's command line for runs.

`runs abort` (alias `runs cancel`, the old spelling) asks a run to stop; `runs retire`
(or `abort --force`) ends it now without its worker. Exit codes follow the outcome's
kind: 0 done or unchanged (requested, settled, already requested; retired), 1 refused
(already ended: its status and reason are printed), 2 an unknown or malformed id.
Audit entries name the operating-system user who ran the command, via `cli`.
"""

import getpass
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runs import queries, transitions
from runs.durations import parse_duration
from runs.models import Run
from runs.transitions import Kind

EXIT_CODES = {Kind.DONE: 0, Kind.UNCHANGED: 0, Kind.REFUSED: 1, Kind.NOT_FOUND: 2}


def operator():
    """Who runs the command, for the audit: the operating-system user."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        return "cli"


def duration(text):
    try:
        return parse_duration(text)
    except ValueError as error:
        raise CommandError(str(error), returncode=2) from None


class Command(BaseCommand):
    help = ("Inspect and stop runs: abort, retire, budget, show, list, stuck, reap; manage agent API keys "
            "(apikey).")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        abort = sub.add_parser("abort", aliases=["cancel"], help="ask a run to stop (`cancel`: the old spelling)")
        abort.add_argument("run_id")
        abort.add_argument("--force", action="store_true", help="the same as `runs retire`")
        abort.add_argument("--note", default="", help="why, for the timeline")
        retire = sub.add_parser("retire", help="end a run now, without its worker (a worker that is gone)")
        retire.add_argument("run_id")
        retire.add_argument("--note", default="", help="why, for the timeline")
        budget = sub.add_parser("budget", help="raise or lower a run's limits mid-run ('none' clears one)")
        budget.add_argument("run_id")
        budget.add_argument("--tokens", help="token budget (in + out), or none")
        budget.add_argument("--cost", help="cost budget in dollars, or none")
        budget.add_argument("--tool-calls", dest="tool_calls", help="tool-call budget, or none")
        budget.add_argument("--deadline", help="from now (30m, 2h) or an ISO 8601 time with offset, or none")
        show = sub.add_parser("show", help="one run with its timeline")
        show.add_argument("run_id")
        listing = sub.add_parser("list", help="newest runs first")
        listing.add_argument("--status", choices=Run.Status.values)
        listing.add_argument("--limit", type=int, default=50)
        stuck = sub.add_parser(
            "stuck", help="live runs with a stale heartbeat; exit 1 when there are any (for cron and alerts), 0 when none"
        )
        stuck.add_argument("--older-than", default="30s", dest="older_than")
        reap = sub.add_parser("reap", help="settle stale runs as failed / worker_lost")
        reap.add_argument("--older-than", default="60s", dest="older_than")
        apikey = sub.add_parser("apikey", help="agent API keys: create (shown once), revoke, list")
        keys = apikey.add_subparsers(dest="key_action", required=True)
        create = keys.add_parser("create", help="mint a key and print it once")
        create.add_argument("name")
        create.add_argument("--scope", choices=["agent", "operator"], default="agent")
        create.add_argument("--agents", default="",
                            help="agent names an agent key may create and claim, comma-separated (required for agent "
                                 "keys); '*' is any name but the built-in engine's (scripted, openai)")
        agents = keys.add_parser("agents", help="replace the agent names an active key may create and claim")
        agents.add_argument("name")
        agents.add_argument("agents", help="comma-separated; '*' is any name but the built-in engine's")
        revoke = keys.add_parser("revoke", help="revoke the active key of that name")
        revoke.add_argument("name")
        keys.add_parser("list", help="keys, newest first (never the keys themselves)")

    def handle(self, *args, action, **options):
        action = {"cancel": "abort"}.get(action, action)
        getattr(self, f"do_{action}")(**options)

    def _get(self, run_id):
        parsed = transitions.parse_id(run_id)
        run = Run.objects.filter(pk=parsed).first() if parsed else None
        if run is None:
            raise CommandError(f"no run with id {run_id!r}", returncode=2)
        return run

    def do_abort(self, run_id, force, note, **_):
        if force:
            return self.do_retire(run_id, note)
        self._answer(run_id, transitions.request_cancel(run_id, by=operator(), source=Run.CancelSource.CLI, note=note))

    def do_retire(self, run_id, note, **_):
        self._answer(run_id, transitions.retire(run_id, by=operator(), source=Run.CancelSource.CLI, note=note))

    def _answer(self, run_id, outcome):
        code = EXIT_CODES[outcome.kind]
        if code == 2:
            raise CommandError(f"no run with id {run_id!r}", returncode=2)
        if code:
            run = self._get(run_id)  # not to learn what happened (the outcome says), to show what stands
            raise CommandError(f"{outcome.label} ({run.status} / {run.reason_label})", returncode=code)
        self.stdout.write(outcome.label)

    def do_budget(self, run_id, tokens=None, cost=None, tool_calls=None, deadline=None, **_):
        from runs import budget_edits

        given = {"token_budget": tokens, "cost_budget": cost, "tool_call_budget": tool_calls, "deadline": deadline}
        limits = {name: _limit(name, text) for name, text in given.items() if text is not None}
        if not limits:
            raise CommandError("nothing to change: give --tokens, --cost, --tool-calls or --deadline", returncode=2)
        try:
            outcome = budget_edits.set_budgets(run_id, by=operator(), source=Run.CancelSource.CLI, **limits)
        except ValueError as error:
            raise CommandError(str(error), returncode=2) from None
        self._answer(run_id, outcome)

    def do_show(self, run_id, **_):
        run = self._get(run_id)
        fields = [
            ("id", run.id), ("agent", run.agent), ("title", run.title), ("status", run.status),
            ("reason", run.reason_label or "-"), ("truncated", run.truncated),
            ("worker", run.worker or ("- (released while it waits)" if run.is_released else "-")),
            ("created", run.created_at), ("started", run.started_at),
            ("finished", run.finished_at), ("heartbeat", run.heartbeat_at),
            ("cancel requested", _cancel_line(run)),
            *([("waits until", run.wait_deadline)] if run.is_released else []),
            ("limits", _limits_line(run)),
            ("totals", f"{run.steps} steps, {run.tool_calls} tool calls, "
                       f"{run.tokens_in}/{run.tokens_out} tokens in/out, cost {run.cost}"),
            ("error", f"{run.error_class}: {run.error_message}" if run.error_class else "-"),
            ("retry of", run.retry_of_id or "-"),
        ]
        for label, value in fields:
            self.stdout.write(f"{label:>17}  {value if value is not None else '-'}")
        self.stdout.write("timeline:")
        for event in run.events.order_by("seq"):
            who = f" by {event.actor}" if event.actor else ""
            via = f" via {event.source}" if event.source else ""
            self.stdout.write(f"  #{event.seq:<4} {event.at:%Y-%m-%d %H:%M:%S} {event.kind}{who}{via} {event.data}")

    def do_list(self, status, limit, **_):
        runs = Run.objects.order_by("-created_at", "-id")
        if status:
            runs = runs.filter(status=status)
        for run in runs[: max(limit, 1)]:
            self.stdout.write(_row(run))

    def do_stuck(self, older_than, **_):
        found = 0
        for run in queries.stuck(duration(older_than)):
            age = timezone.now() - run.heartbeat_at if run.heartbeat_at else None
            self.stdout.write(f"{_row(run)}  heartbeat {_age(age)} ago")
            found += 1
        if found:  # a cron job alerts on the exit code alone
            raise CommandError(f"{found} stuck run(s)", returncode=1)

    def do_reap(self, older_than, **_):
        reaped = transitions.reap_stale(older_than=duration(older_than))
        self.stdout.write(f"reaped {len(reaped)} run(s)")
        for run_id in reaped:
            self.stdout.write(f"  {run_id}")

    def do_apikey(self, key_action, **options):
        from runs.api import auth
        from runs.models import ApiKey

        if key_action == "create":
            try:
                record, key = auth.create_key(options["name"], options["scope"], agents=options["agents"])
            except ValueError as error:
                raise CommandError(str(error), returncode=1) from None
            self.stderr.write(f"{record.scope} key {record.name!r} (acts as {record.worker}); shown once, store it now:")
            self.stdout.write(key)
        elif key_action == "agents":
            try:
                changed = auth.set_agents(options["name"], options["agents"])
            except ValueError as error:
                raise CommandError(str(error), returncode=1) from None
            if not changed:
                raise CommandError(f"no active key named {options['name']!r}", returncode=1)
            self.stdout.write(f"key {options['name']!r} may run: {', '.join(auth.clean_agents(options['agents']))}")
        elif key_action == "revoke":
            if not auth.revoke_key(options["name"]):
                raise CommandError(f"no active key named {options['name']!r}", returncode=1)
            self.stdout.write(f"key {options['name']!r} revoked")
        else:
            for record in ApiKey.objects.order_by("-created_at"):
                state = f"revoked {record.revoked_at:%Y-%m-%d %H:%M}" if record.revoked_at else "active"
                used = f"{record.last_used_at:%Y-%m-%d %H:%M}" if record.last_used_at else "never"
                runs = "any agent" if record.is_operator else ",".join(record.agents or ()) or "no agent"
                self.stdout.write(
                    f"{record.name:<24} {record.scope:<9} {record.prefix}…  {state:<24} used {used:<16} runs {runs}"
                )


def _limit(name, text):
    """A limit as typed: 'none' clears it; numbers are checked by set_budgets; a
    deadline is a duration from now or an ISO time."""
    text = text.strip()
    if text.lower() == "none":
        return None
    if name == "deadline":
        try:
            return timezone.now() + parse_duration(text)
        except ValueError:
            return text  # an ISO time, or set_budgets says what is wrong with it
    if name == "cost_budget":
        return text.lstrip("$")
    if not text.isdigit():
        option = {"token_budget": "--tokens", "tool_call_budget": "--tool-calls"}[name]
        raise CommandError(f"{option} must be a whole number or none, not {text!r}", returncode=2)
    return int(text)


def _row(run):
    cancelling = " aborting…" if run.is_cancelling else ""
    return f"{run.id}  {run.status:<20} {run.reason_label or '-':<17} {run.agent:<12} {run.title}{cancelling}"


def _limits_line(run):
    parts = [f"{run.token_budget} tokens" if run.token_budget else "", f"${run.cost_budget}" if run.cost_budget else "",
             f"{run.tool_call_budget} tool calls" if run.tool_call_budget else "",
             f"deadline {run.deadline}" if run.deadline else ""]
    return ", ".join(p for p in parts if p) or "none"


def _cancel_line(run):
    if not run.cancel_requested_at:
        return "-"
    note = f" ({run.cancel_note})" if run.cancel_note else ""
    return f"{run.cancel_requested_at} by {run.cancel_requested_by or '?'} via {run.cancel_source}{note}"


def _age(delta):
    if delta is None:
        return "never"
    return f"{int(delta / timedelta(seconds=1))}s"
